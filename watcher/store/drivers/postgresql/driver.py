"""PostgreSQL: the clock, the direct hot path, the one-statement result write, LISTEN/NOTIFY.

- The ready read, the gate summary and the result write go through a few
  autocommit psycopg connections of the driver's own
  (:mod:`watcher.store.drivers.postgresql.direct`) instead of SQLAlchemy's engine.
- The ready read sends one statement text for every limit and leaves out the
  items in hand through one JSON array parameter: the text stays constant
  (prepared once), and ``json.dumps`` encodes the list in C, where a ``text[]``
  is encoded element by element.
- A batch of results is one guarded ``UPDATE ... FROM jsonb_array_elements(...)
  ... RETURNING``, each row still matched on its version and fenced on the lease.
- Client writes send ``NOTIFY`` in their transaction; watchers ``LISTEN``; neither
  behind a transaction pooler (:mod:`watcher.store.drivers.postgresql.pooler`), where
  watchers poll.

A store with a :class:`~watcher.store.db.clock.FixedClock` takes every one of these
paths too: the clock is a parameter of the same statements.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from sqlalchemy import (
    Integer,
    Text,
    all_,
    bindparam,
    cast,
    column,
    func,
    insert,
    literal,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import ColumnElement, Insert, Select, Update

from watcher.config import DEFAULT_DB_TIMEOUT
from watcher.models import AVAILABLE
from watcher.records import ItemWrite
from watcher.rules.delays import stored_time
from watcher.store.codecs import INSERT_CHUNK, sized_chunks
from watcher.store.drivers.base import DirectDriver, Followers, NewRow
from watcher.store.drivers.postgresql import pooler
from watcher.store.drivers.postgresql.direct import DirectStatements, connect_options
from watcher.store.drivers.sql import (
    WAIT_POLICY,
    WAIT_TIMEOUT,
    WAIT_TOKEN,
    WAIT_TRACEPARENT,
    batch_params,
    batch_rows_json,
    db_now,
    parks,
    replaced_rows,
    time_plus,
    time_plus_parts,
    wait_rows_json,
)
from watcher.store.sql.shared import Statements
from watcher.store.sql.sources import ResultSource, WaitSource

__all__ = ["PostgreSQLDriver", "batch_rows_json", "jsonb_param"]


@compiles(db_now, "postgresql")
def _now(element: db_now, compiler: Any, **kw: Any) -> str:
    return "(now() AT TIME ZONE 'UTC')"


@compiles(time_plus, "postgresql")
def _plus(element: time_plus, compiler: Any, **kw: Any) -> str:
    base, seconds = time_plus_parts(element, compiler, **kw)
    return f"({base} + make_interval(secs => {seconds}))"


def _applied(rows: Sequence[Any], count: int) -> list[bool]:
    """Per write of a batch of ``count``, whether the batch's ``RETURNING`` named it."""
    applied = {number for (number,) in rows}
    return [number in applied for number in range(1, count + 1)]


def _insert_row(row: NewRow, spawned_by_reduce: int | None) -> list[Any]:
    """One new item as :meth:`PostgreSQLDriver._insert_from` reads it from JSON."""
    partition_id, item, parent = row
    return [partition_id, item.id, item.gate or 0, item.data.hex(),
            None if item.not_before is None else stored_time(item.not_before).isoformat(),
            parent, spawned_by_reduce]


def _json(rows: list[list[Any]]) -> str:
    """``rows`` as one compact JSON array (encoded in C)."""
    return json.dumps(rows, ensure_ascii=False, separators=(",", ":"))


def jsonb_param(name: str) -> ColumnElement[Any]:
    """A parameter sent as JSON text and read as ``jsonb``: no type on either path
    (SQLAlchemy's or the direct one) encodes the text a second time."""
    return cast(bindparam(name, type_=Text()), JSONB)


# The data one insert statement carries at most, before its JSON (hex doubles it): big
# items go a few per statement, so no statement's text nears PostgreSQL's 1 GB.
INSERT_CHUNK_BYTES = 8 * 1024 * 1024
# The rows a spawning batch's one statement carries at most (and INSERT_CHUNK_BYTES of
# data); past them, the batch goes in an engine transaction, its rows in chunks.
SPAWN_AT_ONCE_ROWS = 10_000

# SQLSTATE classes of a refused value: data exception, integrity constraint
# violation, program limit exceeded (a value too large to handle).
VALUE_REFUSAL_CLASSES = frozenset({"22", "23", "54"})
# SQLSTATEs of a statement the server ended for its time: query canceled (the
# statement timeout), lock not available (a lock timeout).
TIMEOUT_SQLSTATES = frozenset({"57014", "55P03"})


class PostgreSQLDriver(DirectDriver[DirectStatements]):
    """PostgreSQL: hot statements through psycopg directly, batch writes, notifications."""

    # Notifications: yes, unless the URL says a transaction pooler is in between.
    notifies = True
    takes_leases_in_one_statement = True
    chains_writes = True

    def refuses_value(self, error: BaseException) -> bool:
        """See :meth:`Driver.refuses_value`; adds SQLSTATE classes 22, 23 and 54."""
        if super().refuses_value(error):
            return True
        sqlstate = getattr(getattr(error, "orig", None), "sqlstate", None) or ""
        return sqlstate[:2] in VALUE_REFUSAL_CLASSES

    def __init__(self, engine: AsyncEngine, statements: Statements, *,
                 timeout: float = DEFAULT_DB_TIMEOUT) -> None:
        super().__init__(engine, statements, timeout=timeout)
        self.batch_statement = self._build_batch()
        self.park_update = self._build_batch(parking=True)
        self.park_statement = self._build_park()
        # LISTEN needs a session of its own, which a transaction pooler does not give.
        self.notifies = not pooler.behind_transaction_pooler(engine.url)
        self.polling_reason = None if self.notifies else pooler.POLLING_REASON

    def open_direct(self) -> DirectStatements:
        """A few autocommit psycopg connections (:mod:`watcher.store.drivers.postgresql.direct`)."""
        return DirectStatements(self.engine.url, self.engine.dialect, timeout=self.timeout)

    def timed_out(self, error: BaseException) -> bool:
        """See :meth:`Driver.timed_out`: SQLSTATE 57014 (the statement timeout) or
        55P03 (a lock timeout)."""
        sqlstate = getattr(getattr(error, "orig", None), "sqlstate", None)
        return sqlstate in TIMEOUT_SQLSTATES

    # -- the ready read -----------------------------------------------------

    def build_ready(self, excluding: bool) -> Select[Any]:
        """The ready read; the items in hand are left out with ``<> ALL`` over an
        array built from the JSON parameter."""
        query = self.statements.items_ready(bindparam("limit", type_=Integer()))
        if excluding:
            names = select(func.jsonb_array_elements_text(
                jsonb_param("exclude"))).scalar_subquery()
            query = query.where(self.statements.tables.items.c.id != all_(func.array(names)))
        return query

    # -- result writes ------------------------------------------------------

    async def items_apply(self, writes: Sequence[ItemWrite], owner: str) -> list[bool]:
        """The whole batch as one guarded UPDATE; RETURNING tells which rows were applied.

        Same guard and fence as the portable path, per row. The rows travel as
        one JSON array of arrays (see :func:`batch_rows_json`): the driver
        would encode nine array parameters element by element in Python;
        ``json.dumps`` encodes the batch in C. When writes park their items, the
        UPDATE is :meth:`_build_park_update`'s (each row's wait too); when a parking
        write replaces its item's last wait, :meth:`_build_park`'s, which also keeps
        the replaced keys in ``waits``, in the same statement.

        Raises:
            sqlalchemy.exc.DBAPIError: the database failed or refused a write
                (then none of the batch is written).
        """
        statement, params = self._batch_for(writes, owner)
        return _applied(await self.fetch(statement, params, read=False), len(writes))

    async def items_apply_then(self, writes: Sequence[ItemWrite], owner: str, then: Followers
                               ) -> tuple[list[bool], list[Sequence[Any]]]:
        """:meth:`items_apply`, then each statement of ``then`` with its parameters, in
        one round trip and one transaction (a pipeline:
        :meth:`~.direct.DirectStatements.fetch_chain`); returns, per write, whether it
        was applied, and each statement's rows. Those statements see the batch's writes.

        Raises:
            sqlalchemy.exc.DBAPIError: as :meth:`items_apply` (nothing is written).
        """
        statement, params = self._batch_for(writes, owner)
        rows = await self.direct.fetch_chain([(statement, params), *then])
        return _applied(rows[0], len(writes)), rows[1:]

    def _batch_for(self, writes: Sequence[ItemWrite], owner: str
                   ) -> tuple[Update | Select[Any], dict[str, Any]]:
        """The statement that writes ``writes`` and its parameters (:meth:`items_apply`)."""
        params = batch_params(writes, owner)
        statement: Update | Select[Any] = self._update_for(writes)
        if replaced_rows(writes):
            statement, params["waits"] = self.park_statement, wait_rows_json(writes)
        return statement, params

    async def items_insert_in(self, conn: AsyncConnection, rows: Sequence[NewRow], *,
                              spawned_by_reduce: int | None = None) -> None:
        """:meth:`Driver.items_insert_in` as one ``INSERT ... SELECT`` from a JSON array per
        chunk, the clock read in it (no statement of its own): the rows are encoded in C,
        and the server runs one statement rather than one per row. A chunk holds at most
        ``INSERT_CHUNK`` rows and about :data:`INSERT_CHUNK_BYTES` of data (a single row
        may hold more). Raises sqlalchemy.exc.IntegrityError: an id is stored already."""
        for chunk in sized_chunks(rows, INSERT_CHUNK, INSERT_CHUNK_BYTES,
                                  lambda row: len(row[1].data)):
            await conn.execute(self._insert_statement, {"rows": _json(
                [_insert_row(row, spawned_by_reduce) for row in chunk])})

    @functools.cached_property
    def _insert_statement(self) -> Insert:
        """:meth:`items_insert_in`'s statement, from the JSON rows ``:rows``."""
        source = func.jsonb_array_elements(jsonb_param("rows")).table_valued(
            column("value", JSONB)).render_derived(name="r")
        return self._insert_from(source.c.value, 0, source)

    def _insert_from(self, row: Any, first: int, source: Any) -> Insert:
        """Insert available items, version 1, no attempt, created (and updated) at the
        clock's time and ready then, or at their ``not_before`` if later: one per JSON
        ``row`` of ``source``, whose elements from ``first`` on are :func:`_insert_row`'s."""
        items, now = self.statements.tables.items, self.statements.now
        at = [row[first + n] for n in range(7)]
        not_before = cast(at[4].as_string(), items.c.retry_at.type)
        return insert(items).from_select(
            ["partition_id", "id", "version", "gate", "status", "data", "attempts",
             "retry_at", "created_at", "updated_at", "parent", "spawned_by_reduce"],
            select(at[0].as_string(), at[1].as_string(), literal(1, Integer()),
                   at[2].as_integer(), literal(AVAILABLE, Text()),
                   func.decode(at[3].as_string(), "hex"), literal(0, Integer()),
                   func.greatest(now, not_before), now, now,  # GREATEST skips a NULL
                   at[5].as_string(), at[6].as_integer()).select_from(source))

    async def items_apply_spawning(self, writes: Sequence[ItemWrite], owner: str,
                                   spawned: Sequence[tuple[int, NewRow]]) -> list[bool] | None:
        """The batch ``UPDATE`` of :meth:`items_apply`, the insert of the rows the applied
        writes spawn (each row names its write by its place in ``writes``: a write the
        guard or the fence refused spawns nothing), and the partitions' ``spawned`` counts,
        as one statement (:meth:`_build_spawning`): one round trip, atomic by itself, where
        an engine transaction took a statement per partition and per chunk. Returns, per
        write, whether it was applied; ``None``, sending nothing, when the rows are more than
        :data:`SPAWN_AT_ONCE_ROWS` or their data more than ``INSERT_CHUNK_BYTES`` (they go
        in chunks then), or a parking write replaces a wait.

        Raises:
            sqlalchemy.exc.IntegrityError: an id is stored already (nothing is written).
            sqlalchemy.exc.DBAPIError: as :meth:`items_apply`.
        """
        if (len(spawned) > SPAWN_AT_ONCE_ROWS or replaced_rows(writes)
                or sum(len(row[1].data) for _, row in spawned) > INSERT_CHUNK_BYTES):
            return None
        params = batch_params(writes, owner)
        params["spawned"] = _json([[place, *_insert_row(row, None)] for place, row in spawned])
        statement = self._spawning_statements[parks(writes)]
        return _applied(await self.fetch(statement, params, read=False), len(writes))

    @functools.cached_property
    def _spawning_statements(self) -> dict[bool, Select[Any]]:
        """:meth:`_build_spawning` for a batch without a parking write, and with one."""
        return {parking: self._build_spawning(parking) for parking in (False, True)}

    def _build_spawning(self, parking: bool) -> Select[Any]:
        """The batch ``UPDATE`` (:meth:`_build_batch`) as a data-modifying ``WITH``, the
        ``INSERT`` of the JSON rows ``:spawned`` whose write it applied (matched on their
        place in the batch), and the ``UPDATE`` of their partitions' ``spawned`` counts by
        the rows inserted; it returns the applied places, as the batch does."""
        partitions = self.statements.tables.partitions
        applied = (self.park_update if parking else self.batch_statement).cte("applied")
        source = func.jsonb_array_elements(jsonb_param("spawned")).table_valued(
            column("value", JSONB)).render_derived(name="s")
        row = source.c.value
        inserted = self._insert_from(row, 1, applied.join(
            source, applied.c.n == row[0].as_integer())).returning(
            self.statements.tables.items.c.partition_id).cte("inserted")
        counts = (select(inserted.c.partition_id, func.count().label("added"))
                  .group_by(inserted.c.partition_id).subquery("added"))
        counted = (update(partitions).where(partitions.c.id == counts.c.partition_id)
                   .values(spawned=partitions.c.spawned + counts.c.added)
                   .returning(partitions.c.id).cte("counted"))
        return select(applied.c.n).add_cte(inserted, counted)

    def _update_for(self, writes: Sequence[ItemWrite]) -> Update:
        """The batch UPDATE for ``writes``: the parking one when some write parks."""
        return self.park_update if parks(writes) else self.batch_statement

    async def items_write_in(self, conn: AsyncConnection, writes: Sequence[ItemWrite],
                             owner: str) -> int:
        """The batch UPDATE of :meth:`items_apply`, inside the caller's transaction.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed or refused a write.
        """
        if not writes:
            return 0
        result = await conn.execute(self._update_for(writes), batch_params(writes, owner))
        return len(result.all())

    async def items_write_each(self, conn: AsyncConnection, writes: Sequence[ItemWrite],
                               owner: str) -> list[bool]:
        """The batch UPDATE of :meth:`items_apply` inside the caller's transaction (one
        that also inserts what the writes spawn, and the keys they replace); returns,
        per write, whether it was applied.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed or refused a write.
        """
        if not writes:
            return []
        result = await conn.execute(self._update_for(writes), batch_params(writes, owner))
        applied = {number for (number,) in result.all()}
        return [number in applied for number in range(1, len(writes) + 1)]

    def _build_batch(self, parking: bool = False) -> Update:
        """The batch UPDATE from the JSON rows ``rows``; with ``parking``, rows with the
        wait's columns too (:func:`park_rows_json`)."""
        batch = func.jsonb_array_elements(jsonb_param("rows")).table_valued(
            column("value", JSONB), with_ordinality="n").render_derived(name="v")
        row = batch.c.value
        wait = None
        if parking:
            wait = WaitSource(row[10].as_string(), row[11].as_float(), row[12].as_string(),
                              row[13].as_string())
        source = ResultSource(
            partition_id=row[0].as_string(), item_id=row[1].as_string(),
            seen=row[2].as_integer(), status=row[3].as_string(), gate=row[4].as_integer(),
            attempts=row[5].as_integer(), error=row[6].as_string(),
            data=func.decode(row[7].as_string(), "hex"), delay=row[8].as_float(),
            history=row[9].as_string(), wait=wait)
        # Each applied row's place in the batch (the same item twice in a batch is
        # written once: only the write that was applied says so).
        return self.statements.result_write(source).returning(batch.c.n)

    def _build_park(self) -> Select[Any]:
        """The parking UPDATE (:meth:`_build_batch` with ``parking``) as a data-modifying
        ``WITH``, and an ``INSERT`` into ``waits`` of the rows of the JSON parameter
        ``waits`` (:func:`wait_rows_json`: the keys the writes replace) whose write it
        applied, matched on their place in the batch: a write the guard or the fence
        refused replaces nothing. One statement, atomic by itself; it returns the
        applied places, as the batch does."""
        waits = self.statements.tables.waits
        applied = self.park_update.cte("applied")
        rows = func.jsonb_array_elements(jsonb_param("waits")).table_valued(
            column("value", JSONB)).render_derived(name="w")
        row = rows.c.value
        chosen = (select(row[WAIT_TOKEN].as_string(), row[1].as_string(), row[2].as_string(),
                         row[3].as_integer(), row[WAIT_TIMEOUT].as_float(),
                         row[WAIT_POLICY].as_string(), row[WAIT_TRACEPARENT].as_string(),
                         self.statements.now)
                  .select_from(applied.join(rows, applied.c.n == row[0].as_integer())))
        kept = insert(waits).from_select(
            ["token", "partition_id", "item_id", "version", "timeout", "on_timeout",
             "traceparent", "created_at"], chosen).cte("kept")
        return select(applied.c.n).add_cte(kept)

    # -- wake-ups -----------------------------------------------------------

    async def notify(self, conn: AsyncConnection, channel: str, partition_id: str) -> None:
        """``pg_notify`` in the writer's transaction: delivered only if it commits.
        Nothing behind a transaction pooler, where nobody listens."""
        if not self.notifies:
            return
        await conn.execute(select(func.pg_notify(channel, partition_id)))

    async def notifications(self, channel: str) -> AsyncIterator[str]:
        """Yield the partition ids notified on ``channel``, as their transactions commit.

        Holds one dedicated connection with ``LISTEN``. Raises the driver's
        error when the connection fails; the caller reconnects. Raises
        ``NotImplementedError`` behind a transaction pooler (see :attr:`notifies`).
        """
        import psycopg
        from psycopg import sql

        if not self.notifies:
            raise NotImplementedError(f"no notifications: {self.polling_reason}")
        url = pooler.without_option(self.engine.url).set(drivername="postgresql")
        async with await psycopg.AsyncConnection.connect(
                url.render_as_string(hide_password=False), autocommit=True,
                **connect_options(self.timeout, url.query)) as conn:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            async for notice in conn.notifies():
                yield notice.payload
