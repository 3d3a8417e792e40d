"""The driver interface, and its portable implementation.

A store holds one :class:`Driver`, chosen by the database's dialect when it opens
(:func:`watcher.store.drivers.open_driver`); the store builds the SQL every database
shares (``Statements``), the driver what a database does its own way:

- :meth:`Driver.fetch`: how one hot statement travels, in its own transaction;
- :meth:`Driver.items_ready`: the ready read (:meth:`~Driver.ready_statement`, ``_params``);
- :meth:`Driver.items_apply`: writing a batch of guarded, fenced item results;
- wake-ups (:meth:`Driver.notify`, ``notifications``), and statement listeners.

:class:`Driver` is the portable implementation: everything through the SQLAlchemy
engine, the ready read's limit a literal with an expanding ``NOT IN``, one guarded
``UPDATE`` per result in one transaction, no wake-ups. :class:`DirectDriver` (PostgreSQL,
SQLite, MariaDB) sends the hot statements through connections of its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from sqlalchemy import Integer, bindparam, insert, select
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, StatementError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.expression import Select

from watcher.config import DEFAULT_DB_TIMEOUT
from watcher.models import AVAILABLE
from watcher.records import ItemWrite, NewItem
from watcher.rules.delays import stored_time
from watcher.store.codecs import INSERT_CHUNK, chunks
from watcher.store.db.round_trips import CLIENT_MARGIN
from watcher.store.db.transactions import read_transaction, write_transaction
from watcher.store.drivers.sql import json_param, json_text_table

if TYPE_CHECKING:
    from watcher.store.sql.shared import Statements

StatementListener = Callable[[str], None]
NewRow = tuple[str, NewItem, str | None]  # an item to insert: partition, item, parent
# Writes of which the first that matches a row is the last run (an update, else an insert).
Followers = Sequence[tuple[Any, Mapping[str, Any]]]


class Driver:
    """The portable driver: every statement through the SQLAlchemy engine.

    ``statements`` is the store's shared SQL; the driver builds on it and
    never changes it. ``timeout`` is how long one round trip may take
    (seconds): the server's statement timeout, where the database has one.
    """

    notifies: bool = False  # whether it carries wake-ups (LISTEN/NOTIFY)
    polling_reason: str | None = None  # why watchers poll though it could notify (logged)
    # Whether a lease take is one locking ``UPDATE … RETURNING`` on :meth:`fetch`
    # (``LeaseStatements.take``); without, an engine transaction locks, writes, re-reads.
    takes_leases_in_one_statement: ClassVar[bool] = False
    # Whether an ``UPDATE`` in a ``WITH`` may feed another (PostgreSQL): a holder's move
    # and its timeline in one statement (``TimelineStatements.after``), else two.
    chains_writes: ClassVar[bool] = False
    # What the driver says when the session ended or the connection dropped, where the
    # dialect does not flag it (:meth:`session_lost`); the last: psycopg mid-pipeline.
    lost_connection_texts: ClassVar[tuple[str, ...]] = (
        "server closed the connection unexpectedly", "terminating connection due to",
        "the connection is lost", "Lost connection to", "server has gone away",
        "cannot exit pipeline mode while busy")

    def __init__(self, engine: AsyncEngine, statements: Statements, *,
                 timeout: float = DEFAULT_DB_TIMEOUT) -> None:
        self.engine = engine
        self.statements = statements
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.engine.dialect.name})"

    async def close(self) -> None:
        """Release what the driver holds beside the engine (the portable one holds nothing)."""

    # -- how a failed statement failed --------------------------------------

    def refuses_value(self, error: BaseException) -> bool:
        """Whether ``error`` says the database (or its driver) refused a value of the
        statement: it fails the same way every time, unlike an outage (and see modules)."""
        if isinstance(error, DataError | IntegrityError):
            return True
        if isinstance(error, StatementError) and not isinstance(error, DBAPIError):
            return True  # a parameter SQLAlchemy could not convert
        return isinstance(error, ValueError | OverflowError)  # includes UnicodeError

    def timed_out(self, error: BaseException) -> bool:
        """Whether ``error`` is the database ending a statement that ran or waited on a
        lock too long (statement or lock wait timeout; databases add theirs)."""
        return False

    def problem(self) -> str | None:
        """A standing problem of the database (``None``: none; SQLite's: its file gone)."""
        return None

    require_usable: Callable[[], None] | None = None  # before each engine transaction

    def round_trip_bound(self) -> float | None:
        """How long the client waits for a round trip's answer before dropping the
        connection (``None``: the database bounds its own waits)."""
        return self.timeout + CLIENT_MARGIN

    def lost_connection(self, error: BaseException) -> bool:
        """Whether the connection dropped during the statement: an outage, or on some
        databases a statement too large for the server (which then goes on as if not)."""
        return isinstance(error, DBAPIError) and bool(error.connection_invalidated)

    def session_lost(self, error: BaseException) -> bool:
        """Whether ``error`` says the session ended under the call (the server ended it,
        or the connection dropped): :meth:`lost_connection`, or the driver's text where
        the dialect does not flag it (libpq's "consuming input failed: server closed
        the connection unexpectedly"). The transaction is gone with the session."""
        return self.lost_connection(error) or (isinstance(error, DBAPIError) and any(
            text in str(error.orig) for text in self.lost_connection_texts))

    async def fetch(self, statement: Any, params: Mapping[str, Any], *, read: bool
                    ) -> Sequence[Any]:
        """Run one statement in a transaction of its own (``read``: it writes nothing);
        returns its rows (if any).

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed or refused it.
        """
        transaction = read_transaction if read else write_transaction
        async with transaction(self.engine) as conn:
            result = await conn.execute(statement, dict(params))
            return result.all() if result.returns_rows else []

    async def execute(self, statement: Any, params: Mapping[str, Any]) -> int:
        """Run one write statement in a transaction of its own; returns how many rows
        it matched. Raises sqlalchemy.exc.SQLAlchemyError: the database failed or refused it.
        """
        async with write_transaction(self.engine) as conn:
            return (await conn.execute(statement, dict(params))).rowcount

    async def execute_followed(self, statement: Any, params: Mapping[str, Any],
                               then_first_of: Followers) -> int | None:
        """:meth:`execute`, then where it matched a row ``then_first_of`` until one does, in
        one transaction, if the driver has a way (SQLite's, MariaDB's); ``None``: none,
        nothing ran."""
        return None

    # -- the ready read -----------------------------------------------------

    def ready_statement(self, excluding: bool, limit: int) -> Select[Any]:
        """The ready read with bind parameters ``pid`` and ``gate`` (and ``exclude``). The
        limit is a literal: SQL Server renders it as ``TOP n``, where a bound limit would
        make it number every row (``ROW_NUMBER()``)."""
        query = self.statements.items_ready(limit)
        if excluding:
            items = self.statements.tables.items
            query = query.where(items.c.id.not_in(bindparam("exclude", expanding=True)))
        return query

    def ready_params(self, partition_id: str, gate: int, limit: int,
                     exclude: Collection[str]) -> dict[str, Any]:
        """The parameters of :meth:`ready_statement` for one read."""
        params: dict[str, Any] = {"pid": partition_id, "gate": gate}
        if exclude:
            params["exclude"] = list(exclude)
        return params

    async def items_ready(self, partition_id: str, gate: int, limit: int,
                          exclude: Collection[str]) -> Sequence[Any]:
        """Up to ``limit`` rows ``(id, version, gate, data, attempts)`` ready at ``gate``,
        leaving out the ids in ``exclude``; ordered by (retry time, id). Raises
        sqlalchemy.exc.SQLAlchemyError: the database failed."""
        return await self.fetch(self.ready_statement(bool(exclude), limit),
                                self.ready_params(partition_id, gate, limit, exclude),
                                read=True)

    # -- result writes ------------------------------------------------------

    async def items_apply(self, writes: Sequence[ItemWrite], owner: str) -> list[bool]:
        """Write ``writes`` in one transaction, each guarded and fenced, and
        :meth:`replaced_waits_in`; returns, per write, whether it was applied (see
        :meth:`watcher.store.Store.items_apply`).

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed or refused a write
                (then none of the batch is written).
        """
        async with write_transaction(self.engine) as conn:
            applied = await self.items_write_each(conn, writes, owner)
            await self.replaced_waits_in(conn, writes, applied)
        return applied

    async def items_apply_then(self, writes: Sequence[ItemWrite], owner: str, then: Followers
                               ) -> tuple[list[bool], list[Sequence[Any]]]:
        """:meth:`items_apply`, then ``then``'s statements (their rows returned too) in one
        round trip and transaction where :attr:`chains_writes`; NotImplementedError else."""
        raise NotImplementedError(f"{type(self).__name__} does not chain writes")

    async def items_apply_spawning(self, writes: Sequence[ItemWrite], owner: str,
                                   spawned: Sequence[tuple[int, NewRow]]) -> list[bool] | None:
        """:meth:`items_apply` with the rows the applied writes spawn (each with its write's
        place in ``writes``) and their partitions' counts, in one statement, where the
        driver can; ``None``, writing nothing, else. Raises IntegrityError: an id is stored."""
        return None

    async def items_insert_in(self, conn: AsyncConnection, rows: Sequence[NewRow], *,
                              spawned_by_reduce: int | None = None) -> None:
        """Insert ``rows`` at available, ready at the clock's time (or their ``not_before``
        if later), in ``conn``'s transaction, a chunk per statement; ``spawned_by_reduce``:
        the reduce gate that spawned them. Raises IntegrityError: an id is stored already."""
        now = (await conn.execute(select(self.statements.now))).scalar_one()
        for chunk in chunks(rows, INSERT_CHUNK):
            await conn.execute(insert(self.statements.tables.items), [{
                "partition_id": pid, "id": item.id, "version": 1, "gate": item.gate or 0,
                "status": AVAILABLE, "data": item.data, "attempts": 0, "created_at": now,
                "updated_at": now, "parent": parent, "spawned_by_reduce": spawned_by_reduce,
                "retry_at": now if item.not_before is None else max(
                    now, stored_time(item.not_before))} for pid, item, parent in chunk])

    async def replaced_waits_in(self, conn: AsyncConnection, writes: Sequence[ItemWrite],
                                applied: Sequence[bool]) -> None:
        """Keep in ``waits`` (in ``conn``) the keys the ``applied`` parking writes replace.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed or refused a row.
        """
        rows = self.statements.waits.replaced_params(writes, applied)
        if rows:
            await conn.execute(self.statements.waits.insert, rows)

    async def items_write_each(self, conn: AsyncConnection, writes: Sequence[ItemWrite],
                               owner: str) -> list[bool]:
        """Write ``writes``, each guarded and fenced, inside the caller's transaction
        ``conn`` (one that also inserts what they spawn); returns, per write, whether
        it was applied. The portable driver sends one ``UPDATE`` per write.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed or refused a write.
        """
        statements = self.statements
        applied: list[bool] = []
        for write in writes:
            statement = statements.item_write(new_data=write.data is not None,
                                              delayed=bool(write.retry_delay),
                                              parking=write.wait is not None)
            result = await conn.execute(statement, statements.item_write_params(write, owner))
            applied.append(result.rowcount == 1)
        return applied

    async def items_write_in(self, conn: AsyncConnection, writes: Sequence[ItemWrite],
                             owner: str) -> int:
        """Write ``writes``, each guarded and fenced, inside the caller's transaction
        ``conn`` (a reduce step's); returns how many were applied. The portable driver
        sends each shape of write once with all its rows.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed or refused a write.
        """
        statements = self.statements
        applied = 0
        for new_data in (False, True):
            params = [statements.item_write_params(w, owner) for w in writes
                      if (w.data is not None) is new_data]
            if not params:
                continue
            statement = statements.item_write(new_data=new_data, delayed=False)
            if conn.dialect.supports_sane_multi_rowcount:
                applied += (await conn.execute(statement, params)).rowcount
            else:
                for one in params:
                    applied += (await conn.execute(statement, one)).rowcount
        return applied

    async def notify(self, conn: AsyncConnection, channel: str, partition_id: str) -> None:
        """Announce, in the writer's transaction ``conn`` (delivered if it commits), that
        ``partition_id`` changed. The portable driver sends nothing: watchers poll."""

    def notifications(self, channel: str) -> AsyncIterator[str]:
        """The partition ids announced on ``channel``, as the writers commit.

        Raises:
            NotImplementedError: this database carries no notifications (see
                :attr:`notifies`).
        """
        raise NotImplementedError(f"the {self.engine.dialect.name} database carries no "
                                  "notifications; watchers poll it (check Store.notifies)")

    # -- observation --------------------------------------------------------

    def add_statement_listener(self, listener: StatementListener) -> None:
        """Call ``listener`` with the text of each statement sent past the SQLAlchemy
        engine (the engine's own events see all the others). The portable driver
        sends every statement through the engine, so it never calls it."""

    def remove_statement_listener(self, listener: StatementListener) -> None:
        """Stop calling ``listener`` (a listener never added is ignored)."""


class DirectPath(Protocol):
    """A driver's own connections for the hot statements (see :class:`DirectDriver`)."""

    listeners: list[StatementListener]

    async def fetch(self, statement: ClauseElement, params: Mapping[str, Any]
                    ) -> Sequence[tuple[Any, ...]]:
        """Run one statement, atomic by itself; returns its rows (none for a write)."""
        ...  # pragma: no cover

    async def execute(self, statement: ClauseElement, params: Mapping[str, Any]) -> int:
        """Run one write statement, atomic by itself; returns how many rows it matched."""
        ...  # pragma: no cover

    async def close(self) -> None:
        """Close the connections."""
        ...  # pragma: no cover


DirectT = TypeVar("DirectT", bound=DirectPath)


class DirectDriver(Driver, Generic[DirectT]):
    """A driver that sends the hot statements (:meth:`fetch`: the ready read, the gate
    summary, its batch write) through connections of its own, :attr:`direct`.

    Each of them is a single statement, atomic by itself, so it runs without a
    transaction around it. The ready read is built once per shape: its limit
    is a parameter, and the items in hand travel as one JSON array, encoded in
    C (:meth:`build_ready` reads it with the database's JSON table function).
    """

    direct: DirectT

    def __init__(self, engine: AsyncEngine, statements: Statements, *,
                 timeout: float = DEFAULT_DB_TIMEOUT) -> None:
        super().__init__(engine, statements, timeout=timeout)
        self.direct = self.open_direct()
        self._ready = {excluding: self.build_ready(excluding) for excluding in (False, True)}

    def open_direct(self) -> DirectT:
        """The driver's own connections (opened lazily, at the first statement)."""
        raise NotImplementedError

    async def close(self) -> None:
        """Close the direct path's connections."""
        await self.direct.close()

    async def fetch(self, statement: Any, params: Mapping[str, Any], *, read: bool
                    ) -> Sequence[Any]:
        """Run one statement on the direct path (a transaction of its own); returns its rows.

        Raises:
            sqlalchemy.exc.DBAPIError: the database failed, refused it or could
                not be reached.
        """
        return await self.direct.fetch(statement, params)

    async def execute(self, statement: Any, params: Mapping[str, Any]) -> int:
        """Run one write statement on the direct path (a transaction of its own);
        returns how many rows it matched.

        Raises:
            sqlalchemy.exc.DBAPIError: the database failed, refused it or could
                not be reached.
        """
        return await self.direct.execute(statement, params)

    # -- the ready read -----------------------------------------------------

    def ready_statement(self, excluding: bool, limit: int) -> Select[Any]:
        """The ready read with bind parameters pid, gate, limit (and exclude, a JSON array)."""
        return self._ready[excluding]

    def ready_params(self, partition_id: str, gate: int, limit: int,
                     exclude: Collection[str]) -> dict[str, Any]:
        """The parameters of :meth:`ready_statement`, ``exclude`` as JSON text."""
        params: dict[str, Any] = {"pid": partition_id, "gate": gate, "limit": limit}
        if exclude:
            params["exclude"] = json_param(exclude)
        return params

    def build_ready(self, excluding: bool) -> Select[Any]:
        """The ready read, with ``NOT IN`` the texts of the JSON array ``exclude``."""
        query = self.statements.items_ready(bindparam("limit", type_=Integer()))
        if excluding:
            texts = json_text_table("exclude")
            query = query.where(self.statements.tables.items.c.id.not_in(select(texts.c.value)))
        return query

    # -- observation --------------------------------------------------------

    def add_statement_listener(self, listener: StatementListener) -> None:
        """Call ``listener`` with the text of each statement sent on the direct path."""
        self.direct.listeners.append(listener)

    def remove_statement_listener(self, listener: StatementListener) -> None:
        """Stop calling ``listener`` (a listener never added is ignored)."""
        if listener in self.direct.listeners:
            self.direct.listeners.remove(listener)
