"""Per-database drivers: what differs between databases, each in its own module.

A store opens one driver, once, from its engine's dialect
(:func:`open_driver`); store code never branches on the database. Each
database's module registers how it renders the clock (:mod:`.sql`) and
defines its driver class:

- :mod:`.sqlite` (SQLite): the hot statements on a ``sqlite3`` connection of its
  own, from the event loop's thread (:mod:`.sqlite_direct`); a batch of results
  in one ``executemany``.
- :mod:`.postgresql` (PostgreSQL): the hot statements through psycopg directly
  (:mod:`.pg_direct`); a batch in one ``UPDATE ... jsonb_array_elements``;
  LISTEN/NOTIFY.
- :mod:`.mysql` (MariaDB, MySQL): the hot statements through aiomysql directly
  (:mod:`.mysql_direct`); a batch in one ``UPDATE ... JSON_TABLE``.
- :mod:`.mssql` (SQL Server, compiled only: no server in CI): a batch in one
  ``UPDATE ... OPENJSON ... OUTPUT`` through the engine; the rest portable.

The portable implementation and the interface are :class:`~.base.Driver`;
:class:`~.base.DirectDriver` is the base of the drivers with a direct path.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from watcher.config import DEFAULT_DB_TIMEOUT
from watcher.drivers.base import DirectDriver, Driver
from watcher.drivers.conflicts import is_lock_conflict
from watcher.drivers.sql import clock_now, db_now, db_now_plus, lock_unless_busy, time_plus
from watcher.errors import ConfigError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from watcher.drivers.mssql import SQLServerDriver
    from watcher.drivers.mysql import MySQLDriver
    from watcher.drivers.postgresql import PostgreSQLDriver
    from watcher.drivers.sqlite import SQLiteDriver
    from watcher.statements import Statements

# SQLAlchemy dialect name -> the module and name of its driver class. A driver module is
# imported only when its database is used: the MariaDB one loads aiomysql, which a plain
# install (without the mysql extra) does not have.
DRIVERS: dict[str, tuple[str, str]] = {
    "sqlite": ("sqlite", "SQLiteDriver"),
    "postgresql": ("postgresql", "PostgreSQLDriver"),
    "mysql": ("mysql", "MySQLDriver"),
    "mariadb": ("mysql", "MySQLDriver"),
    "mssql": ("mssql", "SQLServerDriver"),
}
_CLASSES = {name: module for module, name in DRIVERS.values()}


def __getattr__(name: str) -> Any:
    # The driver classes stay importable from the package (``from watcher.drivers import
    # MySQLDriver``), loaded on first use.
    module = _CLASSES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def driver_class(dialect_name: str) -> type[Driver]:
    """The driver class for a SQLAlchemy dialect name.

    Raises:
        ConfigError: statefeed has no driver for this database.
    """
    try:
        module, name = DRIVERS[dialect_name]
    except KeyError:
        supported = ", ".join(sorted(DRIVERS))
        raise ConfigError(
            f"statefeed does not support the {dialect_name!r} database; "
            f"use one of: {supported}") from None
    driver: type[Driver] = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    return driver


def open_driver(engine: AsyncEngine, statements: Statements, *,
                timeout: float = DEFAULT_DB_TIMEOUT) -> Driver:
    """The driver for ``engine``'s database, building on the store's ``statements``;
    ``timeout`` bounds each round trip (seconds).

    Raises:
        ConfigError: statefeed has no driver for this database.
    """
    return driver_class(engine.dialect.name)(engine, statements, timeout=timeout)


__all__ = [
    "DRIVERS",
    "DirectDriver",
    "Driver",
    "MySQLDriver",
    "PostgreSQLDriver",
    "SQLServerDriver",
    "SQLiteDriver",
    "clock_now",
    "db_now",
    "db_now_plus",
    "driver_class",
    "is_lock_conflict",
    "lock_unless_busy",
    "open_driver",
    "time_plus",
]
