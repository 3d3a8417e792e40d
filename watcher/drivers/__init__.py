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

from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncEngine

from watcher.drivers.base import DirectDriver, Driver
from watcher.drivers.conflicts import is_lock_conflict
from watcher.drivers.mssql import SQLServerDriver
from watcher.drivers.mysql import MySQLDriver
from watcher.drivers.postgresql import PostgreSQLDriver
from watcher.drivers.sql import clock_now, db_now, db_now_plus, lock_unless_busy, time_plus
from watcher.drivers.sqlite import SQLiteDriver
from watcher.errors import ConfigError
from watcher.round_trips import DEFAULT_DB_TIMEOUT

if TYPE_CHECKING:
    from watcher.store import Statements

# SQLAlchemy dialect name -> driver class.
DRIVERS: dict[str, type[Driver]] = {
    "sqlite": SQLiteDriver,
    "postgresql": PostgreSQLDriver,
    "mysql": MySQLDriver,
    "mariadb": MySQLDriver,
    "mssql": SQLServerDriver,
}


def driver_class(dialect_name: str) -> type[Driver]:
    """The driver class for a SQLAlchemy dialect name.

    Raises:
        ConfigError: statefeed has no driver for this database.
    """
    try:
        return DRIVERS[dialect_name]
    except KeyError:
        supported = ", ".join(sorted(DRIVERS))
        raise ConfigError(
            f"statefeed does not support the {dialect_name!r} database; "
            f"use one of: {supported}") from None


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
