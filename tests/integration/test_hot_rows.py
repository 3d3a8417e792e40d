"""The hot path's writes to a partition row are HOT updates on PostgreSQL.

A write that changes no indexed column of ``partitions`` (``status``, ``until``,
``owner``, ``updated_at``, ``created_at``, ``id``) adds no index entries, and
PostgreSQL prunes its old row version within the page: no dead tuples for
vacuum to chase. ``add_items`` on an open partition and a gate advance are such
writes; these tests read PostgreSQL's own counters of the table's updates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text

from tests.support.engine import wait_until
from watcher.records import NewItem
from watcher.store import Store

pytestmark = pytest.mark.postgres


@pytest.fixture(params=["postgres"])
def db_url(request: pytest.FixtureRequest) -> str:
    from tests.conftest import POSTGRES_URL, require_postgres

    require_postgres()
    return POSTGRES_URL


async def _updates(store: Store) -> tuple[int, int]:
    """(updates, HOT updates) of the partitions table, as the statistics have them now."""
    async with store.engine.connect() as conn:
        row = (await conn.execute(text(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = :name"),
            {"name": store.tables.partitions.name})).one()
    return int(row[0]), int(row[1])


async def _counted(store: Store, writes: Callable[[], Any], expected: int, *,
                   setup: int) -> tuple[int, int]:
    """Run ``writes`` (``expected`` partition updates) on a table that has seen
    ``setup`` updates before; return the (updates, HOT updates) they made.

    Each session reports its counters when it goes idle (at most once a second),
    so the counts are awaited until every update has arrived.
    """
    async def settled() -> tuple[int, int] | None:
        now = await _updates(store)
        return now if now[0] >= setup else None

    before = await wait_until(settled, timeout=30, interval=0.2, message="the setup's updates")
    await writes()

    async def arrived() -> tuple[int, int] | None:
        now = await _updates(store)
        delta = (now[0] - before[0], now[1] - before[1])
        return delta if delta[0] >= expected else None

    return await wait_until(arrived, timeout=30, interval=0.2,
                            message=f"{expected} partition updates in pg_stat_user_tables")


async def test_add_items_to_open_partitions_is_a_hot_update(store: Store) -> None:
    ids = [f"p{n}" for n in range(4)]
    for pid in ids:
        await store.partition_create(pid, [NewItem("seed", b"x")])
    await store.leases_take(await store.leases_read_free(10), "me", 30.0)
    calls = 40

    async def add() -> None:
        for call in range(calls):
            await store.items_add(ids[call % len(ids)],
                                  [NewItem(f"i{call}-{n}", b"y") for n in range(10)])

    updates, hot = await _counted(store, add, calls, setup=len(ids))  # the takes
    assert updates == calls
    assert hot == updates, f"{updates - hot} of {updates} add_items updates were not HOT"


async def test_a_gate_advance_is_a_hot_update(store: Store) -> None:
    await store.partition_create("p", [NewItem("a", b"x"), NewItem("b", b"x", gate=5)])
    (lease,) = await store.leases_take(await store.leases_read_free(10), "me", 30.0)
    version = lease.version

    async def advance() -> None:
        nonlocal version
        for gate in range(1, 5):
            new = await store.partition_transition("p", version, "me", gate=gate)
            assert new is not None
            version = new

    updates, hot = await _counted(store, advance, 4, setup=1)  # the take
    assert (updates, hot) == (4, 4)
    assert (await store.partition_get("p")).gate == 4


async def test_partition_pages_keep_room_for_hot_updates(store: Store) -> None:
    """Migration 0005 leaves a fifth of each ``partitions`` page free, so a HOT
    update finds room beside the old row version even on a full table."""
    async with store.engine.connect() as conn:
        options = (await conn.execute(
            text("SELECT reloptions FROM pg_class WHERE relname = :name"),
            {"name": store.tables.partitions.name})).scalar_one()
    assert "fillfactor=80" in (options or [])
