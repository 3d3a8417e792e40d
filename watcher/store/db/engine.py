"""Creating the async engine: the pool settings every database shares, and each
database's own settings from its package (``watcher.store.drivers.<database>.engine``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from watcher.config import DEFAULT_DB_TIMEOUT
from watcher.errors import ConfigError
from watcher.store.db.urls import DatabaseURL, require_driver
from watcher.store.drivers import database_package

POOL_SIZE = 10
POOL_MAX_OVERFLOW = 10


def create_engine(url: DatabaseURL, *, echo: bool = False,
                  timeout: float = DEFAULT_DB_TIMEOUT) -> AsyncEngine:
    """Create the async engine for ``url``, with its database's settings.

    On PostgreSQL and MariaDB/MySQL the server ends a statement (or a lock wait)
    after ``timeout`` seconds; connects are bounded by it too, and TCP keepalives
    notice a vanished peer (:mod:`watcher.store.db.round_trips` bounds the rest). What
    each database sets, and why, is in its package's ``engine`` module:
    :mod:`watcher.store.drivers.sqlite.engine`, :mod:`watcher.store.drivers.postgresql.engine`,
    :mod:`watcher.store.drivers.mysql.engine`, :mod:`watcher.store.drivers.mssql.engine`.

    Raises:
        ConfigError: the database is not supported, or its driver is not installed.
    """
    require_driver(url)
    settings = database_package(url.dialect, "engine")
    options: dict[str, Any] = settings.engine_options(url, timeout)
    try:
        engine = create_async_engine(url.async_url, echo=echo, pool_size=POOL_SIZE,
                                     max_overflow=POOL_MAX_OVERFLOW, **options)
    except ImportError as error:
        extra = database_package(url.dialect).EXTRA
        raise ConfigError(
            f"the {url.dialect} driver is not installed ({error.name or error}); "
            f"install it with: pip install 'statefeed[{extra}]'"
        ) from None
    settings.configure(engine, timeout)
    return engine
