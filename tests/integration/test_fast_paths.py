"""The drivers' own paths on SQLite and MariaDB: what each promises beyond the shared suite.

- Every database: a batch of results is guarded and fenced row by row, whatever
  mix of applied, stale and fenced-off rows it holds (the SQLite and MariaDB
  batches find out which rows failed by rolling back and writing one by one).
- SQLite: the hot connection never waits inside SQLite on the event loop's
  thread: it pauses between tries while another connection holds the write
  lock, reads meanwhile (WAL), gives up after the busy timeout, commits with
  ``synchronous=NORMAL`` (the engine with FULL) and checkpoints in a thread.
- MariaDB: the batch write's plan finds each item by its primary key even on a
  table filled a moment ago; the direct connections heal after the server ends
  them; a refused value is reported as the engine reports it, parameters hidden.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, OperationalError

from watcher.drivers import MySQLDriver, SQLiteDriver, sqlite_direct
from watcher.drivers.sql import batch_params
from watcher.records import ItemWrite, LeaseRow, NewItem
from watcher.store import Store

OWNER = "me"


async def _leased(store: Store, partition_id: str, count: int, owner: str = OWNER
                  ) -> dict[str, int]:
    """Create a partition of ``count`` items leased to ``owner``; item id -> version."""
    await store.partition_create(partition_id, [NewItem(f"i{n}", b"x") for n in range(count)])
    await store.leases_take([LeaseRow(partition_id, 1, 0, "")], owner, 60.0)
    return {row.id: row.version for row in await store.items_ready(partition_id, 0, 1000)}


# -- every database ------------------------------------------------------------


async def test_a_mixed_batch_applies_exactly_the_rows_whose_guards_hold(store: Store) -> None:
    ours = await _leased(store, "p", 4)
    theirs = await _leased(store, "q", 1, owner="other")
    complete = "complete"
    writes = [ItemWrite("p", "i0", ours["i0"], complete, 0, attempts=1),
              ItemWrite("p", "i1", ours["i1"] + 1, complete, 0, attempts=1),  # stale
              ItemWrite("q", "i0", theirs["i0"], complete, 0, attempts=1),  # fenced off
              ItemWrite("p", "i2", ours["i2"], "available", 0, attempts=1, data=b"new",
                        last_error="later", retry_delay=0.5),
              ItemWrite("p", "i2", ours["i2"], complete, 0, attempts=1),  # twice in a batch
              ItemWrite("p", "i3", ours["i3"], complete, 0, attempts=1)]
    assert await store.items_apply(writes, OWNER) == [True, False, False, True, False, True]
    items = {item.id: item for item in await store.items_list("p")}
    assert [items[f"i{n}"].status for n in range(4)] == [
        complete, "available", "available", complete]
    assert (items["i2"].data, items["i2"].last_error) == (b"new", "later")
    assert [item.status for item in await store.items_list("q")] == ["available"]
    # Every guard failing: nothing is written, every write says so.
    assert await store.items_apply(writes[:3], OWNER) == [False, False, False]
    assert (await store.items_list("p"))[0].version == ours["i0"] + 1


# -- SQLite ------------------------------------------------------------------


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    from watcher.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'fast.db'}"
    upgrade(url)
    return url


@pytest.fixture
async def sqlite_store(sqlite_url: str) -> Any:
    store = Store.open(sqlite_url)
    assert isinstance(store.driver, SQLiteDriver)
    yield store
    await store.close()


def _hold_write_lock(url: str) -> sqlite3.Connection:
    conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    return conn


async def _ticks_while(work: Any) -> tuple[Any, float]:
    """Await ``work`` while a task measures the longest gap between event loop turns."""
    longest = 0.0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal longest
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.monotonic()
            longest, last = max(longest, now - last), now

    ticking = asyncio.create_task(ticker())
    try:
        result = await work
    finally:
        done.set()
        await ticking
    return result, longest


async def test_sqlite_writes_wait_for_another_writer_without_blocking_the_loop(
        sqlite_store: Store, sqlite_url: str) -> None:
    store = sqlite_store
    seen = await _leased(store, "p", 3)
    other = _hold_write_lock(sqlite_url)
    write = asyncio.ensure_future(store.items_apply(
        [ItemWrite("p", "i0", seen["i0"], "complete", 0, attempts=1)], OWNER))
    try:
        # Readers never wait on the writer: the hot read answers at once.
        ready = await asyncio.wait_for(store.items_ready("p", 0, 10), timeout=1)
        assert [item.id for item in ready] == ["i0", "i1", "i2"]
        await asyncio.sleep(0.3)
        assert not write.done(), "the write went through while another writer held the lock"
    finally:
        other.execute("COMMIT")
        other.close()
    applied, longest = await _ticks_while(write)
    assert applied == [True]
    assert longest < 0.1, f"the event loop stalled {longest:.3f} s"


async def test_sqlite_writes_give_up_after_the_busy_timeout(
        sqlite_store: Store, sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = sqlite_store
    seen = await _leased(store, "p", 1)
    monkeypatch.setattr(store.driver.direct, "_busy_timeout", 0.3)
    write = ItemWrite("p", "i0", seen["i0"], "complete", 0, attempts=1)
    other = _hold_write_lock(sqlite_url)
    started = time.monotonic()
    try:
        with pytest.raises(OperationalError, match="database is locked"):
            await store.items_apply([write], OWNER)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert 0.3 <= time.monotonic() - started < 2
    assert await store.items_apply([write], OWNER) == [True]


async def test_sqlite_sync_levels(sqlite_store: Store) -> None:
    """Engine writes (clients, leases) sync every commit; result writes sync at
    checkpoints, and the hot connection leaves checkpoints to a thread."""
    store = sqlite_store
    async with store.engine.connect() as conn:
        assert (await conn.execute(text("PRAGMA synchronous"))).scalar_one() == 2  # FULL
        assert (await conn.execute(text("PRAGMA journal_mode"))).scalar_one() == "wal"
    await store.items_ready("absent", 0, 1)
    hot = store.driver.direct._conn
    assert hot is not None
    assert hot.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL
    assert hot.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)


async def test_sqlite_checkpoints_run_in_a_worker_thread(
        sqlite_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    store = sqlite_store
    threads: list[int] = []
    direct = store.driver.direct
    run_checkpoint = direct._run_checkpoint

    def recorded(truncate: bool) -> None:
        threads.append(threading.get_ident())
        run_checkpoint(truncate)

    monkeypatch.setattr(sqlite_direct, "CHECKPOINT_EVERY", 2)
    monkeypatch.setattr(direct, "_run_checkpoint", recorded)
    seen = await _leased(store, "p", 2)
    for item_id, version in seen.items():
        assert await store.items_apply(
            [ItemWrite("p", item_id, version, "complete", 0, attempts=1)], OWNER) == [True]
    assert direct._checkpoint is not None
    await direct._checkpoint
    assert threads and threads[0] != threading.get_ident()
    assert [item.status for item in await store.items_list("p")] == ["complete", "complete"]


async def test_sqlite_a_refused_value_fails_like_the_engine(sqlite_store: Store) -> None:
    """A value SQLite refuses (NULL into a NOT NULL column) is a refusal, not an outage,
    and the batch writes nothing."""
    store = sqlite_store
    seen = await _leased(store, "p", 2)
    good = ItemWrite("p", "i0", seen["i0"], "complete", 0, attempts=1)
    bad = ItemWrite("p", "i1", seen["i1"], None, 0, attempts=1)  # type: ignore[arg-type]
    with pytest.raises(DBAPIError) as caught:
        await store.items_apply([good, bad], OWNER)
    assert store.driver.refuses_value(caught.value)
    assert [item.status for item in await store.items_list("p")] == ["available"] * 2


# -- MariaDB -----------------------------------------------------------------


@pytest.fixture
async def mariadb_store() -> Any:
    import uuid

    from tests.conftest import MARIADB_URL, require_mariadb
    from watcher.migrate import downgrade, upgrade

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
async def test_mariadb_direct_connections_heal_after_the_server_ends_them(mariadb_store
                                                                          ) -> None:
    store = mariadb_store
    seen = await _leased(store, "p", 2)
    direct = store.driver.direct
    await store.items_apply([ItemWrite("p", "i0", seen["i0"], "complete", 0, attempts=1)],
                            OWNER)
    ids = [conn.thread_id() for idle in direct._idle.values() for conn in idle]
    assert len(ids) == 2  # one that reads, one that writes
    async with store.engine.connect() as conn:
        for thread_id in ids:
            await conn.execute(text(f"KILL {int(thread_id)}"))
    await asyncio.sleep(0.1)
    assert [item.id for item in await store.items_ready("p", 0, 10)] == ["i1"]
    assert await store.items_apply(
        [ItemWrite("p", "i1", seen["i1"], "complete", 0, attempts=1)], OWNER) == [True]
    assert not {conn.thread_id() for idle in direct._idle.values() for conn in idle} & set(ids)


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
