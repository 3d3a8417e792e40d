"""Chaos: three processors, random handler failures, a random processor killed with
kill -9 every 1-3 s and replaced, database connections dropped mid-run; every
item must still end with exactly the right pass counter, in gate order. One run
adds an operator who cancels, deletes, resumes and purges partitions meanwhile.

The kill and operator schedules are random by design (the test's input, not waits);
``STATEFEED_CHAOS_SEED`` replays one. ``STATEFEED_SOAK=1`` also runs the long
soak (marked ``soak``), which adds SIGSTOP/SIGCONT pauses.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from processor import ItemInfo, PartitionLeasedError
from tests.acceptance.harness.checks import (
    causality_problems,
    duplicate_calls,
    gate_order_problems,
    item_problems,
    key_problems,
    late_call_problems,
    reduce_causality_problems,
    reduce_item_problems,
    reduce_key_problems,
    reduce_order_problems,
    reduce_result_problems,
    stopped_item_problems,
)
from tests.acceptance.harness.cluster import Cluster
from tests.acceptance.harness.faults import pause_outside_transaction
from tests.acceptance.harness.handler import RecordingHandler
from tests.acceptance.harness.processes import LEASE, Processor
from tests.conftest import require_postgres
from tests.support.engine import wait_until
from watcher.reports import PurgeReport

pytestmark = pytest.mark.postgres

SEED = int(os.environ.get("STATEFEED_CHAOS_SEED", "20261121"))


@dataclass(frozen=True)
class Chaos:
    """The size of a chaos run and how rough it gets."""

    partitions: int
    items: int
    gates: int
    passes: int = 2
    failure_rate: float = 0.1
    call_seconds: tuple[float, float] = (0.1, 0.5)
    kill_every: tuple[float, float] = (1.0, 3.0)
    max_blows: int = 10  # then the run is left to finish, so a slow machine gets no more
    pause_share: float = 0.0  # share of the blows that are SIGSTOP/SIGCONT instead of kill -9
    db_drops: int = 1
    timeout: float = 90.0


def chaos_handler(chaos: Chaos, seed: int, **options: Any) -> RecordingHandler:
    """The recording handler of a chaos run: its failures and call delays drawn from
    ``seed`` (reduce calls too, when ``options`` ask for a reduce gate)."""
    delays = random.Random(seed + 1)
    low, high = chaos.call_seconds
    if "reduce_next_gate" in options:
        options["reduce_delay"] = lambda request: delays.uniform(low, high)
    return RecordingHandler(gates=chaos.gates, passes=chaos.passes,
                            failure_rate=chaos.failure_rate, seed=seed + 2,
                            delay=lambda call: delays.uniform(low, high), **options)


async def run_chaos(tmp_path, chaos: Chaos, seed: int) -> str:
    """Run one chaos scenario and check everything; returns the summary line."""
    require_postgres()
    rng = random.Random(seed)
    handler = chaos_handler(chaos, seed)
    async with Cluster(tmp_path, handler, name="c") as cluster:
        layout = await cluster.create(chaos.partitions, chaos.items)
        blows = await inflict(cluster, chaos, rng, layout)
        items = await cluster.items(layout)
        cluster.assert_no_tracebacks()
        log_tail = cluster.log_tail()

    kills, pauses, drops = blows.kills, blows.pauses, blows.drops
    problems = item_problems(items, handler.calls, gates=chaos.gates, passes=chaos.passes)
    lost = len({problem.split(":")[0] for problem in problems})
    summary = (f"chaos: items={len(items)} kills={kills} "
               f"duplicate_calls={duplicate_calls(handler.calls)} lost={lost}")
    print(f"\n{summary}")
    extra = (f"seed={seed} pauses={pauses} db_drops={drops} calls={len(handler.calls)} "
             f"processes={len(cluster.processors)} seconds={blows.seconds:.1f}")
    assert not problems, "\n".join([extra, *problems[:20], log_tail])
    problems = key_problems(handler.calls) + causality_problems(handler.calls)
    problems += gate_order_problems(handler.calls, layout, passes=chaos.passes)
    problems += handler.violations
    assert not problems, "\n".join([extra, *problems[:20]])
    assert len(items) == chaos.partitions * chaos.items
    assert kills + pauses >= 3, f"too little chaos: {extra}"
    assert drops == chaos.db_drops, extra
    return summary


@dataclass
class Blows:
    """What a chaos run inflicted, and how long it took to settle."""

    kills: int = 0
    pauses: int = 0
    drops: int = 0
    seconds: float = 0.0


async def inflict(cluster: Cluster, chaos: Chaos, rng: random.Random,
                  layout: dict[str, list[str]], *args: str,
                  choose: Callable[[list[Processor]], list[Processor]] | None = None,
                  operator: Callable[[], Awaitable[None]] | None = None) -> Blows:
    """Start three processors (with ``args``), deal blows on the random schedule of
    ``chaos`` until every partition of ``layout`` has settled; returns what was dealt.

    Each blow picks its victim among the running processors (among ``choose`` of
    them when that is not empty), kills it (and starts a replacement) or pauses it
    for a while; every third blow also drops the database sessions, up to
    ``chaos.db_drops`` times. With ``operator``, it runs meanwhile, and the run
    settles once it has returned and every partition is settled, cancelled or gone.

    Raises:
        AssertionError: the partitions did not settle within ``chaos.timeout`` (or
            ``operator`` raised it).
    """
    blows = Blows()
    for _ in range(3):
        await cluster.start(None, *args)
    done = asyncio.Event()

    async def deal() -> None:
        blow = 0
        while not done.is_set() and blow < chaos.max_blows:
            await _unless(done, rng.uniform(*chaos.kill_every))
            if done.is_set():
                return
            blow += 1
            alive = [proc for proc in cluster.processors if proc.running and not proc.paused]
            victim = rng.choice((choose(alive) if choose else None) or alive)
            if rng.random() < chaos.pause_share:
                await pause_outside_transaction(victim, cluster.db)
                blows.pauses += 1
                await _unless(done, rng.uniform(1.0, 4.0))
                victim.resume()
            else:
                victim.kill()
                blows.kills += 1
                await cluster.start(None, *args)
            if blows.drops < chaos.db_drops and blow % 3 == 2:
                await cluster.db.terminate()
                blows.drops += 1

    chaos_task = asyncio.create_task(deal())
    started = time.monotonic()
    try:
        if operator is None:
            await cluster.wait_settled(layout, timeout=chaos.timeout)
        else:
            await operator()
            left = chaos.timeout - (time.monotonic() - started)
            await cluster.wait_settled(layout, timeout=max(left, 1.0), operated=True)
    finally:
        done.set()
        await chaos_task
    blows.seconds = time.monotonic() - started
    return blows


async def _unless(done: asyncio.Event, seconds: float) -> None:
    """Let ``seconds`` pass (the random schedule is the test's input), or less if done."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await done.wait()


@pytest.mark.timeout(180)
async def test_chaos(tmp_path) -> None:
    await run_chaos(tmp_path, Chaos(partitions=20, items=5, gates=3), SEED)


REDUCE_GATE = 1
REDUCE_PAGE_ITEMS = 4
# How long the chaos operator waits for a call in flight before a mid-gate cancel.
MID_GATE_WAIT = 10.0


@pytest.mark.timeout(180)
async def test_chaos_with_reduce_gates(tmp_path) -> None:
    """Chaos over partitions whose gate 1 is a reduce: gate 0 and gate 2 take two
    per-item passes, gate 1 is one reduce call for the small partitions and a fold
    then an apply pass of several pages for the others (``--reduce-page-items``).
    Blows prefer a processor with a reduce in flight. Every partition must
    complete with the reduce counter's exact result over all its items, folded
    once each, and every item with its reduce answer applied exactly once and
    each per-item step exactly once, in gate order.
    """
    require_postgres()
    seed = SEED + 14
    chaos = Chaos(partitions=16, items=0, gates=3, pause_share=0.3)
    rng = random.Random(seed)
    handler = chaos_handler(chaos, seed, reduce_next_gate=REDUCE_GATE + 1)
    # Sizes around the page: one call (up to a page), or two to four pages.
    sizes = [3, 10, 4, 13, 2, 9, 1, 16]
    layout = {f"part{n:03d}": [f"item{m:03d}" for m in range(sizes[n % len(sizes)])]
              for n in range(chaos.partitions)}
    reducers_struck = 0

    def reducers(alive: list[Processor]) -> list[Processor]:
        nonlocal reducers_struck
        chosen = [proc for proc in alive if handler.reduces_in_flight(proc.owner)]
        reducers_struck += bool(chosen)
        return chosen

    async with Cluster(tmp_path, handler, name="cr") as cluster:
        await cluster.create_layout(layout, reduce_gates=[REDUCE_GATE])
        blows = await inflict(cluster, chaos, rng, layout,
                              "--reduce-page-items", str(REDUCE_PAGE_ITEMS), choose=reducers)
        infos = await cluster.partitions()
        items = await cluster.items(layout)
        cluster.assert_no_tracebacks()
        log_tail = cluster.log_tail()

    reduces = handler.reduces
    interrupted = [r for r in reduces if r.outcome in ("abandoned", "cancelled")]
    ok_pages = [(r.partition_id, r.pass_, r.page) for r in reduces if r.ok]
    extra = (f"seed={seed} kills={blows.kills} pauses={blows.pauses} "
             f"db_drops={blows.drops} calls={len(handler.calls)} reduces={len(reduces)} "
             f"reducers_struck={reducers_struck} interrupted_reduces={len(interrupted)} "
             f"processes={len(cluster.processors)} seconds={blows.seconds:.1f}")
    problems = [f"{pid}: {info.status} at gate {info.gate}: {info.last_error}"
                for pid, info in infos.items() if info.status != "complete"]
    problems += reduce_item_problems(items, handler.calls, reduces, gates=chaos.gates,
                                     passes=chaos.passes, reduce_gate=REDUCE_GATE)
    problems += reduce_result_problems({pid: infos[pid].result_json() for pid in layout},
                                       layout, items, reduces, reduce_gate=REDUCE_GATE)
    assert not problems, "\n".join([extra, *problems[:20], log_tail])
    problems = key_problems(handler.calls) + reduce_key_problems(reduces)
    problems += reduce_causality_problems(handler.calls, reduces)
    problems += reduce_order_problems(handler.calls, reduces, layout, passes=chaos.passes,
                                      reduce_gate=REDUCE_GATE)
    problems += handler.violations
    assert not problems, "\n".join([extra, *problems[:20]])
    assert len(items) == sum(len(ids) for ids in layout.values())
    assert {r.pass_ for r in reduces if r.ok} == {"all", "fold", "apply"}
    assert blows.kills + blows.pauses >= 3, f"too little chaos: {extra}"
    assert blows.drops == chaos.db_drops, extra
    print(f"\nchaos with reduce gates: items={len(items)} {extra} "
          f"duplicate_calls={duplicate_calls(handler.calls)} "
          f"duplicate_reduce_pages={len(ok_pages) - len(set(ok_pages))}")


# A purge removes only partitions that completed this long before the operator read
# every complete partition's items: a completion is stamped with its transaction's
# start, so this leaves it the time to commit and be seen by that read. A loaded
# machine once took over 2 s from a completion's start to its commit: three times that.
PURGE_MARGIN = 6.0
# How long after a cancel (or a delete that cancelled) a call for the partition may
# still start: its holder drops it within a poll interval, and holds no lease on it
# past one lease duration whatever happens.
DISPATCH_GRACE = LEASE + 2.0


@dataclass
class Stop:
    """A cancel, or a delete of an open partition (which cancels it): when it was sent
    and when it returned (the handler's clock), the calls the handler had in flight
    for the partition just before, and its items as read right after (a cancel)."""

    began: float
    committed: float
    in_flight: list[int]
    items: list[ItemInfo]


class Operator:
    """An operator at work during a chaos run, on a seeded random schedule (the test's
    input, like the blows).

    It cancels open partitions (mid-gate when it can: with a call in flight),
    deletes two cancelled ones (one long cancelled, without force: no lease is
    left; one just cancelled, with force), deletes an open partition a processor
    holds (refused without force while the lease is live, then forced), resumes
    one cancelled partition with ``retry_failed``, and purges the complete ones
    twice. Before each purge it reads the items of every complete partition, so
    the purged ones can still be checked. What it did is kept for the final
    checks; what went wrong meanwhile is in ``problems``.
    """

    def __init__(self, cluster: Cluster, handler: RecordingHandler,
                 layout: dict[str, list[str]], rng: random.Random, timeout: float) -> None:
        self.cluster = cluster
        self.client = cluster.client
        self.handler = handler
        self.layout = layout
        self.rng = rng
        self.deadline = time.monotonic() + timeout
        self.cancels: dict[str, Stop] = {}
        self.forced: dict[str, Stop] = {}  # open partitions deleted (their holder refused)
        self.refused = 0  # deletes refused for a live lease, then forced
        self.deleted: dict[str, float] = {}  # when each delete returned
        self.resumed: dict[str, float] = {}  # when each retry_failed was sent
        self.recorded: dict[str, list[ItemInfo]] = {}  # complete partitions' final items
        self.purged: set[str] = set()
        self.purges: list[PurgeReport] = []
        self.closed_first = 0  # cancels that found the partition complete already
        self.skipped: list[str] = []
        self.problems: list[str] = []

    @property
    def stopped(self) -> set[str]:
        """Partitions cancelled or deleted (resumed ones included)."""
        return set(self.cancels) | set(self.deleted)

    async def run(self) -> None:
        """Ten actions, each after a random pause.

        Raises:
            AssertionError: no complete partition came due for a purge in time.
        """
        await self._pause()
        long_cancelled = await self.cancel(mid_gate=True)
        await self._pause()
        to_resume = await self.cancel(mid_gate=False)
        await self._pause()
        just_cancelled = await self.cancel(mid_gate=True)
        if just_cancelled is not None:
            # Its holder may not have let go yet: force, as an operator would.
            await self.delete(just_cancelled, force=True)
        await self._pause()
        await self.delete_held()
        await self._pause()
        await self.cancel(mid_gate=True)
        await self._pause()
        if long_cancelled is not None:
            await self.delete(long_cancelled, force=False)
        await self._pause()
        await self.cancel(mid_gate=False)
        await self._pause()
        await self.purge()
        await self._pause()
        if to_resume is not None:
            await self.resume(to_resume)
        await self._pause()
        await self.purge()

    async def _pause(self) -> None:
        await asyncio.sleep(self.rng.uniform(0.3, 1.2))

    def _left(self) -> float:
        return max(1.0, self.deadline - time.monotonic())

    def _in_flight(self, partition_id: str) -> list[int]:
        return [call.seq for call in self.handler.in_flight() if call.partition_id == partition_id]

    async def _choose(self, *, mid_gate: bool = False, held: bool = False) -> str | None:
        """An open partition not stopped yet (preferring one with a call in flight, and
        one whose lease is live, as asked), or None when none is open.

        For ``mid_gate`` it waits, up to a deadline, for a call in flight: between
        kills there may be a moment when no processor is calling.
        """
        if mid_gate:
            with contextlib.suppress(AssertionError):  # none came: take any open one
                await wait_until(self._busy_open, timeout=MID_GATE_WAIT,
                                 message="a call in flight")
        infos = await self.cluster.partitions()
        now = await self.client.store.now()
        candidates = [pid for pid in self.layout if pid in infos and pid not in self.stopped
                      and infos[pid].status == "available"]
        if held:
            candidates = [pid for pid in candidates
                          if infos[pid].owner and infos[pid].until > now] or candidates
        if mid_gate:
            busy = {call.partition_id for call in self.handler.in_flight()}
            candidates = [pid for pid in candidates if pid in busy] or candidates
        return self.rng.choice(candidates) if candidates else None

    def _busy_open(self) -> bool:
        """Whether some partition not stopped yet has a call in flight."""
        return any(call.partition_id in self.layout and call.partition_id not in self.stopped
                   for call in self.handler.in_flight())

    async def cancel(self, *, mid_gate: bool) -> str | None:
        """Cancel an open partition and read its items at once; returns it, or None when
        no partition was left open."""
        while (partition_id := await self._choose(mid_gate=mid_gate)) is not None:
            in_flight = self._in_flight(partition_id)
            began = time.monotonic()
            if await self.client.cancel(partition_id):
                committed = time.monotonic()
                self.cancels[partition_id] = Stop(began, committed, in_flight,
                                                  await self.cluster.items([partition_id]))
                return partition_id
            # It completed first: it stays among the partitions that must be exact.
            self.closed_first += 1
        self.skipped.append("cancel")
        return None

    def _unchanged(self, partition_id: str, items: list[ItemInfo], when: str) -> None:
        stop = self.cancels[partition_id]
        self.problems += [f"{problem} ({when})" for problem in stopped_item_problems(
            stop.items, items, self.handler.calls, stopped_at=stop.committed)]

    async def delete(self, partition_id: str, *, force: bool) -> None:
        """Delete a cancelled partition, after checking nothing was written to it since."""
        self._unchanged(partition_id, await self.cluster.items([partition_id]),
                        "read before its delete")
        try:
            deleted = await self.client.delete_partition(partition_id, force=force)
        except PartitionLeasedError as error:
            self.problems.append(f"{partition_id}: the delete of a cancelled partition was "
                                 f"refused: {error}")
            deleted = await self.client.delete_partition(partition_id, force=True)
        self.deleted[partition_id] = time.monotonic()
        if deleted != len(self.layout[partition_id]):
            self.problems.append(f"{partition_id}: its delete removed {deleted} items, not "
                                 f"{len(self.layout[partition_id])}")

    async def delete_held(self) -> None:
        """Delete an open partition a processor holds (mid-gate when one is): refused
        while its lease is live, unless forced."""
        partition_id = await self._choose(mid_gate=True, held=True)
        if partition_id is None:
            self.skipped.append("delete of a held partition")
            return
        in_flight = self._in_flight(partition_id)
        began = time.monotonic()
        try:
            deleted = await self.client.delete_partition(partition_id)
        except PartitionLeasedError:
            self.refused += 1
            deleted = await self.client.delete_partition(partition_id, force=True)
        committed = time.monotonic()
        self.forced[partition_id] = Stop(began, committed, in_flight, [])
        self.deleted[partition_id] = committed
        if deleted != len(self.layout[partition_id]):
            self.problems.append(f"{partition_id}: its forced delete removed {deleted} items, "
                                 f"not {len(self.layout[partition_id])}")

    async def resume(self, partition_id: str) -> None:
        """Resume a cancelled partition, after checking nothing was written to it since."""
        self._unchanged(partition_id, await self.cluster.items([partition_id]),
                        "read before its resume")
        self.resumed[partition_id] = time.monotonic()
        await self.client.retry_failed(partition_id)

    async def purge(self) -> None:
        """Once a complete partition is due, read every complete partition's items, then
        purge the complete partitions last updated ``PURGE_MARGIN`` before that read.

        Exactly those due must go, and only partitions read as complete.

        Raises:
            AssertionError: no complete partition came due before the deadline.
        """
        margin = timedelta(seconds=PURGE_MARGIN)
        store = self.client.store

        async def due() -> bool:
            now = await store.now()
            return any(info.status == "complete" and info.updated_at is not None
                       and info.updated_at < now - margin
                       for info in (await self.cluster.partitions()).values())

        await wait_until(due, timeout=self._left(), interval=0.2,
                         message="a complete partition due for a purge")
        read_at = await store.now()
        infos = await self.cluster.partitions()
        complete = [pid for pid, info in infos.items() if info.status == "complete"]
        for partition_id in complete:
            if partition_id not in self.recorded:
                self.recorded[partition_id] = await self.cluster.items([partition_id])
        expected = {pid for pid in complete if (stamp := infos[pid].updated_at) is not None
                    and stamp < read_at - margin}
        older_than = (await store.now() - read_at).total_seconds() + PURGE_MARGIN
        report = await self.client.purge(older_than=older_than, statuses=("complete",))
        after = await self.cluster.partitions()
        gone = {pid for pid in self.layout if pid not in after} - set(self.deleted) - self.purged
        self.purges.append(report)
        self.purged |= gone
        name = f"purge {len(self.purges)}"
        if gone - set(complete):
            self.problems.append(f"{name} removed {sorted(gone - set(complete))}, which were "
                                 "not complete when read just before")
        if expected - gone:
            self.problems.append(f"{name} kept {sorted(expected - gone)}, complete since before "
                                 "its cutoff")
        removed = sum(len(self.layout[pid]) for pid in gone)
        if (report.partitions, report.items) != (len(gone), removed):
            self.problems.append(f"{name} reported {report}; {len(gone)} partitions with "
                                 f"{removed} items went")


@pytest.mark.timeout(180)
async def test_chaos_with_operator_actions(tmp_path) -> None:
    """Chaos (kills, a database session drop) while an operator cancels open partitions,
    mostly mid-gate, deletes cancelled ones and one a processor holds, resumes one
    and purges the complete ones twice (see :class:`Operator`).

    Every partition never stopped, or resumed, must end complete and exact (a purged
    one as read just before its purge), in gate order. Deleted and purged partitions
    must be gone with every item. A cancelled partition must be cancelled with its
    items exactly as read right after the cancel and no step written from a call
    answered after it; no call for a stopped partition may start once its holder
    must have dropped it.
    """
    require_postgres()
    seed = SEED + 16
    chaos = Chaos(partitions=20, items=5, gates=3, timeout=60.0)
    rng = random.Random(seed)
    handler = chaos_handler(chaos, seed)
    async with Cluster(tmp_path, handler, name="co") as cluster:
        layout = await cluster.create(chaos.partitions, chaos.items)
        operator = Operator(cluster, handler, layout, random.Random(seed + 3), chaos.timeout)
        blows = await inflict(cluster, chaos, rng, layout, operator=operator.run)
        infos = await cluster.partitions()
        cancelled = [pid for pid in operator.cancels
                     if pid not in operator.resumed and pid not in operator.deleted]
        exact = [pid for pid in layout if pid in operator.resumed or pid not in operator.stopped]
        items = await cluster.items([pid for pid in exact if pid not in operator.purged])
        # A purged partition that was not read first is one of operator.problems.
        items += [item for pid in exact if pid in operator.purged
                  for item in operator.recorded.get(pid, [])]
        final = {pid: await cluster.items([pid]) for pid in cancelled}
        rows = await cluster.item_rows([*operator.deleted, *operator.purged])
        cluster.assert_no_tracebacks()
        log_tail = cluster.log_tail()

    calls = handler.calls
    stops = {**operator.cancels, **operator.forced}
    mid_gate = sum(bool(stop.in_flight) for stop in stops.values())
    fenced = sum(1 for pid, stop in stops.items() for call in calls
                 if call.partition_id == pid and call.ok and call.started < stop.committed
                 and call.finished is not None and call.finished > stop.committed
                 and pid not in operator.resumed)
    extra = (f"seed={seed} kills={blows.kills} db_drops={blows.drops} calls={len(calls)} "
             f"cancels={len(operator.cancels)} mid_gate={mid_gate} "
             f"closed_before_cancel={operator.closed_first} deleted={len(operator.deleted)} "
             f"(held={len(operator.forced)}, refused={operator.refused}) "
             f"resumed={len(operator.resumed)} purged={[r.partitions for r in operator.purges]} "
             f"answers_fenced_off={fenced} skipped={operator.skipped} "
             f"processes={len(cluster.processors)} seconds={blows.seconds:.1f}")
    problems = list(operator.problems)
    for pid in layout:
        gone = pid in operator.deleted or pid in operator.purged
        want = None if gone else "cancelled" if pid in cancelled else "complete"
        got = infos[pid].status if pid in infos else None
        if got != want:
            problems.append(f"{pid}: {got or 'gone'}, not {want or 'gone'}")
    problems += [f"{pid}: {count} items left after its delete or purge"
                 for pid, count in rows.items() if count]
    for pid in cancelled:
        problems += stopped_item_problems(operator.cancels[pid].items, final[pid], calls,
                                          stopped_at=operator.cancels[pid].committed)
    for pid, stop in stops.items():
        problems += late_call_problems(calls, pid, after=stop.committed + DISPATCH_GRACE,
                                       before=operator.resumed.get(pid, float("inf")))
    problems += item_problems(items, calls, gates=chaos.gates, passes=chaos.passes)
    assert not problems, "\n".join([extra, *problems[:20], log_tail])
    problems = key_problems(calls) + causality_problems(calls)
    problems += gate_order_problems(calls, {pid: layout[pid] for pid in exact},
                                    passes=chaos.passes)
    problems += handler.violations
    assert not problems, "\n".join([extra, *problems[:20]])
    assert len(items) == chaos.items * len(exact), extra
    assert len(operator.cancels) >= 3 and mid_gate >= 1, f"too few cancels: {extra}"
    assert len(operator.deleted) >= 2 and len(operator.resumed) == 1, extra
    assert len(operator.purges) == 2 and all(r.partitions for r in operator.purges), extra
    assert blows.kills + blows.pauses >= 3, f"too little chaos: {extra}"
    assert blows.drops == chaos.db_drops, extra
    print(f"\nchaos with operator actions: items={len(items)} {extra} "
          f"duplicate_calls={duplicate_calls(calls)}")


@pytest.mark.soak
@pytest.mark.skipif(not os.environ.get("STATEFEED_SOAK"),
                    reason="soak test: set STATEFEED_SOAK=1 to run it")
@pytest.mark.timeout(1800)
async def test_chaos_soak(tmp_path) -> None:
    rounds = int(os.environ.get("STATEFEED_SOAK_ROUNDS", "3"))
    for round_ in range(rounds):
        path = tmp_path / f"round{round_}"
        path.mkdir()
        await run_chaos(path, Chaos(
            partitions=60, items=8, gates=4, passes=3, failure_rate=0.15,
            call_seconds=(0.05, 0.6), pause_share=0.3, db_drops=3, max_blows=200,
            timeout=600),
            SEED + round_)
