"""SQLite: the clock as text, and the portable driver.

SQLite has no time type: SQLAlchemy stores times as text with six fractional
digits, and comparisons order them as text, so the clock renders that same
form. Its arithmetic keeps milliseconds (``strftime``'s ``%f``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.compiler import compiles

from watcher.drivers.base import Driver
from watcher.drivers.sql import data_size, db_now, time_plus, time_plus_parts

SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"


@compiles(db_now, "sqlite")
def _now(element: db_now, compiler: Any, **kw: Any) -> str:
    # Six fractional digits, the same text form SQLAlchemy stores, so that
    # comparisons between stored and computed times order correctly as text.
    return f"({SQLITE_NOW} || '000')"


@compiles(data_size, "sqlite")
def _size(element: data_size, compiler: Any, **kw: Any) -> str:
    # length() of a BLOB counts bytes (OCTET_LENGTH came only in SQLite 3.43).
    return f"length({compiler.process(element.clauses, **kw)})"


@compiles(time_plus, "sqlite")
def _plus(element: time_plus, compiler: Any, **kw: Any) -> str:
    base, seconds = time_plus_parts(element, compiler, **kw)
    return (
        f"(strftime('%Y-%m-%d %H:%M:%f', {base}, "
        f"printf('%+.3f seconds', {seconds})) || '000')"
    )


class SQLiteDriver(Driver):
    """SQLite: the portable driver (every statement through the engine, watchers poll)."""
