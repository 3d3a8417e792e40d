"""Creating the async engine, with the per-database settings statefeed relies on."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from watcher.dburl import DatabaseURL

SQLITE_BUSY_TIMEOUT_SECONDS = 30.0
POOL_SIZE = 10
POOL_MAX_OVERFLOW = 10


def create_engine(url: DatabaseURL, *, echo: bool = False) -> AsyncEngine:
    """Create the async engine for ``url``.

    SQLite runs in WAL mode and starts every transaction with ``BEGIN IMMEDIATE``
    (reads marked ``sqlite_read`` use a plain ``BEGIN``), so that two writers
    queue on the busy timeout instead of failing when a read lock is upgraded.
    """
    if url.dialect == "sqlite":
        engine = create_async_engine(
            url.async_url,
            echo=echo,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS},
            pool_size=POOL_SIZE,
            max_overflow=POOL_MAX_OVERFLOW,
        )
        _configure_sqlite(engine)
        return engine
    return create_async_engine(
        url.async_url,
        echo=echo,
        pool_size=POOL_SIZE,
        max_overflow=POOL_MAX_OVERFLOW,
        pool_pre_ping=True,
    )


def _configure_sqlite(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event decide how transactions start.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_SECONDS * 1000)}")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        if connection.get_execution_options().get("sqlite_read"):
            connection.exec_driver_sql("BEGIN")
        else:
            connection.exec_driver_sql("BEGIN IMMEDIATE")
