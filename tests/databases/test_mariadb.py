"""What is special to MariaDB (and MySQL), on the live test server.

- The batch write's plan finds each item by its primary key even on a table
  filled a moment ago; the direct connections heal after the server ends them;
  a refused value is reported as the engine reports it, parameters hidden.
- The worker-thread driver adaptation that runs SQL Server's pymssql
  (:mod:`watcher.store.drivers.mssql.threaded`), exercised with another synchronous
  driver, PyMySQL: the same adaptation, a real network driver, every store
  method. What this does not check is pymssql and SQL Server themselves
  (compiled SQL only, see ``tests/unit/test_dialects.py``): no SQL Server runs
  in CI.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.mysql.pymysql import MySQLDialect_pymysql
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine

from tests.conftest import MARIADB_URL, require_mariadb
from tests.support.engine import leased_partition, spawning_partition
from tests.support.scenario import drive_every_method
from watcher.records import ItemWrite, LeaseRow, NewItem
from watcher.store import Store
from watcher.store.db.migrate import downgrade, upgrade
from watcher.store.db.urls import parse_database_url
from watcher.store.drivers.base import Driver
from watcher.store.drivers.mssql.threaded import ThreadedDialect
from watcher.store.drivers.mysql.driver import MySQLDriver
from watcher.store.drivers.mysql.engine import ISOLATION_LEVEL as MYSQL_ISOLATION_LEVEL
from watcher.store.drivers.sql import batch_params
from watcher.store.operator.rewind import spawned_reads
from watcher.store.sql.schema import tables_for

OWNER = "me"


async def _leased(store: Store, partition_id: str, count: int, owner: str = OWNER
                  ) -> dict[str, int]:
    return await leased_partition(store, partition_id, count, owner)


@pytest.fixture
async def mariadb_store() -> Any:
    import uuid

    from tests.conftest import MARIADB_URL, require_mariadb
    from watcher.store.db.migrate import downgrade, upgrade

    require_mariadb()
    prefix = f"f{uuid.uuid4().hex[:8]}_"
    upgrade(MARIADB_URL, prefix)
    store = Store.open(MARIADB_URL, prefix)
    assert isinstance(store.driver, MySQLDriver)
    yield store
    await store.close()
    await asyncio.sleep(0.05)  # let the closed connections go before the tables do
    downgrade(MARIADB_URL, prefix)


async def _explain(store: Store, statement: Any, params: dict[str, Any]) -> list[dict[str, Any]]:
    direct = store.driver.direct
    compiled = direct._compiled[statement]
    conn = await direct._connect(False)
    try:
        async with conn.cursor() as cursor:
            await cursor.execute("EXPLAIN " + compiled.sql, compiled.values(params))
            names = [column[0] for column in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in await cursor.fetchall()]
    finally:
        conn.close()


@pytest.mark.mariadb
async def test_mariadb_batch_write_finds_each_item_by_its_primary_key(mariadb_store) -> None:
    store = mariadb_store
    for number in range(20):  # a freshly filled table: no statistics yet
        await store.partition_create(f"p{number:02}", [NewItem(f"i{n:04}", b"x")
                                                       for n in range(500)])
    await store.leases_take(await store.leases_read_free(20), OWNER, 60.0)
    ready = await store.items_ready("p07", 0, 64)
    writes = [ItemWrite("p07", item.id, item.version, "complete", 0, attempts=1)
              for item in ready]
    plan = await _explain(store, store.driver.batch_statement,
                          batch_params(writes, OWNER))
    by_table = {row["table"]: row for row in plan}
    items, partitions = store.tables.items.name, store.tables.partitions.name
    assert plan[0]["table"] == "v", plan  # the JSON rows first
    assert (by_table[items]["type"], by_table[items]["key"]) == ("eq_ref", "PRIMARY"), plan
    assert (by_table[partitions]["type"], by_table[partitions]["key"]) == (
        "eq_ref", "PRIMARY"), plan


@pytest.mark.mariadb
async def test_mariadb_rewind_reads_spawned_items_through_their_index(mariadb_store) -> None:
    """A rewind's reads of a partition's spawned items (those items spawned, and those a
    reduce spawned) are ranges of ix_items_spawned: the partition's thousands of
    completed items are not read."""
    store = mariadb_store
    await spawning_partition(store, "big", 3000, OWNER)
    for statement in spawned_reads(store.tables, "big", 0):
        sql = str(statement.compile(dialect=store.engine.dialect,
                                    compile_kwargs={"literal_binds": True}))
        async with store.engine.connect() as conn:
            result = await conn.exec_driver_sql("EXPLAIN " + sql)
            plan = [dict(row._mapping) for row in result]
        [row] = plan
        assert (row["type"], row["key"]) == (
            "range", f"{store.tables.prefix}ix_items_spawned"), plan
        assert int(row["rows"]) <= 10, plan


@pytest.mark.mariadb
async def test_mariadb_direct_connections_heal_after_the_server_ends_them(mariadb_store
                                                                          ) -> None:
    store = mariadb_store
    seen = await _leased(store, "p", 2)
    direct = store.driver.direct
    await store.items_apply([ItemWrite("p", "i0", seen["i0"], "complete", 0, attempts=1)],
                            OWNER)
    ids = [conn.thread_id() for pool in direct._pools.values() for conn in pool._idle]
    assert len(ids) == 2  # one that reads, one that writes
    async with store.engine.connect() as conn:
        for thread_id in ids:
            await conn.execute(text(f"KILL {int(thread_id)}"))
    await asyncio.sleep(0.1)
    assert [item.id for item in await store.items_ready("p", 0, 10)] == ["i1"]
    assert await store.items_apply(
        [ItemWrite("p", "i1", seen["i1"], "complete", 0, attempts=1)], OWNER) == [True]
    assert not {conn.thread_id() for pool in direct._pools.values()
                for conn in pool._idle} & set(ids)


@pytest.mark.mariadb
async def test_mariadb_a_refused_value_fails_like_the_engine_with_parameters_hidden(
        mariadb_store) -> None:
    store = mariadb_store
    seen = await _leased(store, "p", 2)
    secret = "secret-error-text"
    writes = [ItemWrite("p", "i0", seen["i0"], "available", 2**40, attempts=1,
                        last_error=secret),  # a gate beyond the INT column
              ItemWrite("p", "i1", seen["i1"], "complete", 0, attempts=1)]
    with pytest.raises(DBAPIError) as caught:
        await store.items_apply(writes, OWNER)
    assert store.driver.refuses_value(caught.value)
    assert not store.driver.lost_connection(caught.value)
    assert secret not in str(caught.value)
    assert [item.status for item in await store.items_list("p")] == ["available"] * 2
    # The connection that failed is still good.
    assert await store.items_apply(writes[1:], OWNER) == [True]


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


@pytest.mark.mariadb
async def test_mariadb_write_is_followed_only_where_it_matched_in_one_transaction(
        mariadb_store) -> None:
    """A gate move and its timeline in one direct transaction: the first follower that
    matches is the last run (an update, else an insert), and nothing follows a move
    that missed."""
    from sqlalchemy import Column, Integer, MetaData, String, Table, bindparam, insert, update

    store = mariadb_store
    names = MetaData()
    p = Table(f"{store.tables.prefix}fp", names, Column("id", String(8), primary_key=True),
              Column("version", Integer))
    t = Table(f"{store.tables.prefix}ft", names, Column("id", String(8), primary_key=True),
              Column("text", String(16)))
    async with store.engine.begin() as conn:
        await conn.run_sync(names.create_all)
        await conn.execute(insert(p), [{"id": pid, "version": 1} for pid in "abc"])
        await conn.execute(insert(t), [{"id": "a", "text": "old"}])
    move = (update(p).where(p.c.id == bindparam("pid"), p.c.version == bindparam("seen"))
            .values(version=p.c.version + 1))
    set_one = update(t).where(t.c.id == bindparam("tid")).values(text=bindparam("text"))
    add_one = insert(t).values(id=bindparam("tid"), text=bindparam("text"))

    async def moved(pid: str, seen: int) -> int:
        row = {"tid": pid, "text": f"{pid}-new"}
        return await store.driver.execute_followed(
            move, {"pid": pid, "seen": seen}, ((set_one, row), (add_one, row)))

    try:
        # a: its row in t is updated; b: it has none, so it is inserted; c: the move
        # misses (a stale version), so nothing follows it.
        assert [await moved("a", 1), await moved("b", 1), await moved("c", 7)] == [1, 1, 0]
        async with store.engine.connect() as conn:
            texts = dict((await conn.execute(t.select())).all())
            versions = dict((await conn.execute(p.select())).all())
        assert texts == {"a": "a-new", "b": "b-new"}
        assert versions == {"a": 2, "b": 2, "c": 1}
    finally:
        async with store.engine.begin() as conn:
            await conn.run_sync(names.drop_all)
