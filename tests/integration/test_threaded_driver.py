"""The worker-thread driver adaptation that runs SQL Server's pymssql, exercised live.

No SQL Server runs in CI, so :mod:`watcher.threaded_driver` is checked here with
another synchronous driver, PyMySQL, against the MariaDB test server: the same
adaptation, a real network driver, every store method. What this does not
check is pymssql and SQL Server themselves (compiled SQL only, see
``tests/unit/test_dialects.py``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.mysql.pymysql import MySQLDialect_pymysql
from sqlalchemy.ext.asyncio import create_async_engine

from tests.conftest import MARIADB_URL, require_mariadb
from tests.support.scenario import drive_every_method
from watcher.database import MYSQL_ISOLATION_LEVEL
from watcher.dburl import parse_database_url
from watcher.drivers import Driver
from watcher.migrate import downgrade, upgrade
from watcher.records import LeaseRow
from watcher.schema import tables_for
from watcher.store import Store
from watcher.threaded_driver import ThreadedDialect

pytestmark = pytest.mark.mariadb


class MySQLDialectThreaded_pymysql(ThreadedDialect, MySQLDialect_pymysql):
    """PyMySQL through the worker-thread adaptation (tests only)."""

    sync_dialect = MySQLDialect_pymysql
    driver = "pymysql_threaded"
    supports_statement_cache = True


registry.register("mysql.pymysql_threaded", __name__, "MySQLDialectThreaded_pymysql")


@pytest.fixture
async def threaded_store() -> AsyncIterator[Store]:
    require_mariadb()
    prefix = f"thr{uuid.uuid4().hex[:8]}_"
    upgrade(MARIADB_URL, prefix)
    url = parse_database_url(MARIADB_URL).sync_url.set(drivername="mysql+pymysql_threaded")
    engine = create_async_engine(url, isolation_level=MYSQL_ISOLATION_LEVEL,
                                 pool_size=4, max_overflow=4, pool_pre_ping=True)
    assert isinstance(engine.dialect, MySQLDialectThreaded_pymysql)
    store = Store(engine, tables_for(prefix))
    # SQL Server's driver sends every statement through the engine; so does this one.
    await store.driver.close()
    store.driver = Driver(engine, store.statements)
    try:
        yield store
    finally:
        await store.close()
        downgrade(MARIADB_URL, prefix)


async def test_every_store_method_runs_through_the_threaded_driver(threaded_store) -> None:
    await drive_every_method(threaded_store)
    info = await threaded_store.partition_get("p1")
    # The gate move to 2 was refused (item "b" waits at gate 0); p7 took it instead.
    assert info is not None and info.gate == 0 and info.status == "available"
    moved = await threaded_store.partition_get("p7")
    assert moved is not None and moved.gate == 2
    items = {item.id: item for item in await threaded_store.items_list("p1")}
    assert items["a"].status == "complete" and items["a"].data == b"y"
    assert items["b"].status == "available" and items["b"].attempts == 0  # retried


async def test_races_on_separate_connections_have_one_winner(threaded_store) -> None:
    await threaded_store.partition_create("race", [])
    (row,) = await threaded_store.leases_read_free(1)
    results = await asyncio.gather(*(
        threaded_store.leases_take([row], f"w{n}", 30) for n in range(6)))
    assert sorted(len(won) for won in results) == [0, 0, 0, 0, 0, 1]
    assert await threaded_store.leases_take([LeaseRow("race", row.version, 0, "")], "late",
                                            30) == []


async def test_a_slow_query_does_not_block_the_event_loop(threaded_store) -> None:
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.create_task(tick())
    started = time.monotonic()
    async with threaded_store.engine.connect() as conn:
        await conn.execute(text("SELECT SLEEP(0.5)"))
    ticker.cancel()
    assert time.monotonic() - started >= 0.5
    assert ticks >= 20, "the event loop stalled while the driver waited"


async def test_driver_errors_arrive_as_sqlalchemy_errors(threaded_store) -> None:
    from sqlalchemy.exc import ProgrammingError

    async with threaded_store.engine.connect() as conn:
        with pytest.raises(ProgrammingError):
            await conn.execute(text("SELECT * FROM no_such_table_here"))
        # The connection is still usable afterwards.
        assert (await conn.execute(text("SELECT 1"))).scalar_one() == 1
