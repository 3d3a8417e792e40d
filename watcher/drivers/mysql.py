"""MariaDB and MySQL: the clock, and the portable driver."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.compiler import compiles

from watcher.drivers.base import Driver
from watcher.drivers.sql import clock_now, clock_parameter, db_now, time_plus, time_plus_parts

NOW = "UTC_TIMESTAMP(6)"


@compiles(db_now, "mysql")
@compiles(db_now, "mariadb")
def _now(element: db_now, compiler: Any, **kw: Any) -> str:
    return NOW


@compiles(clock_now, "mysql")
@compiles(clock_now, "mariadb")
def _clock(element: clock_now, compiler: Any, **kw: Any) -> str:
    # The driver sends a time as a quoted string: cast it, or COALESCE answers text
    # (and a cast without (6) would drop the microseconds).
    parameter = clock_parameter(element, compiler, **kw)
    return f"COALESCE(CAST({parameter} AS DATETIME(6)), {NOW})"


@compiles(time_plus, "mysql")
@compiles(time_plus, "mariadb")
def _plus(element: time_plus, compiler: Any, **kw: Any) -> str:
    base, seconds = time_plus_parts(element, compiler, **kw)
    return f"({base} + INTERVAL CAST(({seconds}) * 1000000 AS SIGNED) MICROSECOND)"


# Server errors refusing a value: packet too large, data too long, incorrect
# string value, out of range, incorrect datetime, invalid JSON, column cannot be null.
VALUE_REFUSALS = frozenset({1153, 1406, 1366, 1264, 1292, 3140, 1048})


class MySQLDriver(Driver):
    """MariaDB and MySQL: the portable driver (every statement through the engine,
    watchers poll)."""

    def refuses_value(self, error: BaseException) -> bool:
        """See :meth:`Driver.refuses_value`; adds the server's value error numbers."""
        if super().refuses_value(error):
            return True
        args = getattr(getattr(error, "orig", None), "args", ())
        return bool(args) and isinstance(args[0], int) and args[0] in VALUE_REFUSALS
