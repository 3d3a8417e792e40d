"""Per-database drivers: what differs between databases, each in its own module.

A store opens one driver, once, from its engine's dialect
(:func:`open_driver`); store code never branches on the database. Each
database's module registers how it renders the clock (:mod:`.sql`) and
defines its driver class:

| module | database | driver |
|---|---|---|
| :mod:`.sqlite` | SQLite | portable |
| :mod:`.postgresql` | PostgreSQL | direct psycopg path, one-statement batch write, LISTEN/NOTIFY |
| :mod:`.mysql` | MariaDB, MySQL | portable |
| :mod:`.mssql` | SQL Server | portable (compiled only: no server in CI) |

The portable implementation and the interface are :class:`~.base.Driver`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncEngine

from watcher.drivers.base import Driver
from watcher.drivers.conflicts import is_lock_conflict
from watcher.drivers.mssql import SQLServerDriver
from watcher.drivers.mysql import MySQLDriver
from watcher.drivers.postgresql import PostgreSQLDriver
from watcher.drivers.sql import clock_now, db_now, db_now_plus, lock_unless_busy, time_plus
from watcher.drivers.sqlite import SQLiteDriver
from watcher.errors import ConfigError

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


def open_driver(engine: AsyncEngine, statements: Statements) -> Driver:
    """The driver for ``engine``'s database, building on the store's ``statements``.

    Raises:
        ConfigError: statefeed has no driver for this database.
    """
    return driver_class(engine.dialect.name)(engine, statements)


__all__ = [
    "DRIVERS",
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
