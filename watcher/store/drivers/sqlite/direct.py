"""SQLite's hot path: one connection of the driver's own, used from the event loop's thread.

The engine runs SQLite through aiosqlite: every statement is a trip to a
worker thread and back, and the worker needs the interpreter lock again after
every step of SQLite's, which a busy event loop holds for up to the switch
interval (5 ms). That, more than SQLite, set the speed. The ready read, the
gate summary and the batch of result writes take microseconds in SQLite
itself, so this path runs them synchronously on the event loop's thread, on
one ``sqlite3`` connection of its own: no thread, no pool, no greenlet.

Nothing here may block the loop for long, so the connection never waits on a
lock inside SQLite (``busy_timeout`` 0): when another connection holds the
write lock (a lease write of the engine's, another process), the statement
fails at once with SQLITE_BUSY and is tried again after an ``asyncio.sleep``
that grows from 1 ms, until the engine's busy timeout has passed. Reads never
meet that lock (the file is in WAL mode: readers and the writer do not wait on
each other). Checkpoints, which write the database file and sync it, run in a
worker thread on a connection of their own: the hot connection never runs one
(``wal_autocheckpoint=0``; :mod:`.checkpoints`).

SQLite runs in this process, so the database's clock is this machine's: where
the store's clock gives no reading (the database clock), the statements here
get the time read once per statement from Python instead of SQLite computing
``strftime('now')`` for every row it looks at (the same clock, read once).

Durability: the hot connection commits result writes with
``synchronous=NORMAL``. In WAL mode that does not sync the log at each commit,
so after a power loss the last result writes may be gone, and only as a whole:
the log is replayed up to the last commit that reached the disk, which
includes everything committed before any later synced commit (the engine's,
at ``synchronous=FULL``: client writes, leases; and this connection's gate
moves and closes, those made together sharing one:
:meth:`SQLiteDirect.execute` with ``synced``, :mod:`.shared_commits`). A result
write lost that way leaves its item as it was before the call, so the step runs
again; it is never half applied and never applied twice. A gate move or a
close is answered only once its log is on disk, synced in a worker thread
(:mod:`.shared_commits`).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple, TypeVar

from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.sql import ClauseElement

from watcher.store.drivers.compiled import CompiledStatement, StatementCache
from watcher.store.drivers.sql import CLOCK_PARAMETER
from watcher.store.drivers.sqlite.checkpoints import WAL_SIZE_LIMIT, Checkpoints
from watcher.store.drivers.sqlite.files import DatabaseFile
from watcher.store.drivers.sqlite.shared_commits import (
    SharedCommits,
    Write,
    commit_group,
    sync_log,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

# SQLite's primary result codes for "another connection holds the lock".
SQLITE_BUSY = 5
SQLITE_LOCKED = 6
# Pauses between tries while another connection holds the write lock.
FIRST_PAUSE = 0.001
MAX_PAUSE = 0.05
def is_busy(error: BaseException) -> bool:
    """Whether ``error`` says another connection holds a lock SQLite needs."""
    if not isinstance(error, sqlite3.OperationalError):
        return False
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (SQLITE_BUSY, SQLITE_LOCKED)
    return "locked" in str(error)


class Fence(NamedTuple):
    """The lease check a batch of writes needs, made once per lease: ``statement``
    returns a row while a lease holds, with the parameters of each of ``leases``;
    ``of_row`` gives, per row of the batch, the index of its lease."""

    statement: ClauseElement
    leases: Sequence[Mapping[str, Any]]
    of_row: Sequence[int]


class Then(NamedTuple):
    """What a batch of writes stores besides its rows: ``statement``, run with
    ``rows[k]`` (every parameter, as :meth:`SQLiteDirect.values` makes them) for
    each applied row ``k`` of the batch that has an entry."""

    statement: ClauseElement
    rows: Mapping[int, Mapping[str, Any]]


class SQLiteDirect:
    """Runs compiled statements on one ``sqlite3`` connection, from the event loop's thread.

    ``busy_timeout`` is how long a statement keeps trying while another
    connection holds the write lock. ``listeners`` are called with each
    statement's text as it is sent (the benchmark counts statements this way).
    """

    def __init__(self, path: str, dialect: Dialect, *, busy_timeout: float,
                 file: DatabaseFile | None = None) -> None:
        self._path = path
        self._file = file if file is not None else DatabaseFile(path)
        self._dialect = dialect
        self._busy_timeout = busy_timeout
        self._compiled = StatementCache(dialect)
        self._conn: sqlite3.Connection | None = None
        # The write-ahead log a synced write flushes (None: the file is not in WAL
        # mode, and such a write's commit syncs itself).
        self._wal_path: str | None = None
        self._closed = False
        self._checkpoints = Checkpoints(path)
        self._shared = SharedCommits(self._write_synced)
        self.listeners: list[Callable[[str], None]] = []

    def compiled(self, statement: ClauseElement) -> CompiledStatement:
        """``statement`` compiled for this connection (once)."""
        return self._compiled[statement]

    def values(self, statement: ClauseElement, params: Mapping[str, Any]) -> dict[str, Any]:
        """The parameters to send for ``params``, the clock's time read now."""
        compiled = self._compiled[statement]
        values = compiled.values(params)
        if CLOCK_PARAMETER in compiled.live and values[CLOCK_PARAMETER] is None:
            values[CLOCK_PARAMETER] = machine_now()
        return values

    # -- statements -----------------------------------------------------------

    async def fetch(self, statement: ClauseElement, params: Mapping[str, Any]
                    ) -> Sequence[tuple[Any, ...]]:
        """Run one statement (autocommit: a transaction of its own); returns its rows.

        Raises:
            sqlalchemy.exc.DBAPIError: SQLite failed or refused it, or the lock
                stayed taken for the busy timeout.
        """
        compiled = self._compiled[statement]
        values = self.values(statement, params)
        self._sent(compiled.sql)

        def run() -> list[tuple[Any, ...]]:
            self._file.require()
            cursor = self._connection().execute(compiled.sql, values)
            return compiled.rows(cursor.fetchall())

        return await self._retrying(run, compiled.sql)

    async def execute(self, statement: ClauseElement, params: Mapping[str, Any], *,
                      synced: bool = False,
                      then_first_of: Sequence[tuple[Any, Mapping[str, Any]]] = ()) -> int:
        """Run one write statement (autocommit: a transaction of its own); returns how
        many rows it matched. With ``synced`` its commit syncs the log to disk
        (``synchronous=FULL`` for that one commit), and with it every commit before,
        and ``then_first_of`` follow it where it matched one row, in its transaction,
        until one matches a row (``ValueError`` without ``synced``).

        Raises:
            sqlalchemy.exc.DBAPIError: SQLite failed or refused it, or the lock
                stayed taken for the busy timeout.
        """
        compiled = self._compiled[statement]
        values = self.values(statement, params)
        self._sent(compiled.sql)
        if synced:  # with the synced writes made at the same time (see SharedCommits)
            return await self._shared.execute(compiled.sql, values, tuple(
                (self._compiled[then].sql, self.values(then, then_params))
                for then, then_params in then_first_of))
        if then_first_of:
            raise ValueError("writes that follow a write are for synced writes")

        def run() -> int:
            self._file.require()
            return self._connection().execute(compiled.sql, values).rowcount

        matched = await self._retrying(run, compiled.sql)
        self._checkpoints.committed()
        return matched

    async def _write_synced(self, writes: Sequence[Write]) -> list[int | BaseException]:
        """``writes`` in one transaction (:func:`commit_group`), then the log synced to
        disk in a worker thread (:func:`sync_log`) before any caller hears back; per
        write, its row count. When the group fails but for a busy lock, each write runs
        again alone and gets its own outcome.

        Raises:
            sqlalchemy.exc.DBAPIError: a lone write failed, the lock stayed taken for
                the busy timeout, or the log could not be synced (the writes were
                committed; whether a power loss would keep them is not known).
        """
        def run() -> list[int]:
            self._file.require()
            conn = self._connection()
            return commit_group(conn, writes, full_sync=self._wal_path is None)

        try:
            counts: list[int | BaseException] = list(await self._retrying(run, writes[0][0]))
        except DBAPIError as error:
            if len(writes) == 1 or (error.orig is not None and is_busy(error.orig)):
                raise
            counts = []
            for write in writes:  # one of them is at fault: each alone
                try:
                    counts += await self._write_synced([write])
                except DBAPIError as alone:
                    counts.append(alone)
            return counts
        self._checkpoints.committed()
        if self._wal_path is not None:
            try:
                await asyncio.get_running_loop().run_in_executor(None, sync_log,
                                                                 self._wal_path)
            except OSError as error:
                failed = sqlite3.OperationalError(f"could not sync the log to disk: {error}")
                raise _wrapped(writes[0][0], failed, self._dialect) from None
        return counts

    async def write_rows(self, statement: ClauseElement, rows: Sequence[dict[str, Any]],
                         fence: Fence | None = None, then: Then | None = None) -> list[bool]:
        """Run ``statement`` (a write that changes at most one row) once per row of
        ``rows`` in one transaction; returns, per row, whether it changed one.

        With ``fence``, the transaction first checks each lease the rows need, once
        (``BEGIN IMMEDIATE`` holds the only write lock, so no lease can change
        until the commit), and sends only the rows whose lease holds; the others
        come back ``False``. The rows go in one ``executemany``; when fewer rows
        changed than were sent, the transaction is rolled back and the rows run
        one by one, each telling its own outcome. ``rows`` hold every parameter,
        in the types ``sqlite3`` takes as they are. With ``then``, its statement
        runs, before the commit, once for each applied row that has parameters in
        it (one ``executemany``): what an applied write stores besides its row.

        Raises:
            sqlalchemy.exc.DBAPIError: SQLite failed or refused a row (then none
                is written), or the lock stayed taken for the busy timeout.
        """
        sql = self._compiled[statement].sql
        fence_sql = "" if fence is None else self._compiled[fence.statement].sql
        then_sql = "" if then is None else self._compiled[then.statement].sql

        def run() -> list[bool]:
            self._file.require()
            conn = self._connection()
            self._sent("BEGIN IMMEDIATE")
            conn.execute("BEGIN IMMEDIATE")
            try:
                sendable: Sequence[int] = range(len(rows))
                if fence is not None:
                    held = []
                    for params in fence.leases:
                        self._sent(fence_sql)
                        found = conn.execute(fence_sql, self.values(fence.statement, params))
                        held.append(found.fetchone() is not None)
                    sendable = [k for k, lease in enumerate(fence.of_row) if held[lease]]
                sent = [rows[k] for k in sendable]
                changed: list[bool] = []
                if sent:
                    self._sent(sql)
                    if conn.executemany(sql, sent).rowcount == len(sent):
                        changed = [True] * len(sent)
                if sent and not changed:  # some guard failed: find out which, one by one
                    conn.execute("ROLLBACK")
                    conn.execute("BEGIN IMMEDIATE")
                    changed = []
                    for row in sent:
                        self._sent(sql)
                        changed.append(conn.execute(sql, row).rowcount == 1)
                if then is not None:
                    after = [then.rows[k] for k, ok in zip(sendable, changed, strict=True)
                             if ok and k in then.rows]
                    if after:
                        self._sent(then_sql)
                        conn.executemany(then_sql, after)
                self._sent("COMMIT")
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            applied = [False] * len(rows)
            for k, ok in zip(sendable, changed, strict=True):
                applied[k] = ok
            return applied

        if self._checkpoints.truncating:
            await self._checkpoints.wait_truncate()
        applied = await self._retrying(run, sql)
        self._checkpoints.committed()
        return applied

    def _sent(self, sql: str) -> None:
        for listener in self.listeners:
            listener(sql)

    async def _retrying(self, run: Callable[[], T], sql: str) -> T:
        """``run()`` now, and again after a pause while another connection holds the lock.

        Raises what ``run`` raises as the engine would (a ``DBAPIError``, with
        the parameters hidden); a busy database once the busy timeout has passed.
        """
        deadline: float | None = None
        pause = FIRST_PAUSE
        while True:
            try:
                return run()
            except sqlite3.Error as error:
                if not is_busy(error):
                    raise _wrapped(sql, error, self._dialect) from None
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self._busy_timeout
                elif now >= deadline:
                    raise _wrapped(sql, error, self._dialect) from None
                wait = min(pause, deadline - now)  # the last try at the deadline
            await asyncio.sleep(wait)
            pause = min(pause * 2, MAX_PAUSE)

    # -- the connection -------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            if self._closed:
                raise sqlite3.OperationalError("the store is closed")
            conn = sqlite3.connect(self._path, timeout=0, isolation_level=None,
                                   check_same_thread=False)
            try:
                # WAL is a property of the file, set by the migration (or the engine's
                # first connection); asking again costs nothing once it is set.
                (mode,) = conn.execute("PRAGMA journal_mode=WAL").fetchone()
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute("PRAGMA wal_autocheckpoint=0")
                conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
                self._file.opened()
            except BaseException:
                conn.close()
                raise
            self._conn = conn
            # A file named by a plain path has its log beside it; a URI or an in-memory
            # database's commits sync themselves (or need not).
            in_wal = str(mode).lower() == "wal" and self._file.watched
            self._wal_path = self._path + "-wal" if in_wal else None
        return self._conn

    async def close(self) -> None:
        """Close the connections (waiting for the synced writes and a checkpoint under
        way)."""
        await self._shared.wait_idle()
        self._closed = True
        await self._checkpoints.close()
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def machine_now() -> str:
    """This machine's UTC time as SQLite stores times (the clock ``strftime('now')`` reads)."""
    # isoformat with the microseconds always written, less its "+00:00": the same text as
    # strftime("%Y-%m-%d %H:%M:%S.%f") at half the cost (it runs once per statement).
    return datetime.now(UTC).isoformat(" ", "microseconds")[:26]


def _wrapped(sql: str, error: sqlite3.Error, dialect: Dialect) -> StatementError:
    """``error`` as the SQLAlchemy error the engine would raise, parameters hidden."""
    return DBAPIError.instance(sql, None, error, sqlite3.Error, hide_parameters=True,
                               dialect=dialect)
