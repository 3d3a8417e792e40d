"""Reduce gates keep their promises across processes: real ``processor run``
subprocesses on PostgreSQL, and a recording handler whose *reduce counter*
(``harness/handler.py``) makes every fold and every answer visible in what the
database ends up holding.

- A processor killed with ``kill -9`` in the middle of a paged reduce (in the
  fold pass, or in the apply pass) leaves its progress on the partition row;
  the processor that takes over resumes at the page that was in flight, and the
  result and every item's answer are applied exactly once.
- A reducer paused past its lease while its call is answered writes nothing
  when it wakes: the new owner's result and answers are the ones that stay.

The chaos run with reduce gates is ``test_chaos.py::test_chaos_with_reduce_gates``.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from processor import ItemInfo, PartitionInfo
from tests.acceptance.harness.checks import (
    reduce_causality_problems,
    reduce_item_problems,
    reduce_key_problems,
    reduce_order_problems,
    reduce_result_problems,
)
from tests.acceptance.harness.cluster import Cluster
from tests.acceptance.harness.faults import pause_outside_transaction
from tests.acceptance.harness.handler import RecordingHandler, ReduceRequest
from tests.acceptance.harness.processes import LEASE, Processor
from tests.conftest import require_postgres
from tests.support.engine import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

# Gate 0: one per-item pass; gate 1: the reduce, whose answers complete the items.
GATES = 2
PASSES = 1
REDUCE_GATE = 1
PAGE_ITEMS = 5
PAGES = 4
PAGED_ITEMS = PAGE_ITEMS * PAGES
ONE_CALL_ITEMS = PAGE_ITEMS - 1
PARTITION = "reduced"


@pytest.fixture(autouse=True)
def _postgres() -> None:
    require_postgres()


def layout_of(count: int) -> dict[str, list[str]]:
    """One partition of ``count`` items, their ids zero-padded so that id order is the
    same in Python and in any database collation."""
    return {PARTITION: [f"item{n:03d}" for n in range(count)]}


async def start(cluster: Cluster, owner: str | None = None, *, health: bool = False
                ) -> Processor:
    """Start a processor with small reduce pages and wait until its watcher runs."""
    proc = await cluster.start(owner, "--reduce-page-items", str(PAGE_ITEMS), health=health)
    await proc.wait_log("action=watcher_started")
    return proc


def pages(requests: list[ReduceRequest]) -> list[tuple[str, int]]:
    """(pass, page) of each request, in the order they arrived."""
    return [(request.pass_, request.page) for request in requests]


def all_pages(*passes: str) -> list[tuple[str, int]]:
    """Every page of a paged reduce of ``PAGED_ITEMS`` items, for the given passes."""
    return [(pass_, page) for pass_ in passes for page in range(PAGES)]


async def settle_and_check(cluster: Cluster, handler: RecordingHandler,
                           layout: dict[str, list[str]]
                           ) -> tuple[PartitionInfo, dict[str, ItemInfo]]:
    """Wait until the partition completes and check that the reduce was applied exactly
    once; returns the partition and its items by id.

    Raises:
        AssertionError: it did not complete within 30 s, or a guarantee broke (every
            problem is listed, with the processors' logs).
    """
    infos = await cluster.wait_settled(layout, timeout=30)
    info = infos[PARTITION]
    items = await cluster.items(layout)
    problems = reduce_item_problems(items, handler.calls, handler.reduces, gates=GATES,
                                    passes=PASSES, reduce_gate=REDUCE_GATE)
    problems += reduce_result_problems({PARTITION: info.result_json()}, layout, items,
                                       handler.reduces, reduce_gate=REDUCE_GATE)
    problems += reduce_key_problems(handler.reduces)
    problems += reduce_causality_problems(handler.calls, handler.reduces)
    problems += reduce_order_problems(handler.calls, handler.reduces, layout, passes=PASSES,
                                      reduce_gate=REDUCE_GATE)
    problems += handler.violations
    assert not problems, "\n".join(problems[:20]) + "\n" + cluster.log_tail()
    assert info.status == "complete" and info.counts == {"complete": len(layout[PARTITION])}
    assert info.reduce is None and info.last_error is None, info
    cluster.assert_no_tracebacks()
    return info, {item.id: item for item in items}


def answered_by(item: ItemInfo, handler: RecordingHandler) -> ReduceRequest:
    """The reduce request whose answer the item holds (its trail names it)."""
    [entry] = [entry for entry in json.loads(item.data)["trail"] if ":R@" in entry]
    return handler.reduces[int(entry.split("@")[1])]


# --------------------------------------------------------------------------- kill -9


@pytest.mark.parametrize(("pass_", "page"), [("fold", 2), ("apply", 1)])
async def test_kill_9_mid_reduce_resumes_from_the_stored_page(tmp_path, pass_: str,
                                                              page: int) -> None:
    """kill -9 of the processor reducing a paged gate while page ``page`` of the
    ``pass_`` pass is in flight: the other processor takes over when the lease
    expires and sends that page again with the stored accumulator, then the rest;
    no stored page is sent again, and the result and every answer are applied once.
    """
    in_flight = asyncio.Event()  # never set: the killed processor's page stays in flight
    first: list[ReduceRequest] = []

    def hold(request: ReduceRequest) -> asyncio.Event | None:
        # Only the first request for the page is held; the new owner's is answered.
        if (request.pass_, request.page) != (pass_, page):
            return None
        if not first:
            first.append(request)
        return in_flight if request is first[0] else None

    handler = RecordingHandler(gates=GATES, passes=PASSES, reduce_hold=hold)
    async with Cluster(tmp_path, handler, name="rk") as cluster:
        layout = await cluster.create_layout(layout_of(PAGED_ITEMS), reduce_gates=[REDUCE_GATE])
        procs = [await start(cluster), await start(cluster)]
        [held] = await wait_until(
            lambda: [r for r in handler.reduces_in_flight() if (r.pass_, r.page) == (pass_, page)],
            timeout=30, message=f"{pass_} page {page} in flight")
        victim = next(proc for proc in procs if proc.owner == held.caller)
        survivor = next(proc for proc in procs if proc is not victim)
        # What the row says while the page is in flight: the pages already stored.
        progress = (await cluster.partitions())[PARTITION].reduce
        assert progress is not None and (progress.pass_, progress.pages_done) == (pass_, page), (
            progress)
        if pass_ == "apply":
            before_kill = {item.id: item for item in await cluster.items(layout)}
        victim.kill()
        killed_at = time.monotonic()
        await victim.wait(10)
        info, items = await settle_and_check(cluster, handler, layout)
        assert survivor.running

    requests = handler.reduces
    victims = [r for r in requests if r.caller == victim.owner]
    survivors = [r for r in requests if r.caller == survivor.owner]
    done_before = all_pages("fold", "apply")[:all_pages("fold", "apply").index((pass_, page))]
    assert pages(victims) == [*done_before, (pass_, page)]
    assert victims[-1].outcome == "abandoned" and all(r.ok for r in victims[:-1])
    # Resumed at the page that was in flight: nothing stored is sent again.
    assert pages(survivors) == all_pages("fold", "apply")[len(done_before):]
    resumed = survivors[0]
    assert resumed.key == held.key and resumed.item_ids == held.item_ids
    assert resumed.accumulator == held.accumulator and resumed.attempt == 1
    taken = resumed.started - killed_at
    assert taken <= LEASE * 3, f"taken over {taken:.2f} s after the kill"

    result = info.result_json()
    chain_callers = [requests[seq].caller for seq in result["chain"]]
    folded_by_victim = PAGES if pass_ == "apply" else page
    assert chain_callers == ([victim.owner] * folded_by_victim
                             + [survivor.owner] * (PAGES - folded_by_victim))
    applied_by_victim = page if pass_ == "apply" else 0
    for position, item_id in enumerate(layout[PARTITION]):
        source = answered_by(items[item_id], handler)
        expected = victim if position // PAGE_ITEMS < applied_by_victim else survivor
        assert source.caller == expected.owner, (item_id, source)
        if pass_ == "apply" and expected is victim:
            assert items[item_id] == before_kill[item_id], "an applied page was written again"
    print(f"\nkill -9 mid-{pass_} (page {page} of {PAGES}): resumed at that page "
          f"{taken:.2f} s after the kill; {len(survivors)} requests by the new owner, "
          f"result {result['count']} items, total {result['total']}")


# --------------------------------------------------------------------------- SIGSTOP


@pytest.mark.parametrize(("pass_", "page"), [("all", 0), ("fold", 1), ("apply", 2)])
async def test_a_reducer_paused_past_its_lease_writes_nothing(tmp_path, pass_: str,
                                                              page: int) -> None:
    """SIGSTOP the reducing processor while its ``pass_`` page ``page`` is in flight,
    until another processor has taken the partition over and sent that page again
    (held there). Answer the paused processor's call, then SIGCONT it: its write is
    fenced (the items still have the versions it read: only the lease stands in the
    way), it counts the work as stale and notices the loss; the partition and
    items are exactly as before, and in the end hold the new owner's answers.
    """
    paused_calls, new_calls = asyncio.Event(), asyncio.Event()

    def hold(request: ReduceRequest) -> asyncio.Event | None:
        if (request.pass_, request.page) != (pass_, page):
            return None
        return {"paused": paused_calls, "new": new_calls}.get(request.caller)

    handler = RecordingHandler(gates=GATES, passes=PASSES, reduce_hold=hold)
    count = ONE_CALL_ITEMS if pass_ == "all" else PAGED_ITEMS
    async with Cluster(tmp_path, handler, name="rp") as cluster:
        layout = await cluster.create_layout(layout_of(count), reduce_gates=[REDUCE_GATE])
        paused = await start(cluster, "paused", health=True)
        await wait_until(lambda: handler.reduces_in_flight("paused"), timeout=30,
                         message=f"the {pass_} page {page} in flight")
        new = await start(cluster, "new")
        await pause_outside_transaction(paused, cluster.db)
        paused_at = time.monotonic()

        async def taken_over() -> bool:
            return (await cluster.partitions())[PARTITION].owner == new.owner

        await wait_until(taken_over, timeout=LEASE * 3, message="the new owner takes over")
        took = time.monotonic() - paused_at
        await wait_until(lambda: handler.reduces_in_flight("new"), timeout=10,
                         message="the new owner's call for the same page")
        before = await snapshot(cluster, layout)
        # Answered while the paused processor cannot read the answer.
        paused_calls.set()
        await wait_until(lambda: not handler.reduces_in_flight("paused"), timeout=10,
                         message="the answer to the paused processor")
        paused.resume()
        await paused.wait_log("action=lease_lost", timeout=LEASE * 3)
        await wait_until(lambda: cluster.db.no_transaction(paused.owner), timeout=10,
                         message="the paused processor's writes to finish")
        assert await snapshot(cluster, layout) == before, (
            "the fenced-off reducer wrote over the new owner's partition")
        # Its answered call ends as stale (whether the write was refused by the fence,
        # or not tried because it had seen the loss first): the metric says so.
        stale = await wait_until(lambda: stale_reduces(paused, pass_), timeout=10,
                                 message="the paused processor's reduce counted as stale")
        assert await snapshot(cluster, layout) == before, (
            "the fenced-off reducer wrote over the new owner's partition")
        new_calls.set()
        info, items = await settle_and_check(cluster, handler, layout)

    [answered] = [r for r in handler.reduces if r.caller == "paused" and r.ok
                  and (r.pass_, r.page) == (pass_, page)]
    assert all(r.caller == "new" for r in handler.reduces if r.seq > answered.seq)
    retried = next(r for r in handler.reduces if r.caller == "new")
    assert retried.key == answered.key and retried.item_ids == answered.item_ids
    written = {answered_by(item, handler).seq for item in items.values()}
    assert answered.seq not in written, "the paused processor's answers were written"
    assert answered.seq not in info.result_json()["chain"], (
        "the paused processor's fold reached the result")
    print(f"\nfenced reducer ({pass_} page {page}): taken over {took:.2f} s after SIGSTOP; "
          f"its answered call wrote nothing ({stale:.0f} counted stale)")


async def snapshot(cluster: Cluster, layout: dict[str, list[str]]) -> tuple[Any, ...]:
    """What a reducer may write: the partition's gate, status, owner, result and stored
    reduce progress, and every item."""
    info = (await cluster.partitions())[PARTITION]
    items = await cluster.items(layout)
    return info.status, info.gate, info.owner, info.result, info.reduce, items


async def stale_reduces(proc: Processor, pass_: str) -> float:
    """How many ``pass_`` reduce calls ``proc`` counted as stale (0 while none)."""
    wanted = {f'pass="{pass_}"', 'outcome="stale"'}
    return sum(value for name, value in (await proc.metrics()).items()
               if name.startswith("statefeed_reduce_calls_total{")
               and wanted <= set(name[name.index("{") + 1:-1].split(",")))
