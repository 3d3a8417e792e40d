"""Per-database drivers: what differs between databases, one package per database.

A store opens one driver, once, from its engine's dialect
(:func:`open_driver`); store code never branches on the database. Each
database's package holds its engine settings (``engine``), its driver class
(``driver``: the clock, the refusals, the result write), its direct hot path
where it has one, and, in its ``__init__``, its URL schemes and the packages it
needs:

- :mod:`.sqlite` (SQLite): the hot statements on a ``sqlite3`` connection of its
  own, from the event loop's thread; a batch of results in one ``executemany``.
- :mod:`.postgresql` (PostgreSQL): the hot statements through psycopg directly;
  a batch in one ``UPDATE ... jsonb_array_elements``; LISTEN/NOTIFY.
- :mod:`.mysql` (MariaDB, MySQL): the hot statements through aiomysql directly;
  a batch in one ``UPDATE ... JSON_TABLE``.
- :mod:`.mssql` (SQL Server, compiled only: no server in CI): pymssql on a
  thread per connection; a batch in one ``UPDATE ... OPENJSON ... OUTPUT``.

What they share: the interface and portable implementation
(:mod:`.base`), the SQL constructs each database renders its own way
(:mod:`.sql`), compiled statements (:mod:`.compiled`), the direct paths'
connection pool (:mod:`.pool`) and lock conflicts (:mod:`.conflicts`).

This module imports no database's code: a package is loaded when its database
is used (the MariaDB one loads aiomysql, which a plain install does not have).
The drivers may import :mod:`watcher.store.db`, :mod:`watcher.store.sql`, the store's
shared values (:mod:`watcher.store.codecs`), the pure rules and the engine's shared
top-level modules; never the store's entity modules, nor anything above the store.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

from watcher.config import DEFAULT_DB_TIMEOUT
from watcher.errors import ConfigError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from watcher.store.drivers.base import Driver
    from watcher.store.sql.shared import Statements

# The database packages, by name.
PACKAGES = ("sqlite", "postgresql", "mysql", "mssql")
# SQLAlchemy dialect name -> the package and name of its driver class.
DRIVERS: dict[str, tuple[str, str]] = {
    "sqlite": ("sqlite", "SQLiteDriver"),
    "postgresql": ("postgresql", "PostgreSQLDriver"),
    "mysql": ("mysql", "MySQLDriver"),
    "mariadb": ("mysql", "MySQLDriver"),
    "mssql": ("mssql", "SQLServerDriver"),
}


def database_package(dialect_name: str, part: str = "") -> ModuleType:
    """The package for a SQLAlchemy dialect name, or one of its modules (``part``:
    ``engine``, ``driver``...).

    Raises:
        ConfigError: statefeed has no driver for this database.
    """
    try:
        package, _ = DRIVERS[dialect_name]
    except KeyError:
        supported = ", ".join(sorted(DRIVERS))
        raise ConfigError(
            f"statefeed does not support the {dialect_name!r} database; "
            f"use one of: {supported}") from None
    name = f"{__name__}.{package}" + (f".{part}" if part else "")
    return importlib.import_module(name)


def driver_class(dialect_name: str) -> type[Driver]:
    """The driver class for a SQLAlchemy dialect name.

    Raises:
        ConfigError: statefeed has no driver for this database.
    """
    module = database_package(dialect_name, "driver")
    driver: type[Driver] = getattr(module, DRIVERS[dialect_name][1])
    return driver


def open_driver(engine: AsyncEngine, statements: Statements, *,
                timeout: float = DEFAULT_DB_TIMEOUT) -> Driver:
    """The driver for ``engine``'s database, building on the store's ``statements``;
    ``timeout`` bounds each round trip (seconds).

    Raises:
        ConfigError: statefeed has no driver for this database.
    """
    return driver_class(engine.dialect.name)(engine, statements, timeout=timeout)


__all__ = ["DRIVERS", "PACKAGES", "database_package", "driver_class", "open_driver"]
