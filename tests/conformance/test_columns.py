"""What the per-database column types and engine settings promise, live on every database.

MySQL and MariaDB differ from PostgreSQL and SQLite in ways that break
statefeed silently unless the schema and the engine say otherwise: DATETIME
drops fractions, BLOB stops at 64 KiB, text compares without case, and
REPEATABLE READ serves stale snapshots. Each test here fails on a plain
default schema or engine.
"""

from __future__ import annotations

import os
from datetime import datetime

import pytest
from sqlalchemy import text

from watcher.records import ItemWrite, NewItem
from watcher.store.db.clock import FixedClock

BIG = 17 * 1024 * 1024  # above the 16 MiB a handler may answer
MYSQL_PACKET_NEEDED = 64 * 1024 * 1024


async def test_times_keep_microseconds(make_store) -> None:
    moment = datetime(2026, 11, 21, 12, 34, 56, 123456)
    store = make_store(clock=FixedClock(moment))
    await store.partition_create("p", [NewItem("i", b"x")])
    info = await store.partition_get("p")
    assert info is not None and info.until == moment and info.created_at == moment
    (item,) = await store.items_list("p")
    assert item.retry_at == moment


async def test_ids_compare_exactly(store) -> None:
    await store.partition_create("Opening-42", [NewItem("Resume-1", b"a"),
                                                NewItem("resume-1", b"b")])
    await store.partition_create("opening-42", [NewItem("résumé-1", b"c")])
    assert [item.id for item in await store.items_list("Opening-42")] == [
        "Resume-1", "resume-1"]
    assert [item.id for item in await store.items_list("opening-42")] == ["résumé-1"]


async def _require_large_packets(store) -> None:
    if store.engine.dialect.name not in ("mysql", "mariadb"):
        return
    async with store.engine.connect() as conn:
        packet = (await conn.execute(text("SELECT @@max_allowed_packet"))).scalar_one()
    if packet < MYSQL_PACKET_NEEDED:
        message = (f"the server's max_allowed_packet is {packet} bytes; statefeed needs "
                   f"{MYSQL_PACKET_NEEDED} (max_allowed_packet = 64M) to store 16 MiB items")
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


async def test_items_over_16_mib_round_trip(store) -> None:
    await _require_large_packets(store)
    first = bytes(range(256)) * (BIG // 256)
    await store.partition_create("p", [NewItem("big", first)])
    (lease,) = await store.leases_take(await store.leases_read_free(5), "me", 30.0)
    (ready,) = await store.items_ready("p", 0, 10)
    assert ready.data == first
    second = first[::-1] + b"!"
    write = ItemWrite("p", "big", ready.version, "available", 1, attempts=0, data=second)
    assert await store.items_apply([write], lease.owner) == [True]
    (item,) = await store.items_list("p")
    assert item.data == second


async def test_mysql_connections_read_committed(store) -> None:
    if store.engine.dialect.name not in ("mysql", "mariadb"):
        pytest.skip("an InnoDB setting")
    async with store.engine.connect() as conn:
        try:  # MariaDB before 11.1 has only tx_isolation; MySQL 8 only transaction_isolation
            level = (await conn.execute(text("SELECT @@tx_isolation"))).scalar_one()
        except Exception:
            await conn.rollback()
            level = (await conn.execute(text("SELECT @@transaction_isolation"))).scalar_one()
    assert level == "READ-COMMITTED"
