"""Synced writes that arrive together share one transaction and its one disk sync.

A gate move or a close on SQLite's hot path is answered only once the log holding
it has reached the disk, so that it survives a power loss. When many small
partitions drain at once, their closes arrive a few at a time, each paying its
own disk sync. :class:`SharedCommits` gathers the writes that arrive in one turn
of the event loop, and those that arrive while a group is being written and
synced, into the next group: one ``BEGIN IMMEDIATE``, each write, one ``COMMIT``,
one sync of the log (:func:`sync_log`, in a worker thread: a disk sync takes
about half a millisecond here, and the event loop goes on with other partitions
meanwhile; on the loop's thread it had taken a quarter of a drain of small
partitions). Each caller still gets its own write's row count. The watcher acts
on a move or a close (the next gate's calls, the close's hooks) only once it
would survive a power loss; another connection may read it in the moment between
its commit and the sync, as it may read a result write before the next sync.

Each write is guarded by itself (a partition's version and holder), so writing
it beside others changes nothing it decides. When the group's transaction fails
for a reason other than a busy lock (the caller retries busy locks as a whole),
each write is run again alone, so that each caller gets its own outcome and one
bad write does not fail its neighbours.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

# One write: its SQL and the parameters to send, and the writes that follow it where it
# matched one row, of which the first that matches a row is the last run.
Followed = tuple[str, dict[str, Any], tuple[tuple[str, dict[str, Any]], ...]]
Write = tuple[str, dict[str, Any]] | Followed
# Runs a group of writes in one transaction; returns, per write, its row count or
# the error that write alone met (see the module docstring).
GroupWriter = Callable[[Sequence[Write]], Awaitable[list["int | BaseException"]]]


def commit_group(conn: sqlite3.Connection, writes: Sequence[Write], *,
                 full_sync: bool = False) -> list[int]:
    """Run ``writes`` on ``conn`` in one transaction; one write alone is one autocommit
    statement. With ``full_sync`` the commit itself syncs the log to disk
    (``synchronous=FULL`` for that commit, ``NORMAL`` again after): for a database
    whose log :func:`sync_log` cannot reach (not in WAL mode). Returns, per write, how
    many rows it matched.

    Raises:
        sqlite3.Error: SQLite failed or refused a write, or another connection
            holds the write lock (then none of them is written).
    """
    if full_sync:
        conn.execute("PRAGMA synchronous=FULL")
    try:
        if len(writes) == 1 and len(writes[0]) == 2:
            return [conn.execute(writes[0][0], writes[0][1]).rowcount]
        conn.execute("BEGIN IMMEDIATE")
        try:
            counts = [_write_in(conn, write) for write in writes]
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return counts
    finally:
        if full_sync:
            conn.execute("PRAGMA synchronous=NORMAL")


def _write_in(conn: sqlite3.Connection, write: Write) -> int:
    """Run ``write`` in ``conn``'s transaction, and where it matched one row, the writes
    that follow it until one matches (see :data:`Write`); returns the write's row count."""
    matched = int(conn.execute(write[0], write[1]).rowcount)
    if matched == 1 and len(write) == 3:
        for sql, values in write[2]:
            if conn.execute(sql, values).rowcount:
                break
    return matched


def sync_log(wal_path: str) -> None:
    """Flush the write-ahead log at ``wal_path`` to disk: every commit logged before the
    call survives a power loss once it returns, as if that commit had run at
    ``synchronous=FULL`` (which syncs the same file). A blocking call, for a worker
    thread.

    The log gets a descriptor of its own, never the database file: closing any
    descriptor of a file drops this process's POSIX locks on it, and SQLite's locks
    live on the database and its ``-shm`` file, not on the log.

    Raises:
        OSError: the log could not be opened or synced.
    """
    fd = os.open(wal_path, os.O_RDWR if os.name == "nt" else os.O_RDONLY)
    try:
        (os.fdatasync if hasattr(os, "fdatasync") else os.fsync)(fd)
    finally:
        os.close(fd)


@dataclass(slots=True)
class _Pending:
    write: Write
    outcome: asyncio.Future[int] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


class SharedCommits:
    """Groups synced writes; ``write_group`` writes each group (see the module docstring)."""

    def __init__(self, write_group: GroupWriter) -> None:
        self._write_group = write_group
        self._waiting: list[_Pending] = []
        self._flushing: asyncio.Task[None] | None = None

    async def execute(self, sql: str, values: dict[str, Any],
                      followers: tuple[tuple[str, dict[str, Any]], ...] = ()) -> int:
        """Write ``sql`` with ``values`` in the next group, and where it matched one row
        ``followers`` after it (see :data:`Write`); returns its row count.

        Cancelled before its group starts, the write is dropped; once its group has
        started, it is written whatever becomes of the caller, as a statement that
        reached the database would be.

        Raises what the group's writer raised for this write.
        """
        pending = _Pending((sql, values, followers) if followers else (sql, values))
        self._waiting.append(pending)
        if self._flushing is None:
            # Started on the loop's next turn: writes made in this one join the group.
            self._flushing = asyncio.create_task(self._flush(), name="sqlite-shared-commits")
        try:
            return await pending.outcome
        except asyncio.CancelledError:
            if pending in self._waiting:
                self._waiting.remove(pending)
            raise

    async def wait_idle(self) -> None:
        """Wait until the groups under way are written (as the store closes)."""
        while self._flushing is not None:
            await asyncio.wait({self._flushing})

    async def _flush(self) -> None:
        try:
            while self._waiting:
                group, self._waiting = self._waiting, []
                try:
                    outcomes = await self._write_group([pending.write for pending in group])
                except BaseException as error:  # the whole group failed alike
                    outcomes = [error] * len(group)
                    if isinstance(error, asyncio.CancelledError):
                        for pending in group:
                            pending.outcome.cancel()
                        raise
                for pending, outcome in zip(group, outcomes, strict=True):
                    if pending.outcome.done():  # its caller was cancelled meanwhile
                        continue
                    if isinstance(outcome, BaseException):
                        pending.outcome.set_exception(outcome)
                    else:
                        pending.outcome.set_result(outcome)
        finally:
            self._flushing = None
