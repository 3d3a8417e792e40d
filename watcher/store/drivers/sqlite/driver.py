"""SQLite: the clock as text, the hot path on the event loop's thread, batch writes.

SQLite has no time type: SQLAlchemy stores times as text with six fractional
digits, and comparisons order them as text, so the clock renders that same
form. Its arithmetic keeps milliseconds (``strftime``'s ``%f``).

The ready read, the gate summary and the batch of result writes run on one
``sqlite3`` connection of the driver's own, from the event loop's thread
(:mod:`watcher.store.drivers.sqlite.direct`, which also says what its commits
promise); everything else goes through the engine (aiosqlite). A batch of
results is one transaction: each lease checked once, then one ``UPDATE``
guarded by key and version sent once with all the rows (``executemany``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, event, literal_column, select
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import Select

from watcher.config import DEFAULT_DB_TIMEOUT
from watcher.records import ItemWrite
from watcher.store.drivers.base import DirectDriver, Followers
from watcher.store.drivers.sql import (
    data_size,
    db_now,
    json_texts,
    not_for_index,
    parks,
    replaced_rows,
    time_plus,
    time_plus_parts,
)
from watcher.store.drivers.sqlite.checkpoints import WAL_SIZE_LIMIT
from watcher.store.drivers.sqlite.direct import (
    Fence,
    SQLiteDirect,
    Then,
    is_busy,
)
from watcher.store.drivers.sqlite.engine import BUSY_TIMEOUT_SECONDS
from watcher.store.drivers.sqlite.files import DatabaseFile
from watcher.store.sql.sources import ResultSource
from watcher.store.sql.waits import wait_params

if TYPE_CHECKING:
    from watcher.store.sql.shared import Statements

SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"


@compiles(db_now, "sqlite")
def _now(element: db_now, compiler: Any, **kw: Any) -> str:
    # Six fractional digits, the same text form SQLAlchemy stores, so that
    # comparisons between stored and computed times order correctly as text.
    return f"({SQLITE_NOW} || '000')"


@compiles(not_for_index, "sqlite")
def _not_for_index(element: not_for_index, compiler: Any, **kw: Any) -> str:
    return f"+{compiler.process(element.clauses, **kw)}"


@compiles(data_size, "sqlite")
def _size(element: data_size, compiler: Any, **kw: Any) -> str:
    # length() of a BLOB counts bytes (OCTET_LENGTH came only in SQLite 3.43).
    return f"length({compiler.process(element.clauses, **kw)})"


@compiles(json_texts, "sqlite")
def _texts(element: json_texts, compiler: Any, **kw: Any) -> str:
    # json_each's own column is named "value", as json_texts promises.
    return f"json_each({compiler.process(element.clauses, **kw)})"


@compiles(time_plus, "sqlite")
def _plus(element: time_plus, compiler: Any, **kw: Any) -> str:
    base, seconds = time_plus_parts(element, compiler, **kw)
    return (
        f"(strftime('%Y-%m-%d %H:%M:%f', {base}, "
        f"printf('%+.3f seconds', {seconds})) || '000')"
    )


class SQLiteDriver(DirectDriver[SQLiteDirect]):
    """SQLite: the hot statements on a connection of its own, from the loop's thread;
    a batch of results in one ``executemany``; watchers poll."""

    # One UPDATE ... RETURNING; SQLite locks the whole database per write, so the
    # take's row locks have nothing to pass by.
    takes_leases_in_one_statement = True

    def __init__(self, engine: AsyncEngine, statements: Statements, *,
                 timeout: float = DEFAULT_DB_TIMEOUT) -> None:
        self.file = DatabaseFile(engine.url.database or "")
        super().__init__(engine, statements, timeout=timeout)
        # One statement for every shape of result: new data or not (a NULL keeps it),
        # a retry delay or not (0 is ready now). It is guarded by key and version only:
        # the batch checks each lease once, in the same transaction (see items_apply).
        self.write_statement = statements.result_write(
            ResultSource.parameters(statements.tables.items.c.data.type), fenced=False)
        # The same, with a wait per row (NULL for a row that does not park), for a batch
        # where some write parks.
        self.park_statement = statements.result_write(
            ResultSource.parameters(statements.tables.items.c.data.type, parking=True),
            fenced=False)
        self.fence_statement: Select[Any] = select(literal_column("1")).where(
            *statements.lease_held(bindparam("pid"), bindparam("owner")))
        self._watch_file(engine)

    def open_direct(self) -> SQLiteDirect:
        """One ``sqlite3`` connection on the engine's file (:mod:`.direct`)."""
        return SQLiteDirect(self.engine.url.database or "", SQLiteDialect_pysqlite(
            paramstyle="named"), busy_timeout=BUSY_TIMEOUT_SECONDS, file=self.file)

    def _watch_file(self, engine: AsyncEngine) -> None:
        """Refuse the engine's connections and transactions once the database file
        was deleted or replaced (see :class:`DatabaseFile`)."""
        file = self.file

        @event.listens_for(engine.sync_engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            file.opened()
            cursor = dbapi_connection.cursor()
            cursor.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
            cursor.close()

    def problem(self) -> str | None:
        """The database file deleted or replaced under this process, if it was."""
        return self.file.check()

    def require_usable(self) -> None:
        """Refuse a transaction once the database file was deleted or replaced.

        Raises:
            sqlalchemy.exc.OperationalError: it was (checked at most once a second).
        """
        try:
            self.file.require()
        except sqlite3.OperationalError as error:
            raise OperationalError(None, None, error) from None

    async def execute(self, statement: Any, params: Mapping[str, Any]) -> int:
        """On the direct path, its one commit synced to disk (FULL), as a partition's
        gate moves and closes are promised to be (see :mod:`.direct`).

        Raises:
            sqlalchemy.exc.OperationalError: the database file was deleted or replaced.
            sqlalchemy.exc.DBAPIError: SQLite failed or refused it, or the lock stayed
                taken for the busy timeout.
        """
        self.require_usable()
        return await self.direct.execute(statement, params, synced=True)

    async def execute_followed(self, statement: Any, params: Mapping[str, Any],
                               then_first_of: Followers) -> int | None:
        """:meth:`execute` with ``then_first_of`` in its transaction, in the shared,
        synced commits (:meth:`Driver.execute_followed`).

        Raises:
            sqlalchemy.exc.OperationalError: the database file was deleted or replaced.
            sqlalchemy.exc.DBAPIError: SQLite failed or refused a write, or the lock
                stayed taken for the busy timeout.
        """
        self.require_usable()
        return await self.direct.execute(statement, params, synced=True,
                                         then_first_of=then_first_of)

    def timed_out(self, error: BaseException) -> bool:
        """See :meth:`Driver.timed_out`: the lock stayed taken for the busy timeout."""
        return is_busy(getattr(error, "orig", error))

    def round_trip_bound(self) -> None:
        """SQLite bounds its own waits (the busy timeout); nothing is interrupted."""
        return None

    async def items_apply(self, writes: Sequence[ItemWrite], owner: str) -> list[bool]:
        """The batch in one transaction: each partition's lease checked once (the
        transaction holds SQLite's only write lock, so no lease changes before it
        commits), then one ``UPDATE`` guarded by key and version sent with the rows
        of the partitions still held, all at once (``executemany``); when some
        row's guard fails, those rows go again one by one to tell which (see
        :meth:`SQLiteDirect.write_rows`). A parking write's wait goes in its item's
        row (the batch then uses the parking statement); the keys that applied parking
        writes replace are kept in ``waits`` in the same transaction, in one
        ``executemany`` (their time is the clock's, read when the batch is built).

        Raises:
            sqlalchemy.exc.DBAPIError: SQLite failed or refused a write (then none
                of the batch is written).
        """
        direct = self.direct
        parking = parks(writes)
        statement = self.park_statement if parking else self.write_statement
        # The values every row shares: those SQLAlchemy bound, the clock's reading.
        shared = direct.values(statement, {"owner": owner})
        rows = [{**shared, "pid": w.partition_id, "iid": w.item_id, "seen": w.seen_version,
                 "new_status": w.status, "new_gate": w.gate, "new_attempts": w.attempts,
                 "new_error": w.last_error, "new_data": w.data,
                 "delay": w.retry_delay or 0.0, "new_history": w.error_history}
                for w in writes]
        if parking:
            for row, write in zip(rows, writes, strict=True):
                row.update(wait_params(write))
        leases: dict[str, int] = {}
        of_row = [leases.setdefault(w.partition_id, len(leases)) for w in writes]
        fence = Fence(self.fence_statement,
                      [{"pid": partition_id, "owner": owner} for partition_id in leases], of_row)
        then = None
        replaced = replaced_rows(writes)
        if replaced:
            insert = self.statements.waits.insert
            params = self.statements.waits.replaced_params([w for _, w in replaced])
            # The clock read once for the batch (its rows share the time), as the items'.
            clock = direct.values(insert, params[0])
            then = Then(insert, {n - 1: {**clock, **one}
                                 for (n, _), one in zip(replaced, params, strict=True)})
        return await direct.write_rows(statement, rows, fence, then)
