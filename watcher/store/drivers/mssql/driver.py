"""SQL Server: the clock, and the one-statement result write.

A batch of results is one guarded ``UPDATE ... OUTPUT inserted.partition_id,
inserted.id FROM items, OPENJSON(...) WITH (...) AS v``, each row matched on
its version and fenced on the lease, the rows travelling as one JSON text:
the shape of PostgreSQL's batch write, with ``OUTPUT`` for ``RETURNING``. It
goes through the engine (pymssql has no asyncio path to go around it);
everything else is the portable driver's.

No SQL Server runs in CI: what this module renders is checked by compilation
(``tests/unit/test_dialects.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, literal_column
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import Update

from watcher.config import DEFAULT_DB_TIMEOUT
from watcher.records import ItemWrite
from watcher.store.drivers.base import Driver, write_transaction
from watcher.store.drivers.conflicts import error_number
from watcher.store.drivers.mssql.columns import ID_COLLATION
from watcher.store.drivers.sql import (
    batch_params,
    batch_rows,
    batch_table,
    clock_now,
    clock_parameter,
    data_size,
    db_now,
    json_texts,
    park_rows,
    park_table,
    parks,
    time_plus,
)
from watcher.store.sql.shared import Statements
from watcher.store.sql.sources import ResultSource, WaitSource

NOW = "SYSUTCDATETIME()"


@compiles(db_now, "mssql")
def _now(element: db_now, compiler: Any, **kw: Any) -> str:
    return NOW


@compiles(clock_now, "mssql")
def _clock(element: clock_now, compiler: Any, **kw: Any) -> str:
    # pymssql sends a time as a quoted string: the cast keeps the result a DATETIME2(6).
    parameter = clock_parameter(element, compiler, **kw)
    return f"COALESCE(CAST({parameter} AS DATETIME2(6)), {NOW})"


@compiles(time_plus, "mssql")
def _plus(element: time_plus, compiler: Any, **kw: Any) -> str:
    # DATEADD takes an INT: milliseconds alone overflow after 24.8 days, so add whole
    # seconds (good for 68 years) and then the fraction in microseconds (DATETIME2(6)).
    # The seconds are compiled once per use, so positional drivers get them each time.
    base_clause, seconds_clause = element.clauses.clauses

    def seconds() -> str:
        return compiler.process(seconds_clause, **kw)

    whole = f"FLOOR({seconds()})"
    fraction = f"(({seconds()}) - FLOOR({seconds()}))"
    base = compiler.process(base_clause, **kw)
    return (
        f"DATEADD(microsecond, CAST({fraction} * 1000000 AS INT), "
        f"DATEADD(second, CAST({whole} AS INT), {base}))"
    )


@compiles(data_size, "mssql")
def _size(element: data_size, compiler: Any, **kw: Any) -> str:
    return f"DATALENGTH({compiler.process(element.clauses, **kw)})"


# The batch rows' columns (watcher.store.drivers.sql.BATCH_COLUMNS), in OPENJSON's terms.
BATCH_COLUMNS = ", ".join((
    "pid NVARCHAR(255) '$[0]'", "iid NVARCHAR(255) '$[1]'", "seen BIGINT '$[2]'",
    "status NVARCHAR(16) '$[3]'", "gate BIGINT '$[4]'", "attempts BIGINT '$[5]'",
    "error NVARCHAR(max) '$[6]'", "data VARCHAR(max) '$[7]'", "delay FLOAT '$[8]'",
    "history NVARCHAR(max) '$[9]'"))


# A parking batch's rows add the wait's (watcher.store.drivers.sql.PARK_COLUMNS).
PARK_COLUMNS = ", ".join((
    BATCH_COLUMNS, "wkey NVARCHAR(255) '$[10]'", "wtimeout FLOAT '$[11]'",
    "wpolicy NVARCHAR(16) '$[12]'", "wtrace NVARCHAR(255) '$[13]'"))


@compiles(batch_rows, "mssql")
def _batch_rows(element: batch_rows, compiler: Any, **kw: Any) -> str:
    return f"OPENJSON({compiler.process(element.clauses, **kw)}) WITH ({BATCH_COLUMNS})"


@compiles(park_rows, "mssql")
def _park_rows(element: park_rows, compiler: Any, **kw: Any) -> str:
    return f"OPENJSON({compiler.process(element.clauses, **kw)}) WITH ({PARK_COLUMNS})"


@compiles(json_texts, "mssql")
def _texts(element: json_texts, compiler: Any, **kw: Any) -> str:
    return f"OPENJSON({compiler.process(element.clauses, **kw)}) WITH (value NVARCHAR(255) '$')"


# Errors refusing a value: string or binary data truncated (8152, 2628), arithmetic
# overflow (8115), conversion failed (245, 241), cannot insert NULL (515).
VALUE_REFUSALS = frozenset({8152, 2628, 8115, 245, 241, 515})


class SQLServerDriver(Driver):
    """SQL Server: a batch of results in one ``UPDATE ... OPENJSON ... OUTPUT``; the rest
    portable. Its ready read keeps the literal limit (``TOP n``) and its clock is
    ``SYSUTCDATETIME()``; watchers poll."""

    def __init__(self, engine: AsyncEngine, statements: Statements, *,
                 timeout: float = DEFAULT_DB_TIMEOUT) -> None:
        super().__init__(engine, statements, timeout=timeout)
        self.batch_statement = self._build_batch()
        self.park_statement = self._build_batch(parking=True)

    def round_trip_bound(self) -> None:
        """pymssql bounds its own queries and logins
        (:func:`watcher.store.db.engine.create_engine`); its worker
        thread cannot be interrupted from the event loop."""
        return None

    def refuses_value(self, error: BaseException) -> bool:
        """See :meth:`Driver.refuses_value`; adds SQL Server's value error numbers."""
        if super().refuses_value(error):
            return True
        return error_number(getattr(error, "orig", None)) in VALUE_REFUSALS

    async def items_apply(self, writes: Sequence[ItemWrite], owner: str) -> list[bool]:
        """The whole batch as one guarded UPDATE; ``OUTPUT`` tells which rows were applied.
        A parking write's wait goes in its item's row; the keys that the applied ones
        replace follow in the same transaction (:meth:`Driver.replaced_waits_in`).

        Raises:
            sqlalchemy.exc.DBAPIError: the database failed or refused a write
                (then none of the batch is written).
        """
        async with write_transaction(self.engine) as conn:
            statement = self.park_statement if parks(writes) else self.batch_statement
            rows = (await conn.execute(statement, batch_params(writes, owner))).all()
            keys = {(pid, iid) for pid, iid in rows}
            applied = [(w.partition_id, w.item_id) in keys for w in writes]
            await self.replaced_waits_in(conn, writes, applied)
        return applied

    def _build_batch(self, parking: bool = False) -> Update:
        """The batch UPDATE from the JSON rows ``rows``; with ``parking``, rows with the
        wait's columns too."""
        v = (park_table if parking else batch_table)("rows").c
        items = self.statements.tables.items
        data = func.convert(literal_column("VARBINARY(max)"), v.data, literal_column("2"))
        source = ResultSource(
            partition_id=v.pid.collate(ID_COLLATION), item_id=v.iid.collate(ID_COLLATION),
            seen=v.seen, status=v.status, gate=v.gate, attempts=v.attempts, error=v.error,
            data=data, delay=v.delay, history=v.history,
            wait=WaitSource(v.wkey.collate(ID_COLLATION), v.wtimeout, v.wpolicy,
                            v.wtrace) if parking else None)
        return self.statements.result_write(source).returning(items.c.partition_id, items.c.id)
