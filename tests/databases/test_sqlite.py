"""What is special to SQLite, on a real file.

- The hot connection never waits inside SQLite on the event loop's thread: it
  pauses between tries while another connection holds the write lock, reads
  meanwhile (WAL), gives up after the busy timeout, commits with
  ``synchronous=NORMAL`` (the engine with FULL) and checkpoints in a thread; a
  refused value fails as the engine's would.
- A database file deleted or replaced under a running store is noticed
  (readiness problem, one ERROR line, nothing more written to the orphan file),
  and the write-ahead log stays bounded behind readers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, OperationalError

from tests.support.engine import leased_partition, spawning_partition
from watcher.records import ItemWrite, NewItem
from watcher.store import Store
from watcher.store.db.migrate import upgrade
from watcher.store.drivers.sqlite import checkpoints as sqlite_checkpoints
from watcher.store.drivers.sqlite import direct as sqlite_direct
from watcher.store.drivers.sqlite.driver import SQLiteDriver
from watcher.store.drivers.sqlite.engine import BUSY_TIMEOUT_SECONDS
from watcher.store.operator.rewind import spawned_reads

OWNER = "me"


async def _leased(store: Store, partition_id: str, count: int, owner: str = OWNER
                  ) -> dict[str, int]:
    return await leased_partition(store, partition_id, count, owner)


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    from watcher.store.db.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'fast.db'}"
    upgrade(url)
    return url


@pytest.fixture
async def hot_store(sqlite_url: str) -> Any:
    store = Store.open(sqlite_url)
    assert isinstance(store.driver, SQLiteDriver)
    yield store
    await store.close()


def _hold_write_lock(url: str) -> sqlite3.Connection:
    conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    return conn


class LoopTicks:
    """Counts the event loop's turns, and the longest gap between two, while it runs
    (``async with``)."""

    def __init__(self) -> None:
        self.turns = 0
        self.longest = 0.0
        self._done = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        last = time.monotonic()
        while not self._done.is_set():
            await asyncio.sleep(0.001)
            now = time.monotonic()
            self.turns += 1
            self.longest, last = max(self.longest, now - last), now

    async def __aenter__(self) -> LoopTicks:
        self._task = asyncio.create_task(self._tick())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._done.set()
        assert self._task is not None
        await self._task


# How long the test holds SQLite's write lock while a store write waits for it.
LOCK_HELD = 1.0


async def test_sqlite_writes_wait_for_another_writer_without_blocking_the_loop(
        hot_store: Store, sqlite_url: str) -> None:
    """While another connection holds the write lock, a store write waits for it with
    the event loop free: reads answer, the loop keeps turning (a write that waited in
    the loop's thread would stop it for the whole hold), and the write goes through
    once the lock is released."""
    store = hot_store
    seen = await _leased(store, "p", 3)
    other = _hold_write_lock(sqlite_url)
    async with LoopTicks() as ticks:
        write = asyncio.ensure_future(store.items_apply(
            [ItemWrite("p", "i0", seen["i0"], "complete", 0, attempts=1)], OWNER))
        try:
            # Readers never wait on the writer: the read answers while the lock is held
            # (its deadline guards against a hang, it is no speed goal).
            ready = await asyncio.wait_for(store.items_ready("p", 0, 10),
                                           timeout=BUSY_TIMEOUT_SECONDS / 4)
            assert [item.id for item in ready] == ["i0", "i1", "i2"]
            await asyncio.sleep(LOCK_HELD)  # the lock stays held this long
            assert not write.done(), "the write went through while another writer held it"
        finally:
            other.execute("COMMIT")
            other.close()
        applied = await write
    assert applied == [True]
    # A loop blocked by the waiting write would not turn for the whole hold; a free one
    # turns about once a millisecond (a loaded machine's scheduling makes it fewer, and
    # its pauses shorter than the hold by far).
    assert ticks.turns >= 10, ticks.turns
    assert ticks.longest < LOCK_HELD, f"the event loop stalled {ticks.longest:.3f} s"


async def test_sqlite_writes_give_up_after_the_busy_timeout(
        hot_store: Store, sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = hot_store
    seen = await _leased(store, "p", 1)
    busy_timeout = 0.3
    monkeypatch.setattr(store.driver.direct, "_busy_timeout", busy_timeout)
    write = ItemWrite("p", "i0", seen["i0"], "complete", 0, attempts=1)
    other = _hold_write_lock(sqlite_url)
    started = time.monotonic()
    try:
        with pytest.raises(OperationalError, match="database is locked"):
            await store.items_apply([write], OWNER)
    finally:
        other.execute("ROLLBACK")
        other.close()
    # It waited the busy timeout it was given, and gave up long before the default one
    # (a bound on which timeout applied, not on speed: a loaded machine meets it).
    waited = time.monotonic() - started
    assert busy_timeout <= waited < BUSY_TIMEOUT_SECONDS / 4, waited
    assert await store.items_apply([write], OWNER) == [True]


async def test_sqlite_sync_levels(hot_store: Store) -> None:
    """Engine writes (clients, leases) sync every commit; result writes sync at
    checkpoints, and the hot connection leaves checkpoints to a thread."""
    store = hot_store
    async with store.engine.connect() as conn:
        assert (await conn.execute(text("PRAGMA synchronous"))).scalar_one() == 2  # FULL
        assert (await conn.execute(text("PRAGMA journal_mode"))).scalar_one() == "wal"
    await store.items_ready("absent", 0, 1)
    hot = store.driver.direct._conn
    assert hot is not None
    assert hot.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL
    assert hot.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)


async def test_sqlite_gate_moves_and_closes_are_answered_once_the_log_is_on_disk(
        hot_store: Store, sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A gate move or a close is one statement on the driver's own connection, which stays
    at NORMAL; after its commit the write-ahead log is synced to disk in a worker thread
    (and with it every result write before it), and only then does the caller hear
    back, so the watcher never acts on a move a power loss could undo."""
    store = hot_store
    await _leased(store, "p", 1)
    hot = store.driver.direct._conn
    assert hot is not None
    loop_thread = threading.get_ident()
    path = sqlite_url.removeprefix("sqlite:///")
    syncs: list[tuple[str, bool, tuple[Any, ...]]] = []
    answered: list[int | None] = []
    real_sync = sqlite_direct.sync_log

    def recorded(wal_path: str) -> None:
        # What another connection reads as the sync starts: the write is committed.
        reader = sqlite3.connect(path)
        try:
            row = reader.execute("SELECT gate, status FROM partitions WHERE id = 'p'").fetchone()
        finally:
            reader.close()
        syncs.append((wal_path, threading.get_ident() != loop_thread, (len(answered), *row)))
        real_sync(wal_path)

    monkeypatch.setattr(sqlite_direct, "sync_log", recorded)
    sent: list[str] = []
    hot.set_trace_callback(sent.append)
    try:
        answered.append(await store.partition_transition("p", 2, OWNER, gate=3))
        answered.append(await store.partition_transition("p", 3, OWNER, status="complete"))
    finally:
        hot.set_trace_callback(None)
    assert answered == [3, 4]
    assert [sql for sql in sent if "synchronous" in sql] == []  # no pragma switching
    assert syncs == [(f"{path}-wal", True, (0, 3, "available")),
                     (f"{path}-wal", True, (1, 3, "complete"))]
    assert hot.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL
    info = await store.partition_get("p")
    assert info is not None and info.status == "complete" and info.gate == 3


async def test_sqlite_a_failed_log_sync_fails_the_move_with_a_database_error(
        hot_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A log the disk would not sync fails the gate move as the database's error (which the
    watcher retries), not as a stray OSError; the move itself was committed."""
    store = hot_store
    await _leased(store, "p", 1)

    def failing(wal_path: str) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(sqlite_direct, "sync_log", failing)
    with pytest.raises(DBAPIError, match="could not sync the log to disk"):
        await store.partition_transition("p", 2, OWNER, gate=3)
    info = await store.partition_get("p")
    assert info is not None and info.gate == 3


async def test_sqlite_checkpoints_run_in_a_worker_thread(
        hot_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    store = hot_store
    threads: list[int] = []
    direct = store.driver.direct
    run_checkpoint = direct._checkpoints.run

    def recorded(truncate: bool) -> None:
        threads.append(threading.get_ident())
        run_checkpoint(truncate)

    monkeypatch.setattr(sqlite_checkpoints, "CHECKPOINT_EVERY", 2)
    monkeypatch.setattr(direct._checkpoints, "run", recorded)
    seen = await _leased(store, "p", 2)
    for item_id, version in seen.items():
        assert await store.items_apply(
            [ItemWrite("p", item_id, version, "complete", 0, attempts=1)], OWNER) == [True]
    assert direct._checkpoints.running is not None
    await direct._checkpoints.running
    assert threads and threads[0] != threading.get_ident()
    assert [item.status for item in await store.items_list("p")] == ["complete", "complete"]


async def test_sqlite_a_refused_value_fails_like_the_engine(hot_store: Store) -> None:
    """A value SQLite refuses (NULL into a NOT NULL column) is a refusal, not an outage,
    and the batch writes nothing."""
    store = hot_store
    seen = await _leased(store, "p", 2)
    good = ItemWrite("p", "i0", seen["i0"], "complete", 0, attempts=1)
    bad = ItemWrite("p", "i1", seen["i1"], None, 0, attempts=1)  # type: ignore[arg-type]
    with pytest.raises(DBAPIError) as caught:
        await store.items_apply([good, bad], OWNER)
    assert store.driver.refuses_value(caught.value)
    assert [item.status for item in await store.items_list("p")] == ["available"] * 2


PREFIX = "t_"


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[tuple[Store, Path]]:
    path = tmp_path / "statefeed.db"
    upgrade(f"sqlite:///{path}", PREFIX)
    store = Store.open(f"sqlite:///{path}", PREFIX)
    yield store, path
    await store.close()


async def _lease(store: Store, items: int = 1, data: bytes = b"1") -> None:
    await store.partition_create("p", [NewItem(f"i{n:05d}", data) for n in range(items)])
    [_] = await store.leases_take(await store.leases_read_free(5), "w", 60)


async def _complete_one(store: Store) -> list[bool]:
    [item, *_] = await store.items_ready("p", 0, 1)
    return await store.items_apply([ItemWrite("p", item.id, item.version, "complete", 0, 1)],
                                   "w")


async def test_a_deleted_database_file_is_noticed_and_not_written(
        sqlite_store, caplog: pytest.LogCaptureFixture) -> None:
    store, path = sqlite_store
    await _lease(store, items=3)
    assert await _complete_one(store) == [True]
    assert store.problem() is None
    caplog.set_level(logging.ERROR)
    path.unlink()
    problem = store.problem()
    assert problem is not None and str(path) in problem and "deleted" in problem
    with pytest.raises(OperationalError, match="deleted"):  # the direct path
        await store.items_ready("p", 0, 10)
    with pytest.raises(OperationalError, match="deleted"):  # the engine path
        await store.partition_state("p")
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "action=database_file_lost" in errors[0], errors
    assert str(path) in errors[0]


def _contents(path: Path) -> tuple[bytes, bytes]:
    """The bytes of the database's log and of its main file."""
    return Path(f"{path}-wal").read_bytes(), path.read_bytes()


async def test_a_replaced_database_file_is_noticed_and_the_new_one_left_alone(
        sqlite_store, tmp_path: Path) -> None:
    store, path = sqlite_store
    await _lease(store, items=3)
    assert await _complete_one(store) == [True]
    other = tmp_path / "restored.db"
    upgrade(f"sqlite:///{other}", PREFIX)
    os.replace(other, path)
    # The log beside the path is still the one the store's connections write to.
    log_before, main_before = _contents(path)
    problem = store.problem()
    assert problem is not None and "replaced" in problem
    with pytest.raises(OperationalError, match="replaced"):
        await _complete_one(store)
    with pytest.raises(OperationalError, match="replaced"):
        await store.ping()
    log_after, main_after = _contents(path)
    assert log_after == log_before, "a write went on after the swap"
    assert main_after == main_before, "the processor wrote into the new file"


async def test_a_file_moved_away_and_back_is_used_again(sqlite_store) -> None:
    store, path = sqlite_store
    await _lease(store, items=3)
    moved = path.with_suffix(".moved")
    path.rename(moved)
    assert store.problem() is not None
    with pytest.raises(OperationalError):
        await _complete_one(store)
    moved.rename(path)
    assert store.problem() is None
    assert await _complete_one(store) == [True]


def _wal_size(path: Path) -> int:
    wal = Path(f"{path}-wal")
    return wal.stat().st_size if wal.exists() else 0


async def _rewrite_all(store: Store, data: bytes) -> None:
    """Write every ready item again (still available, new data): one batch of writes."""
    ready = await store.items_ready("p", 0, 1000)
    writes = [ItemWrite("p", item.id, item.version, "available", 0, 0, data=data)
              for item in ready]
    assert all(await store.items_apply(writes, "w"))


async def test_the_wal_stays_bounded_behind_readers_that_never_stop(
        sqlite_store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Readers that overlap one another (a dashboard, a second process polling) keep
    passive checkpoints from ever resetting the log; the TRUNCATE checkpoint past the
    limit waits for a gap between reads and empties it."""
    limit = 1024 * 1024
    monkeypatch.setattr(sqlite_checkpoints, "WAL_SIZE_LIMIT", limit)
    store, path = sqlite_store
    data = os.urandom(2048)
    await _lease(store, items=50, data=data)
    stop = threading.Event()

    def reader(offset: float) -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            while not stop.is_set():
                conn.execute("BEGIN")
                conn.execute(f"SELECT count(*) FROM {PREFIX}items").fetchone()
                stop.wait(0.02 + offset)
                conn.execute("COMMIT")
        finally:
            conn.close()

    threads = [threading.Thread(target=reader, args=(n * 0.007,)) for n in range(3)]
    for thread in threads:
        thread.start()
    largest = 0
    try:
        for _ in range(600):
            await _rewrite_all(store, data)
            largest = max(largest, _wal_size(path))
            await asyncio.sleep(0)  # let a checkpoint's thread report back
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    # 600 batches of 50 items of 2 KiB: over 100 MiB went through the log.
    assert largest < 6 * limit, f"the WAL grew to {largest} bytes (limit {limit})"


async def test_the_wal_is_emptied_once_a_long_reader_ends(
        sqlite_store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that holds one snapshot pins every frame written after it: nothing can
    reset the log meanwhile. Once it ends, the next checkpoint cuts the log back."""
    limit = 256 * 1024
    monkeypatch.setattr(sqlite_checkpoints, "WAL_SIZE_LIMIT", limit)
    store, path = sqlite_store
    data = os.urandom(2048)
    await _lease(store, items=100, data=data)
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute(f"SELECT count(*) FROM {PREFIX}items").fetchone()
    for _ in range(40):
        await _rewrite_all(store, data)
    grown = _wal_size(path)
    assert grown > 4 * limit, grown
    reader.execute("COMMIT")
    reader.close()
    for _ in range(2 * sqlite_checkpoints.CHECKPOINT_EVERY):
        await _rewrite_all(store, data)
        await asyncio.sleep(0)  # let a checkpoint's thread report back
    # Cut back, then grown by at most the few batches between two looks at its size.
    assert _wal_size(path) < min(grown / 4, 8 * limit), f"{_wal_size(path)} after {grown}"


async def test_sqlite_closes_made_together_share_one_synced_commit(
        hot_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Five partitions close in one turn of the loop: one transaction and one synced
    commit writes all five, each close still guarded by its own version (a stale one
    loses alone), and each caller gets its own answer."""
    store = hot_store
    direct = store.driver.direct
    groups: list[int] = []
    write_synced = direct._shared._write_group

    async def recorded(writes: Any) -> Any:
        groups.append(len(writes))
        return await write_synced(writes)

    monkeypatch.setattr(direct._shared, "_write_group", recorded)
    for n in range(5):
        await leased_partition(store, f"p{n}", 1, OWNER)
    versions = {n: (await store.partition_get(f"p{n}")).version for n in range(5)}
    versions[3] -= 1  # a holder that missed a write: its close must lose
    closed = await asyncio.gather(*(
        store.partition_transition(f"p{n}", versions[n], OWNER, status="complete")
        for n in range(5)))
    assert groups == [5]
    assert closed == [versions[0] + 1, versions[1] + 1, versions[2] + 1, None,
                      versions[4] + 1]
    statuses = [(await store.partition_get(f"p{n}")).status for n in range(5)]
    assert statuses == ["complete", "complete", "complete", "available", "complete"]


async def test_sqlite_a_refused_write_in_a_shared_commit_fails_alone(
        hot_store: Store) -> None:
    """One write of a group that SQLite refuses (NULL into a NOT NULL column) fails its
    own caller; the group is written again one by one, so its neighbours still land."""
    from sqlalchemy import bindparam, update

    store = hot_store
    direct = store.driver.direct
    partitions = store.tables.partitions
    for n in range(3):
        await leased_partition(store, f"p{n}", 1, OWNER)
    statement = update(partitions).where(partitions.c.id == bindparam("pid")).values(
        status=bindparam("new_status"))
    outcomes = await asyncio.gather(*(
        direct.execute(statement, {"pid": f"p{n}", "new_status": None if n == 1 else "paused"},
                       synced=True) for n in range(3)), return_exceptions=True)
    assert outcomes[0] == 1 and outcomes[2] == 1
    assert isinstance(outcomes[1], DBAPIError) and "NOT NULL" in str(outcomes[1])
    statuses = [(await store.partition_get(f"p{n}")).status for n in range(3)]
    assert statuses == ["paused", "available", "paused"]


def test_machine_now_is_written_as_sqlite_stores_times() -> None:
    """The hot path's clock text sorts and compares with the times SQLite writes
    (``strftime('%Y-%m-%d %H:%M:%f')`` style, microseconds always present)."""
    text = sqlite_direct.machine_now()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}", text), text
    parsed = datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC)
    assert abs((datetime.now(UTC) - parsed).total_seconds()) < 5


async def test_sqlite_reads_free_partitions_in_queue_order_without_sorting_them_all(
        hot_store: Store) -> None:
    """The lease cycle's free read walks the queue's index (status, rank_at, id) and stops
    at its limit. SQLite's planner, with no statistics, would otherwise take the range on
    (status, until) and sort every free partition before the limit: 14 ms a read with
    20,000 waiting, on the event loop's thread. Without id in the index it sorted the
    partitions at one place in the queue (the right part of the order): 11 ms a read
    with 10,000 of them."""
    store = hot_store
    statement = store.lease_statements.free(64)
    direct = store.driver.direct
    compiled = direct.compiled(statement)
    conn = direct._connection()
    plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + compiled.sql,
                                           direct.values(statement, {}))]
    assert any("ix_partitions_rank" in step for step in plan), plan
    assert not any("TEMP B-TREE" in step for step in plan), plan


async def test_sqlite_rewind_reads_spawned_items_through_their_index(hot_store: Store) -> None:
    """A rewind's reads of a partition's spawned items (those items spawned, and those a
    reduce spawned) are ranges of ix_items_spawned, with no statistics: the partition's
    thousands of completed items are not read."""
    store = hot_store
    await spawning_partition(store, "big", 3000, OWNER)
    for statement in spawned_reads(store.tables, "big", 0):
        sql = str(statement.compile(dialect=store.engine.dialect,
                                    compile_kwargs={"literal_binds": True}))
        async with store.engine.connect() as conn:
            plan = [row[3] for row in await conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql)]
        assert len(plan) == 1 and "USING INDEX" in plan[0], plan
        assert f"{store.tables.prefix}ix_items_spawned (partition_id=? AND parent" in plan[0], plan
