"""SQLite under a running store: a database file deleted or replaced is noticed
(readiness problem, one ERROR line, nothing more written to the orphan file), and
the write-ahead log stays bounded behind readers."""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from watcher.drivers import sqlite_direct
from watcher.migrate import upgrade
from watcher.records import ItemWrite, NewItem
from watcher.store import Store

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
    monkeypatch.setattr(sqlite_direct, "WAL_SIZE_LIMIT", limit)
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
    monkeypatch.setattr(sqlite_direct, "WAL_SIZE_LIMIT", limit)
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
    for _ in range(2 * sqlite_direct.CHECKPOINT_EVERY):
        await _rewrite_all(store, data)
        await asyncio.sleep(0)  # let a checkpoint's thread report back
    # Cut back, then grown by at most the few batches between two looks at its size.
    assert _wal_size(path) < min(grown / 4, 8 * limit), f"{_wal_size(path)} after {grown}"
