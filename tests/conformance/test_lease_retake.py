"""A processor taking again a partition it believes it still holds: its own lease that
expired goes on as the same lease; a lease someone else ended (a rewind) is lost, and
the partition starts afresh under a new one."""

from __future__ import annotations

from sqlalchemy import update

from watcher.config import WatcherConfig
from watcher.hooks import Hooks
from watcher.leasing.keeper import LeaseKeeper
from watcher.records import NewItem
from watcher.store import Store

CONFIG = WatcherConfig(owner_id="me", lease_duration=30)  # renews every 10 s: not in a test


async def _keeper_holding_p(store: Store) -> LeaseKeeper:
    await store.partition_create("p", [NewItem("a", b"x"), NewItem("b", b"x")])
    keeper = LeaseKeeper(store, CONFIG, Hooks())
    assert (await keeper.run_once()).acquired == ("p",)
    return keeper


async def test_an_own_lease_that_expired_is_taken_again_as_the_same_lease(store: Store) -> None:
    keeper = await _keeper_holding_p(store)
    held = keeper.leases["p"]
    p = store.tables.partitions
    async with store.engine.begin() as conn:  # expired by the database's clock, still ours
        await conn.execute(update(p).where(p.c.id == "p").values(until=store.statements.now))

    cycle = await keeper.run_once()

    assert cycle.acquired == (), "not a new lease: the supervisor's goes on"
    assert keeper.leases["p"] is held and not held.lost
    assert held.version == (await store.partition_get("p")).version


async def test_a_lease_a_rewind_ended_is_lost_and_the_partition_taken_afresh(
        store: Store) -> None:
    keeper = await _keeper_holding_p(store)
    held = keeper.leases["p"]
    await store.partition_rewind("p", 0)  # ends the lease: owner "", until now

    cycle = await keeper.run_once()

    assert cycle.acquired == ("p",)
    assert held.lost and held.ended.is_set(), "the old supervisor must stop"
    fresh = keeper.leases["p"]
    assert fresh is not held and not fresh.lost
    info = await store.partition_get("p")
    assert (info.owner, info.version, fresh.version) == ("me", fresh.version, info.version)
