"""Leases against real databases: races, release, renewal, database-clock expiry."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import event, update

from watcher.records import LeaseRenewal, LeaseRow, NewItem
from watcher.store import Store
from watcher.store.db.clock import FixedClock


async def test_concurrent_lease_attempts_exactly_one_wins(make_store) -> None:
    """Ten watchers (each with its own connections) race for one free partition."""
    setup = make_store()
    await setup.partition_create("p", [NewItem("i", b"x")])
    (row,) = await setup.leases_read_free(10)
    stores = [make_store() for _ in range(10)]
    results = await asyncio.gather(
        *(store.leases_take([row], f"w{n}", 30.0) for n, store in enumerate(stores)))
    winners = [won[0].owner for won in results if won]
    assert len(winners) == 1
    assert (await setup.partition_get("p")).owner == winners[0]
    assert await setup.leases_read_free(10) == []


async def test_one_take_of_many_partitions_wins_exactly_those_not_moved_on(store) -> None:
    """Taken in one guarded UPDATE: a partition written since it was read (a client
    added items), or taken by another meanwhile, is not won; the others are."""
    for n in range(7):
        await store.partition_create(f"p{n}", [NewItem("i", b"x")])
    rows = await store.leases_read_free(10)
    assert len(rows) == 7
    await store.items_add("p2", [NewItem("j", b"y")])  # bumps p2's version
    assert len(await store.leases_take([row for row in rows if row.id == "p5"], "other", 30.0)) == 1
    won = await store.leases_take(rows, "me", 30.0)
    assert sorted(lease.id for lease in won) == ["p0", "p1", "p3", "p4", "p6"]
    by_id = {row.id: row for row in rows}
    assert all(lease.version == by_id[lease.id].version + 1 and lease.owner == "me"
               for lease in won)
    assert (await store.partition_get("p5")).owner == "other"
    assert (await store.partition_get("p2")).owner == ""
    assert (await store.lease_stats()).owners == {"me": 5, "other": 1}


async def test_take_renew_release_cycle(store) -> None:
    await store.partition_create("p", [NewItem("i", b"x")])
    (row,) = await store.leases_read_free(5)
    (lease,) = await store.leases_take([row], "me", 30.0)
    assert lease.version == row.version + 1
    stats = await store.lease_stats()
    assert stats.active == 1 and stats.owners == {"me": 1}

    renewed = await store.leases_renew({"p": lease.version}, "me", 30.0)
    assert renewed == LeaseRenewal({"p": (lease.version + 1, None)})

    # A stranger holding a stale version renews nothing.
    assert await store.leases_renew({"p": lease.version}, "other", 30.0) == LeaseRenewal({})

    assert await store.leases_release({"p": lease.version + 1}, "me") == 1
    info = await store.partition_get("p")
    assert info.owner == ""
    assert [r.id for r in await store.leases_read_free(5)] == ["p"], "released means free at once"


async def test_renewal_adopts_a_client_write(store) -> None:
    """add_items bumps the version; the owner's renewal re-reads and keeps the lease."""
    await store.partition_create("p", [NewItem("a", b"x")])
    (lease,) = await store.leases_take(await store.leases_read_free(5), "me", 30.0)
    await store.items_add("p", [NewItem("b", b"y")])
    renewed = await store.leases_renew({"p": lease.version}, "me", 30.0)
    assert renewed.held["p"][0] == lease.version + 2
    assert (await store.partition_get("p")).owner == "me"


async def test_expiry_follows_the_database_clock(make_store) -> None:
    """A lease is free exactly when the (injected) database time passes its end."""
    clock = FixedClock(datetime(2030, 1, 1, 12, 0, 0))
    store = make_store(clock=clock)
    await store.partition_create("p", [NewItem("i", b"x")])
    (lease,) = await store.leases_take(await store.leases_read_free(5), "a", 10.0)
    clock.advance(9.9)
    assert await store.leases_read_free(5) == []
    assert (await store.lease_stats()).owners == {"a": 1}
    clock.advance(0.2)
    free = await store.leases_read_free(5)
    assert [row.id for row in free] == ["p"]
    assert (await store.lease_stats()).owners == {}
    (taken,) = await store.leases_take(free, "b", 10.0)
    assert taken.owner == "b"
    # The old owner's renewal now finds the partition gone.
    assert await store.leases_renew({"p": lease.version}, "a", 10.0) == LeaseRenewal({})


async def test_lease_stats_count_active_partitions_and_live_leases_by_owner(make_store) -> None:
    """One read counts what fair shares come from: every active partition (leased, with
    its lease expired, or free) and each owner's live leases; a partition scheduled for
    later, a closed one and a cancelled one are not active."""
    clock = FixedClock(datetime(2030, 1, 1, 12, 0, 0))
    store = make_store(clock=clock)
    for pid in ("a1", "a2", "b1", "expired", "free", "closed", "cancelled"):
        await store.partition_create(pid, [NewItem("i", b"x")])
    await store.partition_create("later", [NewItem("i", b"x")],
                                 start_at=datetime(2030, 1, 2, tzinfo=UTC))
    rows = {row.id: row for row in await store.leases_read_free(20)}
    assert "later" not in rows
    (old,) = await store.leases_take([rows["expired"]], "c", 5.0)
    clock.advance(6.0)
    await store.leases_take([rows["a1"], rows["a2"]], "a", 30.0)
    (closing,) = await store.leases_take([rows["closed"]], "a", 30.0)
    await store.partition_transition("closed", closing.version, "a", status="complete")
    await store.leases_take([rows["b1"]], "b", 30.0)
    await store.partition_cancel("cancelled")
    stats = await store.lease_stats()
    assert stats.owners == {"a": 2, "b": 1}
    assert stats.active == 5  # a1, a2, b1, expired, free
    assert old.owner == "c"


async def test_lease_stats_count_free_partitions_up_to_a_cap(make_store) -> None:
    """The free partitions are counted up to the cap asked for, and the stats say the count
    stopped there; the live leases are counted in full. Below the cap the count is exact."""
    store = make_store()
    for n in range(6):
        await store.partition_create(f"p{n}", [NewItem("i", b"x")])
    await store.leases_take((await store.leases_read_free(20))[:2], "a", 30.0)
    capped = await store.lease_stats(free_cap=3)
    assert capped.owners == {"a": 2}
    assert (capped.active, capped.free_at_cap) == (5, True)  # two leased, three of four free
    exact = await store.lease_stats(free_cap=5)
    assert (exact.active, exact.free_at_cap) == (6, False)
    assert (await store.lease_stats()).active == 6


async def test_guarded_transition_loses_on_stale_version(store) -> None:
    await store.partition_create("p", [NewItem("i", b"x")])
    (lease,) = await store.leases_take(await store.leases_read_free(5), "me", 30.0)
    assert await store.partition_transition("p", lease.version - 1, "me", gate=3) is None
    assert await store.partition_transition("p", lease.version, "intruder", gate=3) is None
    new_version = await store.partition_transition("p", lease.version, "me", gate=3)
    assert new_version == lease.version + 1
    info = await store.partition_get("p")
    assert (info.gate, info.version) == (3, new_version)


async def test_closing_releases_the_lease(store) -> None:
    await store.partition_create("p", [NewItem("i", b"x")])
    (lease,) = await store.leases_take(await store.leases_read_free(5), "me", 30.0)
    assert await store.partition_transition("p", lease.version, "me", status="complete")
    info = await store.partition_get("p")
    assert (info.status, info.owner) == ("complete", "")
    assert (await store.lease_stats()).active == 0


async def test_lease_writes_pass_by_a_row_another_session_holds(make_store) -> None:
    """A transaction left open on one partition row (a frozen client, say) holds up that
    partition only: renewals of the others go through, the held one comes back busy,
    and takers pass it by instead of waiting for the lock.
    """
    store = make_store()
    if store.engine.dialect.name == "sqlite":
        pytest.skip("SQLite locks the whole database, not rows")
    for pid in ("a", "b", "c"):
        await store.partition_create(pid, [NewItem("i", b"x")])
    won = await store.leases_take(await store.leases_read_free(5), "me", 30.0)
    versions = {row.id: row.version for row in won}
    holder = make_store()
    p = holder.tables.partitions
    async with holder.engine.connect() as conn:
        transaction = await conn.begin()
        await conn.execute(update(p).where(p.c.id == "b").values(version=p.c.version + 1))
        renewal = await asyncio.wait_for(store.leases_renew(versions, "me", 30.0), timeout=10)
        assert set(renewal.held) == {"a", "c"} and renewal.busy == {"b"}
        # An expired lease on the held row is not taken either, and nobody waits.
        taken = await asyncio.wait_for(
            make_store().leases_take(won, "thief", 30.0), timeout=10)
        assert taken == []
        await transaction.rollback()
    renewal = await store.leases_renew({"b": versions["b"]}, "me", 30.0)
    assert set(renewal.held) == {"b"} and renewal.busy == frozenset()


@contextlib.contextmanager
def _updates_sent(store: Store) -> Iterator[list[str]]:
    """The UPDATE statements ``store`` sends meanwhile, through its engine or its
    driver's own path."""
    sent: list[str] = []

    def on_sql(statement: str) -> None:
        # An UPDATE, or one whose rows a common table expression locks first.
        if statement.lstrip().upper().startswith(("UPDATE", "WITH")):
            sent.append(statement)

    def on_execute(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        on_sql(statement)

    event.listen(store.engine.sync_engine, "before_cursor_execute", on_execute)
    store.driver.add_statement_listener(on_sql)
    try:
        yield sent
    finally:
        store.driver.remove_statement_listener(on_sql)
        event.remove(store.engine.sync_engine, "before_cursor_execute", on_execute)


async def test_renewal_of_many_leases_is_one_guarded_update(make_store) -> None:
    """N leases renew in one UPDATE; in that same statement a lease taken over by
    another watcher, one released elsewhere and one cancelled are not renewed,
    and a client write (a bumped version) is adopted with the gate re-read."""
    store = make_store()
    ids = [f"p{n:02d}" for n in range(12)]
    for pid in ids:
        await store.partition_create(pid, [NewItem("i", b"x")])
    won = await store.leases_take(await store.leases_read_free(20), "me", 30.0)
    versions = {row.id: row.version for row in won}
    assert sorted(versions) == ids
    # p00: its lease expired and another watcher took it (a stale version, a new owner).
    thief = make_store(clock=FixedClock(datetime(2999, 1, 1)))
    (stolen,) = await thief.leases_take([_row(won, "p00")], "thief", 30.0)
    # p01: a client added items (version bumped, still ours).
    await store.items_add("p01", [NewItem("j", b"y")])
    # p02: a client cancelled it.
    await store.partition_cancel("p02")
    with _updates_sent(store) as updates:
        renewal = await store.leases_renew(versions, "me", 30.0)
    assert len(updates) == 1, updates
    assert set(renewal.held) == set(ids) - {"p00", "p02"}
    assert renewal.held["p01"] == (versions["p01"] + 2, 0), "the client write is adopted"
    assert all(renewal.held[pid] == (versions[pid] + 1, None) for pid in ids[3:])
    assert renewal.stopped == {"p02"} and renewal.busy == frozenset()
    assert (await store.partition_get("p00")).owner == "thief"
    assert (await store.partition_get("p00")).version == stolen.version, "not rewritten"
    for pid in ids[3:]:
        assert (await store.partition_get(pid)).version == versions[pid] + 1

    # Releasing all of them is one statement too, and frees only what is ours.
    held = {pid: version for pid, (version, _) in renewal.held.items()}
    with _updates_sent(store) as updates:
        assert await store.leases_release(held, "me") == len(held)
    assert len(updates) == 1
    assert (await store.partition_get("p00")).owner == "thief"
    assert {row.id for row in await store.leases_read_free(20)} == set(held)


def _row(rows: list[LeaseRow], pid: str) -> LeaseRow:
    return next(row for row in rows if row.id == pid)


async def test_updated_at_moves_with_the_status_not_with_each_write(make_store) -> None:
    """add_items and a gate advance on an open partition leave ``updated_at`` (indexed:
    their writes stay HOT on PostgreSQL); a close and a re-open move it, so retention
    and the finished-per-minute counts still see when a partition finished."""
    clock = FixedClock(datetime(2030, 1, 1))
    store = make_store(clock=clock)
    await store.partition_create("p", [NewItem("a", b"x")])
    await store.leases_take(await store.leases_read_free(5), "me", 30.0)
    taken_at = (await store.partition_get("p")).updated_at
    clock.advance(60)
    await store.items_add("p", [NewItem("b", b"y", gate=1)])
    version = (await store.partition_get("p")).version
    advanced = await store.partition_transition("p", version, "me", gate=1)
    assert advanced == version + 1
    assert (await store.partition_get("p")).updated_at == taken_at
    closed_at = clock.advance(60)
    assert await store.partition_transition("p", advanced, "me", status="complete")
    assert (await store.partition_get("p")).updated_at == closed_at
    reopened_at = clock.advance(60)
    assert await store.items_add("p", [NewItem("c", b"z", gate=1)]) is True
    info = await store.partition_get("p")
    assert (info.status, info.updated_at) == ("available", reopened_at)


async def test_a_take_carries_the_timeline_read_with_the_row(store) -> None:
    """The free read returns each partition's stored timeline, and the take (guarded by
    the version read) hands it on: a lease starts knowing it, so its first gate move
    writes the timeline without reading it again."""
    from watcher.rules.timeline import Progress

    await store.partition_create("p", [NewItem("i", b"x")])
    (row,) = await store.leases_read_free(5)
    assert row.timeline_read and row.timeline is None  # a new partition has none yet
    (lease,) = await store.leases_take([row], "first", 30.0)
    renewal = await store.leases_renew({"p": lease.version}, "first", 30.0,
                                       progress={"p": Progress(0, 3, 1.0)},
                                       known={"p": lease.timeline})
    await store.leases_release({"p": renewal.held["p"][0]}, "first")
    _, stored = await store.partition_timeline("p")
    assert stored is not None, "the renewal wrote the 3 items done into the timeline"
    (row,) = await store.leases_read_free(5)
    assert (row.timeline, row.timeline_read) == (stored, True)
    (taken,) = await store.leases_take([row], "second", 30.0)
    assert (taken.timeline, taken.timeline_read, taken.owner) == (stored, True, "second")
    assert taken.version == row.version + 1


async def test_the_keeper_says_whether_it_left_free_partitions_untaken(store) -> None:
    """A supervisor's end calls a lease cycle at once only while free partitions were
    left untaken (by the batch size, or by the lease limit); once every one is held,
    an ending frees room for nothing, and the next poll or notification will do."""
    from watcher.config import WatcherConfig
    from watcher.hooks import Hooks
    from watcher.leasing.keeper import LeaseKeeper

    for n in range(3):
        await store.partition_create(f"p{n}", [NewItem("i", b"x")])
    keeper = LeaseKeeper(store, WatcherConfig(owner_id="me", lease_batch=2, max_leases=4),
                         Hooks())
    assert len((await keeper.run_once()).acquired) == 2 and keeper.free_left
    assert len((await keeper.run_once()).acquired) == 1 and not keeper.free_left
    await store.partition_create("p3", [NewItem("i", b"x")])
    await store.partition_create("p4", [NewItem("i", b"x")])
    assert len((await keeper.run_once()).acquired) == 1, "the lease limit: 4"
    assert keeper.free_left
    await keeper.run_once()
    assert keeper.free_left, "at the limit with p4 free: an ending makes room for it"


async def _watcher_at_its_lease_limit(store, partitions: int, config: Any, *,
                                      cycles: int) -> Any:
    """A watcher (whose supervisors never run) holding ``config.max_leases`` of
    ``partitions`` one-item partitions after ``cycles`` lease cycles, with free ones
    left."""
    from watcher import Watcher

    for n in range(partitions):
        await store.partition_create(f"p{n}", [NewItem("i", b"x")])

    async def process(item):  # never called: no supervisor runs here
        raise AssertionError(item)

    watcher = Watcher(store, process, config)
    for _ in range(cycles):
        await watcher.keeper.run_once()
    assert len(watcher.keeper.leases) == config.max_leases and watcher.keeper.free_left
    return watcher


async def test_an_ending_calls_a_cycle_only_when_the_room_can_start_work_sooner(store) -> None:
    """With free partitions left, a supervisor's end wakes the lease cycle once the
    cycle could take a lease batch (or all the room the lease limit leaves); with less
    room than that, the cycle waits for a fuller batch (or the poll)."""
    from watcher import WatcherConfig

    config = WatcherConfig(owner_id="me", lease_batch=2, max_leases=5, concurrency=2)
    watcher = await _watcher_at_its_lease_limit(store, 6, config, cycles=3)
    watcher._wake.clear()
    watcher._room_may_have_opened()
    assert not watcher._wake.is_set(), "5 held for 2 calls at once, no room: wait"
    watcher.keeper.leases.pop("p0"), watcher.keeper.leases.pop("p1")  # two closed
    watcher._room_may_have_opened()
    assert watcher._wake.is_set(), "3 held for 2 calls, but a lease batch (2) of room"
    watcher._wake.clear()
    watcher.keeper.free_left = False
    watcher._room_may_have_opened()
    assert not watcher._wake.is_set(), "nothing free was left untaken"
    watcher.keeper.free_left = True
    watcher.keeper.leases.pop("p2")  # 2 held for 2 calls at once
    watcher._room_may_have_opened()
    assert watcher._wake.is_set()


async def test_an_ending_calls_a_cycle_for_the_last_room_a_small_lease_limit_leaves(
        store) -> None:
    """With ``max_leases`` below a lease batch, an ending calls a cycle for the one
    partition it makes room for, as long as the slots' backlog has room too."""
    from watcher import WatcherConfig

    watcher = await _watcher_at_its_lease_limit(
        store, 8, WatcherConfig(owner_id="me", max_leases=5), cycles=1)
    watcher._wake.clear()
    watcher._room_may_have_opened()
    assert not watcher._wake.is_set(), "at the lease limit: no room"
    watcher.keeper.leases.pop("p0")  # one closed: room for one, less than a lease batch
    watcher._room_may_have_opened()
    assert watcher._wake.is_set(), "the last room the lease limit leaves"


async def test_a_full_backlog_takes_only_what_would_start_before_it(store) -> None:
    """With two lease batches of its partitions waiting for slots, a keeper takes no
    ordinary free partition, but takes one of a higher priority and one of a concurrency
    key none of its partitions has (fair queuing ranks a new tenant's partition near the
    head of the queue, among the candidates a cycle reads); with part of a backlog it
    takes only the rest."""
    from watcher.config import WatcherConfig
    from watcher.hooks import Hooks
    from watcher.leasing.keeper import LeaseKeeper
    from watcher.records import PartitionSettings
    from watcher.rules.balance import Backlog

    for n in range(12):  # a tenant's burst: its key's clock spreads their places
        await store.partition_create(f"p{n:02}", [NewItem("i", b"x")],
                                     PartitionSettings(key="tenant-a"))
    (ordinary, *_) = await store.leases_read_free(1)
    await store.partition_create("urgent", [NewItem("i", b"x")], PartitionSettings(priority=5))
    await store.partition_create("tenant", [NewItem("i", b"x")],
                                 PartitionSettings(key="tenant-b"))
    backlog = Backlog(waiting=4, last_order=ordinary.settings.queue_order,
                      held_keys=frozenset({"tenant-a"}))
    keeper = LeaseKeeper(store, WatcherConfig(owner_id="me", lease_batch=2),
                         Hooks(), backlog=lambda: backlog)
    cycle = await keeper.run_once()
    assert sorted(cycle.acquired) == ["tenant", "urgent"] and not cycle.stolen
    assert keeper.free_left, "the ordinary partitions are left free"
    assert keeper.open_room() == 0
    backlog = Backlog(waiting=3, last_order=ordinary.settings.queue_order)
    assert keeper.open_room() == 1
    assert len((await keeper.run_once()).acquired) == 1, "room for one more waiting"
    backlog = Backlog()
    assert len((await keeper.run_once()).acquired) == 2, "an empty backlog: a lease batch"
    assert len(await store.leases_read_free(20)) == 12 - 3


async def test_a_renewal_never_writes_over_a_timeline_it_has_not_seen(make_store) -> None:
    """A former holder's hand-over lands between the take and the renewal: the renewal
    adds its progress to what is stored, never to its stale copy, so both counts stay
    (on the one-statement path by a second renewal from the copy it read back; the
    engine path reads under the row lock and writes at once)."""
    from watcher.rules.timeline import Progress, decode_timeline

    store = make_store()
    await store.partition_create("p", [NewItem("i", b"x")])
    (lease,) = await store.leases_take(await store.leases_read_free(5), "me", 30.0)
    copy = lease.timeline
    assert await make_store().timelines_hand_over({"p": Progress(0, 5, 1.0)}) == 1
    version, renewals = lease.version, 0
    while renewals < 3:
        renewals += 1
        renewal = await store.leases_renew({"p": version}, "me", 30.0,
                                           progress={"p": Progress(0, 3, 1.0)},
                                           known={"p": copy})
        version = renewal.held["p"][0]
        if "p" in renewal.timelines:
            break
        copy = renewal.timelines_read["p"]  # the holder's new copy; progress still due
    assert renewals == (2 if store.driver.takes_leases_in_one_statement else 1)
    _, stored = await store.partition_timeline("p")
    assert renewal.timelines["p"] == stored
    minutes = decode_timeline(stored).minutes
    assert sum(items for _, items in minutes) == 8  # the hand-over's 5 and the holder's 3



async def test_hundreds_of_leases_are_taken_renewed_and_released(store) -> None:
    """More leases than one statement names (they go in chunks): SQLite refused a
    take of 500 at once ("Expression tree is too large"), and PostgreSQL ran the
    locking subquery once per row."""
    count = 300
    for n in range(count):
        await store.partition_create(f"p{n:03d}", [])
    won = await store.leases_take(await store.leases_read_free(count), "me", 30.0)
    assert len(won) == count
    renewal = await store.leases_renew({row.id: row.version for row in won}, "me", 30.0)
    assert len(renewal.held) == count and not renewal.busy and not renewal.stopped
    held = {pid: version for pid, (version, _) in renewal.held.items()}
    assert await store.leases_release(held, "me") == count
    assert len(await store.leases_read_free(count)) == count
