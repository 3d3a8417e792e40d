"""The close a drained gate tries before its summary (watcher.store.sql.closing), on
every database: it completes a partition exactly when the summary would have closed it,
and writes nothing otherwise; a watcher's partitions reach the same ends as before."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from datetime import datetime

import pytest

from processor import AsyncClient, NewItem
from tests.integration.test_gate_passes import FAST, counting, one_close
from tests.integration.test_retry_and_gates import answer, lease
from tests.support.engine import running
from watcher import Result, Watcher, WatcherConfig, WorkItem
from watcher.protocol import NonRetryableError
from watcher.rules.timeline import decode_timeline
from watcher.store import Store

TIMELINE = '{"v":1,"gates":[[0,1000.0,2000.0,3]],"minutes":[]}'


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


async def try_close(store: Store, version: int, *, gate: int = 0,
                    failures_allowed: bool = False, owner: str = "setup") -> int | None:
    return await store.partition_close_when_done(
        "p", version, owner, gate=gate, failures_allowed=failures_allowed, timeline=TIMELINE)


async def current_version(store: Store) -> int:
    state = await store.partition_state("p")
    assert state is not None
    return state.version


async def test_a_partition_with_every_item_complete_closes_and_ends_its_lease(
        client: AsyncClient, store: Store) -> None:
    await client.create_partition("p", [NewItem(f"i{n}", b"") for n in range(3)])
    version = await lease(store, "p")
    await answer(store, "p", {f"i{n}": ("complete", 0) for n in range(3)})
    assert await try_close(store, version) == version + 1
    info = await client.partition("p")
    assert info.status == "complete"
    state = await store.partition_state("p")
    assert state is not None and state.owner == "" and not state.lease_live
    assert await client.partition_timeline("p") == decode_timeline(TIMELINE)


@pytest.mark.parametrize(("left", "gate"), [
    ({"i0": ("available", 0)}, 0),  # an item still at the gate
    ({"i0": ("available", 2)}, 0),  # an item at a later gate
    ({"i0": ("failed", 0)}, 0),  # an item failed at the gate
])
async def test_a_partition_with_work_left_is_not_closed(
        client: AsyncClient, store: Store, left: dict[str, tuple[str, int]], gate: int) -> None:
    await client.create_partition("p", [NewItem(f"i{n}", b"") for n in range(3)])
    version = await lease(store, "p")
    await answer(store, "p", {"i1": ("complete", 0), "i2": ("complete", 0)}
                 | {k: v for k, v in left.items() if v[0] != "available" or v[1] != 0})
    assert await try_close(store, version, gate=gate) is None
    info = await client.partition("p")
    assert info.status == "available"
    assert await current_version(store) == version  # nothing was written


async def test_failed_items_do_not_stop_a_partition_that_goes_on_past_them(
        client: AsyncClient, store: Store) -> None:
    await client.create_partition("p", [NewItem(f"i{n}", b"") for n in range(2)],
                                  on_item_failure="continue")
    version = await lease(store, "p")
    await answer(store, "p", {"i0": ("failed", 0), "i1": ("complete", 0)})
    assert await try_close(store, version) is None
    assert await try_close(store, version, failures_allowed=True) == version + 1


@pytest.mark.parametrize("pause", ["partition", "key", "everything"])
async def test_a_paused_partition_is_not_closed(client: AsyncClient, store: Store,
                                                pause: str) -> None:
    await client.create_partition("p", [NewItem("i0", b"")], key="tenant")
    await lease(store, "p")
    await answer(store, "p", {"i0": ("complete", 0)})
    if pause == "partition":
        assert await client.pause("p")
    elif pause == "key":
        assert await client.pause_key("tenant")
    else:
        assert await client.pause_all()
    assert await try_close(store, await current_version(store)) is None
    info = await client.partition("p")
    assert info.status == "available"


async def test_a_stale_holder_does_not_close(client: AsyncClient, store: Store) -> None:
    await client.create_partition("p", [NewItem("i0", b"")])
    version = await lease(store, "p")
    await answer(store, "p", {"i0": ("complete", 0)})
    assert await try_close(store, version - 1) is None
    assert await try_close(store, version, owner="someone-else") is None
    assert await try_close(store, version) == version + 1


# -- a watcher's partitions ---------------------------------------------------------

async def complete(item: WorkItem) -> Result:
    return Result(done=True)


def watcher_counting(store: Store, counts: Counter[str], handler=complete) -> Watcher:
    counting(store, counts, "gate_summary", "partition_close_when_done", "items_apply_closing")
    return Watcher(store, handler, WatcherConfig(owner_id="w", **FAST))


async def test_a_one_gate_partition_closes_without_a_summary(
        client: AsyncClient, store: Store) -> None:
    counts: Counter[str] = Counter()
    await client.create_partition("p", [NewItem(f"i{n}", b"") for n in range(5)])
    async with running(watcher_counting(store, counts)):
        info = await client.wait("p", timeout=30)
    assert info.status == "complete" and info.counts == {"complete": 5}
    assert counts == one_close(store), counts
    timeline = await client.partition_timeline("p")
    [span] = timeline.gates
    assert (span.gate, span.items) == (0, 5)
    assert span.began is not None and span.ended is not None and span.ended >= span.began
    # The close's time is the database's, carried on from the lease's reads: within
    # a minute of the database's own clock now, never a host's idea of the year.
    now = (await store.gate_summary("p", 0)).now
    assert isinstance(now, datetime) and abs((now - span.ended).total_seconds()) < 60


async def test_items_a_client_put_at_a_later_gate_are_not_skipped(
        client: AsyncClient, store: Store) -> None:
    """The close is tried once, refused (gate 1 holds items), and the summaries move the
    partition on as before: every item runs."""
    counts: Counter[str] = Counter()
    seen: list[tuple[str, int]] = []

    async def record(item: WorkItem) -> Result:
        seen.append((item.id, item.gate))
        return Result(done=True)

    await client.create_partition("p", [NewItem("a", b"", gate=0), NewItem("b", b"", gate=1),
                                        NewItem("c", b"", gate=3)])
    async with running(watcher_counting(store, counts, record)):
        info = await client.wait("p", timeout=30)
    assert info.status == "complete" and info.counts == {"complete": 3}
    assert sorted(seen) == [("a", 0), ("b", 1), ("c", 3)]
    assert counts == {**one_close(store), "gate_summary": 3}, counts


async def test_a_failed_item_still_fails_its_partition(client: AsyncClient,
                                                       store: Store) -> None:
    counts: Counter[str] = Counter()

    async def fail_one(item: WorkItem) -> Result:
        if item.id == "bad":
            raise NonRetryableError("unreadable")
        return Result(done=True)

    await client.create_partition("p", [NewItem("good", b""), NewItem("bad", b"")])
    async with running(watcher_counting(store, counts, fail_one)):
        info = await client.wait("p", timeout=30)
    assert info.status == "failed" and info.counts == {"complete": 1, "failed": 1}
    assert counts == {"gate_summary": 1}, counts  # a failure is not completed in place


async def test_items_added_while_the_last_call_runs_are_not_skipped(
        client: AsyncClient, store: Store) -> None:
    """The only item's answer is the gate's last as far as its holder knows, so its close
    goes with it (PostgreSQL) or is tried at once: a client adds an item during that
    call, the close is refused, and the new item runs before the partition closes."""
    seen: list[str] = []

    async def add_one_while_called(item: WorkItem) -> Result:
        seen.append(item.id)
        if item.id == "first":
            await client.add_items("p", [NewItem("late", b"")])
        return Result(done=True)

    counts: Counter[str] = Counter()
    await client.create_partition("p", [NewItem("first", b"")])
    async with running(watcher_counting(store, counts, add_one_while_called)):
        info = await client.wait("p", timeout=30)
    assert info.status == "complete" and info.counts == {"complete": 2}, info
    assert seen == ["first", "late"]
    # Sent with the first answer and refused; not sent again under the same lease.
    assert counts["items_apply_closing"] == int(store.closes_with_writes), counts
