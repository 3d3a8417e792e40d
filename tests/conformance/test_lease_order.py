"""The lease queue is first come, first served for unkeyed partitions: a fresh processor's
first lease batch takes the oldest partitions, in creation order, whatever their ids,
and partitions created within one tick of the database clock keep their order."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime

import pytest

from watcher.config import WatcherConfig
from watcher.hooks import Hooks
from watcher.leasing.keeper import LeaseKeeper
from watcher.models import COMPLETE
from watcher.records import NewItem
from watcher.store import Store
from watcher.store.db.clock import FixedClock

# Ids whose sorted order is not their creation order.
CREATED = ["u0-7", "u0-2", "b", "u0-10", "a", "z9", "u0-1", "m"]


async def _create_all(store: Store) -> None:
    for partition_id in CREATED:
        await store.partition_create(partition_id, [NewItem("i", b"x")])


def _keeper(store: Store, max_leases: int) -> LeaseKeeper:
    return LeaseKeeper(store, WatcherConfig(owner_id="fresh", max_leases=max_leases,
                                            lease_batch=max_leases), Hooks())


@pytest.mark.parametrize("max_leases", [1, 2, 4])
async def test_a_fresh_processor_takes_the_oldest_partitions(store: Store,
                                                             max_leases: int) -> None:
    await _create_all(store)
    cycle = await _keeper(store, max_leases).run_once()
    assert sorted(cycle.acquired) == sorted(CREATED[:max_leases])


@pytest.mark.parametrize("clocked", [False, True], ids=["database-clock", "one-tick"])
async def test_one_lease_at_a_time_follows_creation_order(
        make_store: Callable[..., Store], clocked: bool) -> None:
    """With the clock standing still every partition is created in the same tick: the
    order is still the creation order, not the ids'."""
    store = make_store(clock=FixedClock(datetime(2030, 1, 1, 12)) if clocked else None)
    await _create_all(store)
    keeper = _keeper(store, 1)
    taken: list[str] = []
    for _ in CREATED:
        (partition_id,) = (await keeper.run_once()).acquired
        taken.append(partition_id)
        lease = keeper.leases[partition_id]
        assert await store.partition_transition(partition_id, lease.version, "fresh",
                                                status=COMPLETE) is not None
        keeper.forget(lease)
    assert taken == CREATED


async def test_processors_scanning_at_once_take_from_the_head_of_the_queue(
        make_store: Callable[..., Store]) -> None:
    """Two fresh processors read the head of the queue at the same moment: between them
    they take the oldest partitions, each at least one, and none twice; the one that
    loses a race for a partition takes the next in line instead."""
    store = make_store()
    await _create_all(store)
    assert [row.id for row in await store.leases_read_free(8)] == CREATED
    first = _keeper(store, 2)
    second = LeaseKeeper(make_store(), WatcherConfig(owner_id="second", max_leases=2,
                                                     lease_batch=2), Hooks())
    one, two = await asyncio.gather(first.run_once(), second.run_once())
    assert one.acquired and two.acquired and not set(one.acquired) & set(two.acquired)
    taken = set(one.acquired) | set(two.acquired)
    assert set(CREATED[:2]) <= taken <= set(CREATED[:4])
