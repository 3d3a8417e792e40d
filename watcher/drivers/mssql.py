"""SQL Server: the clock, and the portable driver.

No SQL Server runs in CI: what this module renders is checked by compilation
(``tests/unit/test_dialects.py``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.compiler import compiles

from watcher.drivers.base import Driver
from watcher.drivers.sql import clock_now, clock_parameter, data_size, db_now, time_plus

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
        return compiler.process(seconds_clause, **kw)  # type: ignore[no-any-return]

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


# Errors refusing a value: string or binary data truncated (8152, 2628), arithmetic
# overflow (8115), conversion failed (245, 241), cannot insert NULL (515).
VALUE_REFUSALS = frozenset({8152, 2628, 8115, 245, 241, 515})


class SQLServerDriver(Driver):
    """SQL Server: the portable driver. Its ready read keeps the literal limit
    (``TOP n``) and its clock is ``SYSUTCDATETIME()``; watchers poll."""

    def refuses_value(self, error: BaseException) -> bool:
        """See :meth:`Driver.refuses_value`; adds SQL Server's value error numbers."""
        if super().refuses_value(error):
            return True
        args = getattr(getattr(error, "orig", None), "args", ())
        return bool(args) and isinstance(args[0], int) and args[0] in VALUE_REFUSALS
