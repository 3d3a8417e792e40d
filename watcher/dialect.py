"""The one place where databases differ: the clock, its arithmetic and row locking.

``db_now()`` and ``db_now_plus(seconds)`` are SQL expressions that read the
*database* clock as a naive UTC timestamp, so lease expiry never depends on a
container's clock. ``lock_unless_busy(query, table)`` makes a SELECT lock the
rows it reads and pass by rows another session holds. Each dialect gets its
own compilation; the engine code never forks per database.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import DateTime, Float, Select, Table, bindparam
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import ColumnElement, FunctionElement

SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"


class db_now(FunctionElement[Any]):
    """The database's current UTC time."""

    type = DateTime()
    inherit_cache = True
    name = "db_now"


class db_now_plus(FunctionElement[Any]):
    """The database's current UTC time plus a number of seconds (fractions allowed)."""

    type = DateTime()
    inherit_cache = True
    name = "db_now_plus"

    def __init__(self, seconds: float | ColumnElement[Any]) -> None:
        if not isinstance(seconds, ColumnElement):
            seconds = bindparam(None, float(seconds), type_=Float())
        super().__init__(seconds)


@compiles(db_now)
def _now_default(element: db_now, compiler: Any, **kw: Any) -> str:
    return "CURRENT_TIMESTAMP"


@compiles(db_now, "postgresql")
def _now_postgresql(element: db_now, compiler: Any, **kw: Any) -> str:
    return "(now() AT TIME ZONE 'UTC')"


@compiles(db_now, "sqlite")
def _now_sqlite(element: db_now, compiler: Any, **kw: Any) -> str:
    # Six fractional digits, the same text form SQLAlchemy stores, so that
    # comparisons between stored and computed times order correctly as text.
    return f"({SQLITE_NOW} || '000')"


@compiles(db_now, "mssql")
def _now_mssql(element: db_now, compiler: Any, **kw: Any) -> str:
    return "SYSUTCDATETIME()"


@compiles(db_now, "mysql")
@compiles(db_now, "mariadb")
def _now_mysql(element: db_now, compiler: Any, **kw: Any) -> str:
    return "UTC_TIMESTAMP(6)"


def _seconds(element: db_now_plus, compiler: Any, **kw: Any) -> str:
    (argument,) = element.clauses.clauses
    return compiler.process(argument, **kw)


@compiles(db_now_plus, "postgresql")
def _plus_postgresql(element: db_now_plus, compiler: Any, **kw: Any) -> str:
    seconds = _seconds(element, compiler, **kw)
    return f"((now() AT TIME ZONE 'UTC') + make_interval(secs => {seconds}))"


@compiles(db_now_plus, "sqlite")
def _plus_sqlite(element: db_now_plus, compiler: Any, **kw: Any) -> str:
    seconds = _seconds(element, compiler, **kw)
    return (
        "(strftime('%Y-%m-%d %H:%M:%f', 'now', "
        f"printf('%+.3f seconds', {seconds})) || '000')"
    )


@compiles(db_now_plus, "mssql")
def _plus_mssql(element: db_now_plus, compiler: Any, **kw: Any) -> str:
    # DATEADD takes an INT: milliseconds alone overflow after 24.8 days, so add whole
    # seconds (good for 68 years) and then the fraction in microseconds (DATETIME2(6)).
    # The argument is compiled once per use, so positional drivers get it each time.
    def seconds() -> str:
        return _seconds(element, compiler, **kw)

    whole = f"FLOOR({seconds()})"
    fraction = f"(({seconds()}) - FLOOR({seconds()}))"
    return (
        f"DATEADD(microsecond, CAST({fraction} * 1000000 AS INT), "
        f"DATEADD(second, CAST({whole} AS INT), SYSUTCDATETIME()))"
    )


@compiles(db_now_plus, "mysql")
@compiles(db_now_plus, "mariadb")
def _plus_mysql(element: db_now_plus, compiler: Any, **kw: Any) -> str:
    seconds = _seconds(element, compiler, **kw)
    return f"(UTC_TIMESTAMP(6) + INTERVAL CAST(({seconds}) * 1000000 AS SIGNED) MICROSECOND)"


@compiles(db_now_plus)
def _plus_default(element: db_now_plus, compiler: Any, **kw: Any) -> str:
    raise NotImplementedError(
        f"statefeed has no clock arithmetic for the {compiler.dialect.name!r} database"
    )


def lock_unless_busy(query: Select[Any], table: Table) -> Select[Any]:
    """``query`` locking the rows of ``table`` it reads, skipping rows locked elsewhere.

    PostgreSQL and MySQL/MariaDB render ``FOR UPDATE SKIP LOCKED``, SQL Server
    the ``UPDLOCK, ROWLOCK, READPAST`` hints. SQLite locks the whole database
    per write transaction, so the clause does not apply there.
    """
    return (query.with_for_update(skip_locked=True)
            .with_hint(table, "WITH (UPDLOCK, ROWLOCK, READPAST)", "mssql"))


# Errors by which a database aborts one transaction to resolve a lock conflict:
# PostgreSQL deadlock / serialization failure, MySQL deadlock / lock wait
# timeout, SQL Server deadlock victim. Retrying the transaction is the remedy.
_CONFLICT_SQLSTATES = {"40P01", "40001"}
_CONFLICT_CODES = {1213, 1205}


def is_lock_conflict(error: BaseException) -> bool:
    """Whether ``error`` (a SQLAlchemy error) is a deadlock or lock timeout, not an outage."""
    orig = getattr(error, "orig", None)
    if orig is None:
        return False
    if getattr(orig, "sqlstate", None) in _CONFLICT_SQLSTATES:
        return True
    args = getattr(orig, "args", ())
    return bool(args) and isinstance(args[0], int) and args[0] in _CONFLICT_CODES
