"""Operating statefeed on real databases: paged reads, cancel, delete, purge, retention
with two processors, and the backlog counts."""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from processor import AsyncClient, NewItem
from tests.support.engine import count_calls, running, wait_until
from watcher import CountingHooks, Result, Watcher, WatcherConfig, WorkItem
from watcher.errors import (
    InvalidInputError,
    PartitionLeasedError,
    PartitionNotFoundError,
)
from watcher.records import ItemWrite
from watcher.retention import Retention, RetentionConfig
from watcher.rules.reduce import ReduceWrite
from watcher.store import Store
from watcher.store.db.clock import FixedClock

FAST = {"poll_interval": 0.05, "lease_duration": 3.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2}
DAY = 86400.0


def config(owner: str, **overrides: Any) -> WatcherConfig:
    return WatcherConfig(**{"owner_id": owner, **FAST, **overrides})


@pytest.fixture
async def client(db_url, table_prefix):
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


def utc_now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


async def make_finished(store: Store, clock: FixedClock, partition_id: str, status: str, *,
                        at: datetime, items: int = 0) -> None:
    """A partition created and, at ``at`` by the store's fixed clock, left ``status``.

    A partition to cancel is created with its (free) lease time a day ahead of the
    real clock (the running watchers' clock, not ``at``, which may be days ago), so
    that they cannot take and finish it before the cancel.
    """
    clock.set(max(at, utc_now()) + timedelta(days=1) if status == "cancelled" else at)
    await store.partition_create(partition_id, [NewItem(f"i{n:05}", b"x") for n in range(items)])
    clock.set(at)
    if status == "available":
        return
    if status == "cancelled":
        assert await store.partition_cancel(partition_id) == "available"
        return
    [row] = [row for row in await store.leases_read_free(10_000) if row.id == partition_id]
    [won] = await store.leases_take([row], "setup", 30)
    assert await store.partition_transition(partition_id, won.version, "setup",
                                            status=status) is not None


async def snapshot(store: Store) -> dict[str, Any]:
    """Every partition row (as the client sees it) and every item, by id."""
    state: dict[str, Any] = {}
    async for info in _all_partitions(store):
        items = await store.items_list(info.id)
        state[info.id] = (info, [(item.id, item.status, item.gate, item.data, item.version)
                                 for item in items])
    return state


async def _all_partitions(store: Store):
    after = None
    while True:
        page = await store.partitions_page(after=after, limit=500)
        for info in page:
            yield info
        if page.next_cursor is None:
            return
        after = page.next_cursor


# -- reading at any size --------------------------------------------------------

async def test_items_pages_are_stable_while_items_change(client, make_store) -> None:
    """20,000 items read in pages while another writer completes and fails items ahead
    of and behind the cursor: every item is read exactly once, in id order."""
    total = 20_000
    ids = [f"i{n:05}" for n in range(total)]
    await client.create_partition("big", [NewItem(item_id, b"x") for item_id in ids])
    writer_store = make_store()
    [lease] = await writer_store.leases_take(await writer_store.leases_read_free(5), "w", 300)
    assert lease.id == "big"
    rng = random.Random(16)
    unchanged = set(ids)

    async def change_some() -> int:
        # Every item is still at its first version until written, so a write may name any.
        chosen = rng.sample(sorted(unchanged), min(150, len(unchanged)))
        writes = [ItemWrite("big", item_id, 1, "failed" if n % 7 == 0 else "complete", 0, 1,
                            last_error="boom" if n % 7 == 0 else None)
                  for n, item_id in enumerate(chosen)]
        applied = await writer_store.items_apply(writes, "w")
        assert all(applied)
        unchanged.difference_update(chosen)
        return len(chosen)

    seen: list[str] = []
    pages = 0
    after = None
    while True:
        page = await client.items("big", limit=997, after=after, with_data=False)
        pages += 1
        assert len(page) <= 997 and all(item.data == b"" for item in page)
        seen += [item.id for item in page]
        await change_some()
        if page.next_cursor is None:
            break
        after = page.next_cursor
    assert seen == ids, "every item once, in id order"
    assert pages == math.ceil(total / 997) and len(unchanged) < total - 3000
    # The iterator walks the same pages; a filtered one only what it asks for.
    reads = count_calls(client.store, "items_page")
    failed_ids = [item.id async for item in client.iter_items("big", status="failed",
                                                                page_size=100)]
    assert reads["items_page"] == math.ceil(len(failed_ids) / 100)  # no empty last page
    assert failed_ids == sorted(failed_ids) and len(failed_ids) > 300
    assert [item.id async for item in client.iter_items("big", status="available",
                                                          with_data=False)] == sorted(unchanged)
    failed = await client.items("big", status="failed", limit=50)
    assert len(failed) == 50 and {item.status for item in failed} == {"failed"}
    more = await client.items("big", status="failed", limit=50, after=failed.next_cursor)
    assert failed[-1].id < more[0].id and {item.last_error for item in more} == {"boom"}
    assert await client.items("big", gate=5) == []
    page = await client.items("big", limit=3)
    assert [item.id for item in page] == ids[:3] and page.next_cursor == ids[2]
    assert page[0].data == b"x"
    last = await client.items("big", after=ids[-2])
    assert [item.id for item in last] == ids[-1:] and last.next_cursor is None
    for bad, fragment in [({"status": "cancelled"}, "unknown status"),
                          ({"gate": -1}, "gate must be"), ({"limit": 10_001}, "limit must be"),
                          ({"after": ""}, "after must be")]:
        with pytest.raises(InvalidInputError, match=fragment):
            await client.items("big", **bad)


async def test_partitions_page_newest_first_with_stable_cursors(client) -> None:
    for n in range(23):
        await client.create_partition(f"p{n:02}", [NewItem("a", b"")])
    everything = await client.partitions(limit=1000)
    assert len(everything) == 23 and everything.next_cursor is None
    order = [(info.created_at, info.id) for info in everything]
    assert order == sorted(order, reverse=True), "newest first, ties by id"
    walked: list[str] = []
    after = None
    while True:
        page = await client.partitions(limit=5, after=after)
        assert len(page) <= 5
        walked += [info.id for info in page]
        # Partitions change status while the pages are read: the order does not move.
        if len(walked) == 10:
            for info in everything[:12]:
                await client.cancel(info.id)
        if page.next_cursor is None:
            break
        after = page.next_cursor
    assert walked == [info.id for info in everything]
    cancelled = [info.id async for info in client.iter_partitions("cancelled", page_size=4)]
    assert cancelled == [info.id for info in everything[:12]]
    with pytest.raises(InvalidInputError, match="not a cursor"):
        await client.partitions(after="garbage!")
    with pytest.raises(InvalidInputError, match="limit must be"):
        await client.partitions(limit=0)


# -- cancel ---------------------------------------------------------------------

async def test_cancel_mid_gate_stops_the_partition_and_leaves_the_others(
        client, make_store) -> None:
    """Cancelled while its calls are in flight: the holder drops it within a few polls,
    nothing of it is written afterwards, the other partition completes untouched, and
    retry_failed resumes it where it stopped."""
    hold = asyncio.Event()
    calls: list[tuple[float, str, str, int]] = []
    blocked = 0

    async def process(item: WorkItem) -> Result:
        nonlocal blocked
        calls.append((time.monotonic(), item.partition_id, item.id, item.gate))
        if item.partition_id == "doomed" and item.gate == 0 and item.id >= "i05":
            blocked += 1
            await hold.wait()
        if item.gate == 0:
            return Result(gate=1, data=item.data + b"+")
        return Result(done=True)

    await client.create_partition("doomed", [NewItem(f"i{n:02}", b"d") for n in range(20)])
    await client.create_partition("kept", [NewItem(f"k{n:02}", b"k") for n in range(10)])
    hooks = CountingHooks()
    watcher = Watcher(make_store(), process, config("w1", concurrency=32), hooks)
    async with running(watcher):
        await wait_until(lambda: blocked == 15, timeout=20, message="15 doomed calls held")
        await wait_until(lambda: _gate_one_count(client, "doomed", 5), timeout=20,
                         message="the first five doomed items written at gate 1")
        assert await client.cancel("doomed") is True
        cancelled_at = time.monotonic()
        frozen = await snapshot(client.store)
        # The holder learns of the cancel at its next renewal (a third of the lease);
        # a holder that kept it until its lease ran out would miss this deadline.
        await wait_until(lambda: "doomed" not in watcher.partitions,
                         timeout=watcher.config.lease_duration, interval=0.01,
                         message="the holder drops the cancelled partition")
        dropped_in = time.monotonic() - cancelled_at
        hold.set()
        kept = await client.wait("kept", timeout=20)
        await asyncio.sleep(10 * FAST["poll_interval"])
        after = await snapshot(client.store)
        assert after["doomed"] == frozen["doomed"], "nothing of it written after the cancel"
        info = await client.partition("doomed")
        assert info.status == "cancelled" and info.counts == {"available": 20}
        assert not [c for c in calls if c[1] == "doomed" and c[0] > cancelled_at]
        assert kept.status == "complete" and kept.counts == {"complete": 10}
        assert hooks.counts["lease_released"] >= 1
        print(f"cancelled partition dropped by its holder in {dropped_in:.3f} s")
        # Resumed where it stopped: the five items at gate 1 are not run at gate 0 again.
        before_resume = len(calls)
        resumed_report = await client.retry_failed("doomed")
        assert (resumed_report.items_reset, resumed_report.reopened) == (0, True)
        done = await client.wait("doomed", timeout=20)
    assert done.status == "complete" and done.counts == {"complete": 20}
    resumed = [(c[2], c[3]) for c in calls[before_resume:] if c[1] == "doomed"]
    assert sorted(item for item, gate in resumed if gate == 0) == [
        f"i{n:02}" for n in range(5, 20)]


async def _gate_one_count(client: AsyncClient, partition_id: str, count: int) -> bool:
    page = await client.items(partition_id, gate=1, limit=100)
    return len(page) == count


async def test_a_cancelled_partition_fences_every_write_of_its_holder(store) -> None:
    await store.partition_create("p", [NewItem("a", b"1"), NewItem("b", b"2")])
    [lease] = await store.leases_take(await store.leases_read_free(5), "w", 30)
    ready = {item.id: item for item in await store.items_ready("p", 0, 10)}
    assert await store.partition_cancel("p") == "available"
    assert await store.leases_stopped("w", 30) == ["p"]
    assert await store.leases_stopped("other", 30) == []
    write = ItemWrite("p", "a", ready["a"].version, "complete", 0, 1)
    assert await store.items_apply([write], "w") == [False], "a late result is stale"
    step = ReduceWrite("apply", 1, "a", None, b"{}", ())
    state = await store.partition_state("p")
    assert state is not None and state.owner == "w" and not state.lease_live
    assert await store.reduce_write("p", state.version, "w", step) is None
    assert await store.partition_transition("p", state.version, "w", gate=3) is None
    renewal = await store.leases_renew({"p": lease.version}, "w", 30)
    assert renewal.held == {} and renewal.stopped == {"p"}, "stopped, not lost to anyone"
    assert await store.leases_read_free(5) == [], "no processor takes it again"
    assert [item.status for item in await store.items_list("p")] == ["available"] * 2


async def test_cancel_what_is_finished_or_unknown(client, store) -> None:
    await client.create_partition("open", [NewItem("a", b"")])
    await client.create_partition("empty", [])
    assert await client.cancel("open") is True
    assert await client.cancel("open") is False, "cancelled already"
    assert (await client.wait("open", timeout=1)).status == "cancelled"
    # Adding items does not re-open it; retry_failed does.
    assert await client.add_items("open", [NewItem("b", b"")]) is False
    assert (await client.partition("open")).status == "cancelled"
    assert (await client.retry_failed("open")).items_reset == 0
    assert (await client.partition("open")).status == "available"
    [row] = [r for r in await store.leases_read_free(5) if r.id == "empty"]
    [won] = await store.leases_take([row], "w", 30)
    await store.partition_transition("empty", won.version, "w", status="complete")
    assert await client.cancel("empty") is False
    assert (await client.partition("empty")).status == "complete"
    with pytest.raises(PartitionNotFoundError):
        await client.cancel("nope")


# -- delete ---------------------------------------------------------------------

async def test_delete_with_and_without_a_live_lease(client, make_store) -> None:
    hold = asyncio.Event()

    async def process(item: WorkItem) -> Result:
        if item.partition_id == "busy":
            await hold.wait()
        return Result(done=True)

    await client.create_partition("busy", [NewItem(f"b{n}", b"") for n in range(5)])
    await client.create_partition("other", [NewItem(f"o{n}", b"") for n in range(5)])
    await client.create_partition("idle", [NewItem(f"i{n:04}", b"") for n in range(2500)])
    assert await client.cancel("idle")
    watcher = Watcher(make_store(), process, config("w1"))
    async with running(watcher):
        await wait_until(lambda: "busy" in watcher.partitions, timeout=20,
                         message="the watcher holds busy")
        before = await client.partition("busy")
        with pytest.raises(PartitionLeasedError, match="processor 'w1' holds its lease"):
            await client.delete_partition("busy")
        after = await client.partition("busy")
        assert (after.version, after.counts, after.status) == (
            before.version, before.counts, "available"), "a refused delete writes nothing"
        assert await client.delete_partition("busy", force=True) == 5
        with pytest.raises(PartitionNotFoundError):
            await client.partition("busy")
        hold.set()
        await wait_until(lambda: "busy" not in watcher.partitions, timeout=5,
                         message="the holder lets the deleted partition go")
        assert (await client.wait("other", timeout=20)).status == "complete"
    # Without a lease, a plain delete goes through, in batches of its own transaction each.
    batches = count_calls(client.store, "partition_delete_batch")
    assert await client.delete_partition("idle", batch=300) == 2500
    assert batches["partition_delete_batch"] == 9  # eight full batches and the last
    assert await client.store.partition_get("idle") is None
    with pytest.raises(PartitionNotFoundError):
        await client.delete_partition("idle")
    with pytest.raises(InvalidInputError, match="batch must be"):
        await client.delete_partition("other", batch=0)
    assert (await client.partition("other")).counts == {"complete": 5}


async def test_a_delete_cut_short_is_finished_later(client, store) -> None:
    """A partition left ``deleting`` cannot be re-opened or added to; deleting it again,
    or a purge, finishes the job."""
    for name in ("a", "b"):
        await client.create_partition(name, [NewItem(f"i{n:03}", b"") for n in range(30)])
        await store.partition_delete_begin(name)
        assert (await store.partition_delete_batch(name, 10)).items == 10  # then a crash
        assert (await client.partition(name)).status == "deleting"
        with pytest.raises(PartitionNotFoundError):
            await client.add_items(name, [NewItem("new", b"")])
        with pytest.raises(PartitionNotFoundError):
            await client.retry_failed(name)
        with pytest.raises(PartitionNotFoundError):
            await client.cancel(name)
        assert await store.leases_read_free(5) == []
    assert await client.delete_partition("a") == 20
    report = await client.purge(older_than=DAY)  # finishes "b" whatever its age
    assert (report.partitions, report.items) == (1, 20)
    assert await client.partitions() == []


# -- purge ----------------------------------------------------------------------

async def test_purge_in_batches_leaves_the_rest_exactly_intact(client, make_store) -> None:
    clock = FixedClock(utc_now())
    aged = make_store(clock=clock)
    old, recent = utc_now() - timedelta(days=10), utc_now() - timedelta(days=1)
    doomed = {"old-complete-0": 0, "old-complete-5": 5, "old-complete-1200": 1200,
              "old-cancelled-3": 3, "old-cancelled-0": 0}
    for partition_id, count in doomed.items():
        await make_finished(aged, clock, partition_id, partition_id.split("-")[1], at=old,
                            items=count)
    for partition_id, status, when, count in [
            ("old-failed", "failed", old, 4), ("old-open", "available", old, 6),
            ("recent-complete", "complete", recent, 7), ("recent-cancelled", "cancelled",
                                                          recent, 2)]:
        await make_finished(aged, clock, partition_id, status, at=when, items=count)
    await client.create_partition("new-open", [NewItem("a", b"")])
    before = await snapshot(client.store)

    dry = await client.purge(older_than=timedelta(days=7), dry_run=True)
    assert (dry.partitions, dry.items) == (5, sum(doomed.values()))
    assert await snapshot(client.store) == before, "a dry run deletes nothing"

    batches = count_calls(client.store, "partition_delete_batch")
    report = await client.purge(older_than=7 * DAY, batch=100)
    assert (report.partitions, report.items, report.stopped) == (5, 1208, False)
    # 1,200 items: twelve full batches and an empty last; every other partition: one.
    assert batches["partition_delete_batch"] == 13 + 4
    after = await snapshot(client.store)
    assert after == {pid: state for pid, state in before.items() if pid not in doomed}
    assert (await client.purge(older_than=7 * DAY)).partitions == 0

    failed = await client.purge(older_than=7 * DAY, statuses=["failed"])
    assert (failed.partitions, failed.items) == (1, 4)
    assert set(await snapshot(client.store)) == {
        "old-open", "recent-complete", "recent-cancelled", "new-open"}
    for bad, fragment in [({"statuses": ["available"]}, "only finished statuses"),
                          ({"statuses": []}, "at least one"),
                          ({"older_than": 0}, "older_than must be"),
                          ({"older_than": 7 * DAY, "batch": 10**6}, "batch must be")]:
        arguments = {"older_than": 7 * DAY, **bad}
        with pytest.raises(InvalidInputError, match=fragment):
            await client.purge(**arguments)


async def test_a_partition_re_opened_during_a_purge_is_kept(client, make_store) -> None:
    clock = FixedClock(utc_now() - timedelta(days=10))
    aged = make_store(clock=clock)
    await make_finished(aged, clock, "p", "complete", at=clock.moment, items=3)
    [candidate] = await client.store.partitions_purgeable(older_than=DAY,
                                                          statuses=["complete"], limit=10)
    assert await client.add_items("p", [NewItem("late", b"")]) is True  # re-opened now
    step = await client.store.partition_delete_batch(candidate, 10, statuses=["complete"],
                                                     older_than=DAY)
    assert step.skipped and step.items == 0
    info = await client.partition("p")
    assert (info.status, info.counts) == ("available", {"available": 4}), "kept whole"


# -- retention --------------------------------------------------------------------

async def test_leader_lease_goes_to_exactly_one(make_store) -> None:
    clock = FixedClock(datetime(2030, 1, 1))
    stores = [make_store(clock=clock) for _ in range(4)]
    won = await asyncio.gather(*(s.leader_take("retention", f"o{n}", 10)
                                 for n, s in enumerate(stores)))
    assert sum(won) == 1
    holder = won.index(True)
    others = [n for n in range(4) if n != holder]
    assert not any(await asyncio.gather(*(stores[n].leader_take("retention", f"o{n}", 10)
                                          for n in others)))
    assert await stores[holder].leader_take("retention", f"o{holder}", 10), "renewed"
    clock.advance(11)
    won = await asyncio.gather(*(stores[n].leader_take("retention", f"o{n}", 10)
                                 for n in others))
    assert sum(won) == 1, "after expiry exactly one other takes it"
    new_holder = others[won.index(True)]
    assert await stores[new_holder].leader_release("retention", f"o{new_holder}")
    assert await stores[holder].leader_take("retention", f"o{holder}", 10), "released: free"


async def test_background_retention_with_two_processors(client, make_store) -> None:
    """Two processors run retention: one purges at a time (their batches never overlap),
    the other takes over when the first stops, and nothing live or recent is touched."""
    clock = FixedClock(utc_now())
    aged = make_store(clock=clock)
    old = utc_now() - timedelta(days=9)
    for n in range(6):
        await make_finished(aged, clock, f"old-{n}", ("complete", "cancelled")[n % 2], at=old,
                            items=n * 3)
    await make_finished(aged, clock, "old-failed", "failed", at=old, items=2)
    await make_finished(aged, clock, "old-open", "available", at=old, items=4)
    await make_finished(aged, clock, "recent", "complete", at=utc_now() - timedelta(hours=1),
                        items=2)
    for n in range(3):
        await client.create_partition(f"live-{n}", [NewItem(f"i{m}", b"") for m in range(8)])

    async def process(item: WorkItem) -> Result:
        await asyncio.sleep(0.005)
        return Result(done=True)

    spans: list[tuple[str, float, float]] = []
    retentions = []
    watchers = []
    for owner in ("w1", "w2"):
        store = make_store()
        original = store.partition_delete_batch

        async def tracked(*args: Any, _owner: str = owner, _original: Any = original,
                          **kwargs: Any) -> Any:
            started = time.monotonic()
            try:
                return await _original(*args, **kwargs)
            finally:
                spans.append((_owner, started, time.monotonic()))

        store.partition_delete_batch = tracked  # type: ignore[method-assign]
        # A lease no purge batch outlasts, even on a busy machine (a lapse would hand the
        # duty over mid-purge); the take-over below follows the leader's release on stop.
        retentions.append(Retention(store, owner, RetentionConfig(
            older_than=7 * DAY, interval=0.05, hold=5.0, batch=2)))
        watchers.append(Watcher(store, process, config(owner)))
    tasks = [asyncio.create_task(retention.run()) for retention in retentions]
    try:
        async with running(*watchers):
            await wait_until(lambda: _gone(client, [f"old-{n}" for n in range(6)]),
                             timeout=20, message="the old finished partitions purged")
            first = {owner for owner, _, _ in spans}
            assert len(first) == 1, "one processor purged"
            leader = retentions[0] if first == {"w1"} else retentions[1]
            leader.stop()
            await asyncio.wait_for(tasks[retentions.index(leader)], timeout=10)
            for n in range(6, 9):  # cancelled: the running watchers may lease them first
                await make_finished(aged, clock, f"old-{n}", "cancelled", at=old, items=5)
            await wait_until(lambda: _gone(client, [f"old-{n}" for n in range(6, 9)]),
                             timeout=20, message="the other processor takes over and purges")
            for n in range(3):
                assert (await client.wait(f"live-{n}", timeout=20)).counts == {"complete": 8}
            assert (await client.wait("old-open", timeout=20)).counts == {"complete": 4}
    finally:
        for retention in retentions:
            retention.stop()
        await asyncio.gather(*tasks)
    assert {owner for owner, _, _ in spans} == {"w1", "w2"}
    ordered = sorted(spans, key=lambda span: span[1])
    for (owner_a, _, end_a), (owner_b, start_b, _) in itertools.pairwise(ordered):
        assert owner_a == owner_b or start_b >= end_a, "two processors purged at once"
    left = {info.id: info for info in await client.partitions()}
    assert set(left) == {"old-failed", "old-open", "recent", "live-0", "live-1", "live-2"}
    assert left["old-failed"].counts == {"available": 2}
    assert left["recent"].counts == {"available": 2}
    assert left["old-open"].status == "complete", "the old open one was processed, not purged"


async def _gone(client: AsyncClient, ids: list[str]) -> bool:
    present = {info.id for info in await client.partitions()}
    return not present & set(ids)


# -- backlog --------------------------------------------------------------------

async def test_backlog_counts_what_waits_at_each_open_gate(client, store) -> None:
    await client.create_partition("a", [NewItem("x", b""), NewItem("y", b""),
                                        NewItem("z", b"", gate=2)])
    await client.create_partition("b", [NewItem("x", b"", gate=4), NewItem("y", b"", gate=5)])
    await client.create_partition("c", [NewItem("x", b"")])
    await client.cancel("c")
    backlog = await store.backlog_read(1000)
    assert backlog.items_waiting == 3  # a: x and y at gate 0; b: x at gate 4
    assert backlog.partitions == {"available": 2, "complete": 0, "failed": 0,
                                  "cancelled": 1, "deleting": 0}
    capped = await store.backlog_read(1)
    assert capped.items_waiting == 1 and capped.partitions["available"] == 1


async def test_backlog_finds_the_oldest_ready_item_by_the_store_clock(make_store) -> None:
    """How long the oldest item ready at its open partition's gate has waited, by the
    store's clock: completed items, items at a later gate, items whose retry delay runs
    and the items of a cancelled partition are not waiting; none waiting reads 0."""
    start = utc_now() - timedelta(days=1)
    clock = FixedClock(start)
    store = make_store(clock=clock)
    assert (await store.backlog_read(1000)).oldest_waiting == 0.0
    await store.partition_create("cancelled", [NewItem("x", b"")])
    await store.partition_cancel("cancelled")
    await store.partition_create("mixed", [NewItem("done", b""), NewItem("later", b""),
                                           NewItem("next", b"", gate=1)])
    await store.leases_take(await store.leases_read_free(10), "setup", DAY)
    clock.advance(30)  # start + 30 s: one completes, the other fails into a 1 h delay
    versions = {item.id: item.version for item in await store.items_list("mixed")}
    assert await store.items_apply([
        ItemWrite("mixed", "done", versions["done"], "complete", None, 1),
        ItemWrite("mixed", "later", versions["later"], "available", None, 1,
                  last_error="busy", retry_delay=3600.0)], "setup") == [True, True]
    clock.advance(30)
    await store.partition_create("ready", [NewItem("a", b""), NewItem("b", b"")])
    clock.advance(40)  # start + 100 s: "ready" has waited 40 s, nothing else waits
    backlog = await store.backlog_read(1000)
    assert backlog.oldest_waiting == pytest.approx(40.0, abs=0.01)
    assert backlog.items_waiting == 3  # a, b and the delayed one (waiting, not ready)
    await store.leases_take(await store.leases_read_free(10), "setup", DAY)
    versions = {item.id: item.version for item in await store.items_list("ready")}
    assert await store.items_apply([
        ItemWrite("ready", item_id, version, "complete", None, 1)
        for item_id, version in versions.items()], "setup") == [True, True]
    assert (await store.backlog_read(1000)).oldest_waiting == 0.0
    clock.advance(3600)  # start + 3700 s: the delay ended at start + 3630 s
    assert (await store.backlog_read(1000)).oldest_waiting == pytest.approx(70.0, abs=0.01)


# -- item retention: finished items of open partitions ----------------------------

async def _settle(store: Store, partition_id: str, outcomes: dict[str, str]) -> None:
    """Write ``outcomes`` (item id -> complete/failed) under a lease of ``setup``."""
    items = {item.id: item for item in await store.items_list(partition_id)}
    writes = [ItemWrite(partition_id, item_id, items[item_id].version, status, None, 1,
                        last_error="boom" if status == "failed" else None)
              for item_id, status in outcomes.items()]
    assert await store.items_apply(writes, "setup") == [True] * len(writes)


async def test_item_retention_sheds_old_complete_items_of_open_partitions(make_store) -> None:
    """Complete items older than the cutoff go from open partitions, in batches; failed
    and available items, items at the reduce gate a partition stands at, recent items
    and the items of finished partitions stay, byte for byte."""
    from watcher.records import PartitionSettings
    from watcher.retention import purge_finished_items

    clock = FixedClock(utc_now() - timedelta(days=10))
    store = make_store(clock=clock)
    await store.partition_create("queue", [NewItem(f"q{n:02}", b"q") for n in range(25)])
    await store.partition_create(
        "red", [NewItem("r0", b"r"), *(NewItem(f"r{n}", b"r", gate=1) for n in (1, 2, 3))],
        PartitionSettings(reduce_gates=frozenset({1}), continue_on_failure=True))
    await make_finished(store, clock, "done", "complete", at=clock.moment, items=3)
    await store.leases_take(await store.leases_read_free(10), "setup", 30 * DAY)
    await _settle(store, "queue", {**{f"q{n:02}": "complete" for n in range(20)},
                                   "q20": "failed", "q21": "failed"})
    await _settle(store, "red", {"r0": "complete"})
    await store.partition_set_gate("red", 1)  # a reduce gate: the reduce is under way
    await _settle(store, "red", {"r1": "complete", "r2": "failed"})
    clock.set(utc_now())
    await store.partition_create("recent", [NewItem("n0", b"n"), NewItem("n1", b"n")])
    await store.leases_take(await store.leases_read_free(10), "setup", 30 * DAY)
    await _settle(store, "recent", {"n0": "complete"})
    before = await snapshot(store)

    batches = count_calls(store, "items_purge_finished")
    report = await purge_finished_items(store, older_than=DAY, batch=7)
    assert (report.finished_items, report.partitions, report.items) == (21, 0, 0)
    # queue: 7 + 7 + 6 (short: done); red, recent: one each; done is not open.
    assert batches["items_purge_finished"] == 5
    gone = {("queue", f"q{n:02}") for n in range(20)} | {("red", "r0")}
    after = await snapshot(store)
    assert set(after) == set(before)
    for pid, (info, items) in before.items():
        kept = [item for item in items if (pid, item[0]) not in gone]
        assert after[pid][1] == kept, pid
        assert after[pid][0].status == info.status
    # Counts are of the items still stored.
    assert (await store.partition_get("queue")).counts == {"failed": 2, "available": 3}
    assert (await purge_finished_items(store, older_than=DAY)).finished_items == 0

    # Once the partition has passed the reduce gate, its complete items there go too.
    clock.set(utc_now() + timedelta(days=2))
    version = (await store.partition_state("red")).version
    assert await store.partition_transition("red", version, "setup", gate=2)
    assert (await purge_finished_items(store, older_than=DAY)).finished_items == 2  # r1, n0
    assert [item.id for item in await store.items_list("red")] == ["r2", "r3"]


async def test_background_retention_of_finished_items_alone(make_store) -> None:
    """--retention-items without --retention: finished partitions stay whole, the open
    partition's old complete items go, and the report counts them."""
    clock = FixedClock(utc_now() - timedelta(days=10))
    store = make_store(clock=clock)
    await store.partition_create("open", [NewItem(f"i{n}", b"x") for n in range(4)])
    await make_finished(store, clock, "done", "complete", at=clock.moment, items=2)
    await store.leases_take(await store.leases_read_free(10), "setup", 30 * DAY)
    await _settle(store, "open", {"i0": "complete", "i1": "complete"})
    clock.set(utc_now())
    with pytest.raises(ValueError, match="--retention-items"):
        RetentionConfig(older_than=None)
    retention = Retention(store, "r", RetentionConfig(older_than=None, items_older_than=DAY))
    report = await retention.run_once()
    assert report is not None and (report.partitions, report.finished_items) == (0, 2)
    assert [item.id for item in await store.items_list("open")] == ["i2", "i3"]
    assert len(await store.items_list("done")) == 2
