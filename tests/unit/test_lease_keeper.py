"""Lease bookkeeping without a database: what a renewal does to each lease it holds.

The store is the typed stand-in (tests/support/fake_store.py), answering
``leases_renew`` as told (the SQL side is tested in tests/conformance/test_leases.py).
"""

from __future__ import annotations

import logging
import time

import pytest
from sqlalchemy.exc import OperationalError

from tests.support.fake_store import FakeStore
from watcher.config import WatcherConfig
from watcher.hooks import CountingHooks
from watcher.leasing.keeper import LeaseKeeper
from watcher.leasing.lease import Lease, handed_over_progress
from watcher.records import LeaseRenewal, LeaseRow
from watcher.rules.timeline import Progress


def _keeper(store: FakeStore, *leases: Lease) -> tuple[LeaseKeeper, CountingHooks]:
    hooks = CountingHooks()
    keeper = LeaseKeeper(store, WatcherConfig(owner_id="me", lease_duration=9.0,
                                              poll_interval=0.5), hooks)
    keeper.leases = {lease.partition_id: lease for lease in leases}
    return keeper, hooks


async def test_renewal_extends_adopts_defers_and_loses() -> None:
    held, moved, busy, gone = (Lease("held", 1, 0), Lease("moved", 4, 0), Lease("busy", 2, 0),
                               Lease("gone", 3, 0))
    for lease in (held, moved, busy, gone):
        lease.renewed_at = time.monotonic() - 5
    store = FakeStore(renewal=LeaseRenewal({"held": (2, None), "moved": (6, 3)},
                                       busy=frozenset({"busy"})))
    keeper, hooks = _keeper(store, held, moved, busy, gone)
    untouched = busy.renewed_at
    before = time.monotonic()
    renewed, lost = await keeper.renew()
    assert store.asked.renewals == [{"held": 1, "moved": 4, "busy": 2, "gone": 3}]
    assert (renewed, lost) == (2, ["gone"])
    assert (held.version, held.gate) == (2, 0) and not held.wake.is_set()
    assert (moved.version, moved.gate) == (6, 3) and moved.wake.is_set(), \
        "a gate moved by a client wakes the supervisor"
    assert held.renewed_at >= before, "a renewed lease notes when"
    assert busy.renewed_at == untouched, "a busy lease is not renewed"
    assert not busy.lost and "busy" in keeper.leases
    assert gone.lost and gone.wake.is_set() and "gone" not in keeper.leases
    assert hooks.counts["lease_lost"] == 1


async def test_a_lease_mid_write_is_deferred_then_given_up_after_a_whole_lease() -> None:
    writing = Lease("writing", 1, 0)
    store = FakeStore(renewal=LeaseRenewal({}))
    keeper, _ = _keeper(store, writing)
    async with writing.lock:  # its partition is mid-write
        assert await keeper.renew() == (0, [])
        assert store.asked.renewals == [], "a locked lease is not asked for"
        writing.renewed_at = time.monotonic() - 9.5
        assert await keeper.renew() == (0, ["writing"])
    assert writing.lost and keeper.leases == {}


async def test_closed_and_lost_leases_are_not_renewed() -> None:
    closed, lost = Lease("closed", 1, 0), Lease("lost", 1, 0)
    closed.mark_closed()
    assert lost.mark_lost() and not lost.mark_lost(), "lost once"
    store = FakeStore(renewal=LeaseRenewal({}))
    keeper, _ = _keeper(store, closed, lost)
    assert await keeper.renew() == (0, [])
    assert store.asked.renewals == []


async def test_a_lost_lease_hands_over_its_unwritten_items_until_the_write_succeeds(
        caplog: pytest.LogCaptureFixture) -> None:
    stolen, idle = Lease("stolen", 1, 2), Lease("idle", 1, 0)
    stolen.done.add(7, time.monotonic() - 4)
    store = FakeStore(renewal=LeaseRenewal({}),
                      hand_over_failures=[OperationalError("UPDATE", {}, Exception("gone"))])
    keeper, _ = _keeper(store, stolen, idle)
    with caplog.at_level(logging.WARNING, logger="watcher.leasing.lost"):
        # Both found lost; the hand-over's write fails, and the renewal goes on.
        assert await keeper.renew() == (0, ["stolen", "idle"])
    assert "action=timeline_hand_over_failed owner=me partitions=1" in caplog.text
    assert stolen.lost and idle.lost and keeper.leases == {}
    assert await keeper.lost_progress.hand_over() == 1  # kept, and written at the next try
    first, second = store.asked.hand_overs
    assert first.keys() == second.keys() == {"stolen"}, "a lease with nothing done is not"
    assert (second["stolen"].gate, second["stolen"].items) == (2, 7)
    assert second["stolen"].age >= 4
    assert await keeper.lost_progress.hand_over() == 0 and len(store.asked.hand_overs) == 2


async def test_a_renewal_carries_items_done_once_the_first_is_half_a_lease_old() -> None:
    """A busy partition's timeline row is written every other renewal or so, not at
    each: items done wait until the first is half a lease old (the keeper's lease is
    9 s here); a timeline not read yet is asked for at once."""
    fresh, due, unread = Lease("fresh", 1, 0), Lease("due", 1, 0), Lease("unread", 1, 0)
    now = time.monotonic()
    for lease in (fresh, due):
        lease.timeline_known = True
    fresh.done.add(3, now - 1)
    due.done.add(2, now - 5)
    store = FakeStore(renewal=LeaseRenewal({"fresh": (2, None), "due": (2, None),
                                            "unread": (2, None)}))
    keeper, _ = _keeper(store, fresh, due, unread)
    await keeper.renew()
    [progress] = store.asked.renewal_progress
    assert progress.keys() == {"due", "unread"}
    assert (progress["due"].items, progress["unread"].items) == (2, 0)
    assert fresh.done.items == 3, "still counted, for a later renewal or the next move"


def test_a_partition_lost_twice_hands_over_both_counts_at_the_later_gate() -> None:
    earlier, later = Lease("p", 1, 0), Lease("p", 5, 1)
    now = time.monotonic()
    earlier.done.add(3, now - 10)
    later.done.add(2, now - 1)
    handed = handed_over_progress([earlier, later], now)
    assert handed == {"p": Progress(gate=1, items=5, age=handed["p"].age)}
    assert handed["p"].age >= 10


def test_a_lease_records_its_own_writes_and_notifications() -> None:
    lease = Lease("p", 1, 0)
    lease.wrote(2)
    assert (lease.version, lease.gate) == (2, 0)
    lease.wrote(3, gate=5)
    assert (lease.version, lease.gate) == (3, 5) and not lease.wake.is_set(), \
        "its own write does not wake its supervisor"
    lease.notify()
    assert lease.notified and lease.wake.is_set()
    lease.read_started()
    assert not lease.notified
    lease.renewed(4, None, at=123.0)
    assert (lease.version, lease.gate, lease.renewed_at) == (4, 5, 123.0)


async def test_a_lease_past_its_until_is_lost_even_while_its_renewal_hangs() -> None:
    overdue, fresh = Lease("overdue", 1, 0), Lease("fresh", 1, 0)
    overdue.renewed_at = time.monotonic() - 9.0  # the lease is 9 s: its until has passed
    keeper, hooks = _keeper(FakeStore(renewal=LeaseRenewal({})), overdue, fresh)
    assert keeper.expired(overdue) and overdue.lost and overdue.ended.is_set()
    assert not keeper.expired(fresh) and not fresh.lost
    assert list(keeper.leases) == ["fresh"] and hooks.counts["lease_lost"] == 1


async def test_a_taken_lease_counts_from_before_its_write() -> None:
    """The database set the until while the write ran: counting from its answer would
    trust the lease past it."""
    keeper, _ = _keeper(FakeStore(take_delay=0.2))
    before = time.monotonic()
    assert await keeper._take([LeaseRow("p", 1, 0, "")], stolen_from=None) == ["p"]
    assert keeper.leases["p"].renewed_at <= before + 0.05


async def test_a_taken_lease_starts_with_the_timeline_its_row_carried() -> None:
    keeper, _ = _keeper(FakeStore())
    row = LeaseRow("p", 1, 0, "", timeline='{"gates": []}', timeline_read=True)
    assert await keeper._take([row, LeaseRow("q", 1, 0, "")], stolen_from=None) == ["p", "q"]
    assert (keeper.leases["p"].timeline, keeper.leases["p"].timeline_known) == (
        '{"gates": []}', True)
    assert not keeper.leases["q"].timeline_known, "a row read without it: read at the move"
