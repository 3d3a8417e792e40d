"""SQLite's engine settings: WAL, ``BEGIN IMMEDIATE``, the busy timeout, FULL sync.

The file runs in WAL mode and every transaction starts with ``BEGIN IMMEDIATE``
(reads marked ``sqlite_read`` use a plain ``BEGIN``), so that two writers queue
on the busy timeout instead of failing when a read lock is upgraded. Commits
are synced to disk (``synchronous=FULL``): what the engine writes (a client's
partitions and items, leases) survives a power loss once acknowledged. (The
driver's own connection writes item results with cheaper commits, and gate moves
and closes with synced ones: see :mod:`.direct`.)
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import await_only

from watcher.store.db.urls import DatabaseURL

BUSY_TIMEOUT_SECONDS = 30.0
SYNCHRONOUS = "FULL"


def engine_options(url: DatabaseURL, timeout: float) -> dict[str, Any]:
    """``create_async_engine``'s options for SQLite (``timeout`` is not used: SQLite
    bounds its own waits with the busy timeout)."""
    return {"connect_args": {"timeout": BUSY_TIMEOUT_SECONDS}}


def configure(engine: AsyncEngine, timeout: float) -> None:
    """Set the pragmas on each new connection, and start each transaction as above."""

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event decide how transactions start.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_SECONDS * 1000)}")
        _use_write_ahead_log(cursor)
        # In WAL mode NORMAL syncs the log only at checkpoints, so a commit acknowledged
        # just before a power loss could be rolled back; FULL syncs it at every commit.
        cursor.execute(f"PRAGMA synchronous={SYNCHRONOUS}")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        if connection.get_execution_options().get("sqlite_read"):
            connection.exec_driver_sql("BEGIN")
        else:
            connection.exec_driver_sql("BEGIN IMMEDIATE")


def _use_write_ahead_log(cursor: Any) -> None:
    """Put the database file in WAL mode, waiting while another connection writes.

    ``processor migrate`` sets WAL once; then this is a read that finds it set.
    On a file still in rollback-journal mode (migrated by an older release), the
    switch needs an exclusive lock, and SQLite reports "database is locked" at
    once, without its busy wait, while another connection holds a write lock.

    Raises:
        sqlite3.OperationalError: still locked after the busy timeout.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
    pause = 0.005
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() + pause > deadline:
                raise
        # The hook runs inside the async engine's greenlet: wait without blocking the loop.
        await_only(asyncio.sleep(pause))
        pause = min(pause * 2, 0.2)
