"""Creating the async engine, with the per-database settings statefeed relies on."""

from __future__ import annotations

import asyncio
import math
import sqlite3
import time
from typing import Any

from sqlalchemy import event
from sqlalchemy.dialects import registry
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.util import await_only

from watcher.config import DEFAULT_DB_TIMEOUT
from watcher.dburl import DatabaseURL, require_driver
from watcher.errors import ConfigError

# SQL Server's engine driver: pymssql in a worker thread per connection.
registry.register("mssql.pymssql_threaded", "watcher.threaded_driver", "MSDialectThreaded_pymssql")

SQLITE_BUSY_TIMEOUT_SECONDS = 30.0
SQLITE_SYNCHRONOUS = "FULL"
POOL_SIZE = 10
POOL_MAX_OVERFLOW = 10
MYSQL_ISOLATION_LEVEL = "READ COMMITTED"
# statefeed's transactions never wait on anything but the database, so a session
# idle inside one this long belongs to a frozen or cut-off process; PostgreSQL
# ends it, which frees the rows it locked for the processors taking over.
STUCK_TRANSACTION_SECONDS = 5.0
# The optional dependency group ("extra") that installs each database's drivers.
DRIVER_EXTRAS = {"mysql": "mysql", "mariadb": "mysql", "mssql": "mssql"}


def create_engine(url: DatabaseURL, *, echo: bool = False,
                  timeout: float = DEFAULT_DB_TIMEOUT) -> AsyncEngine:
    """Create the async engine for ``url``.

    On PostgreSQL and MariaDB/MySQL the server ends a statement (or a lock wait)
    after ``timeout`` seconds; connects are bounded by it too, and TCP keepalives
    notice a vanished peer (:mod:`watcher.round_trips` bounds the rest).

    SQLite runs in WAL mode and starts every transaction with ``BEGIN IMMEDIATE``
    (reads marked ``sqlite_read`` use a plain ``BEGIN``), so that two writers
    queue on the busy timeout instead of failing when a read lock is upgraded.
    Its commits are synced to disk (``synchronous=FULL``): what the engine
    writes (a client's partitions and items, leases, gate moves) survives a
    power loss once acknowledged. (The SQLite driver's own connection, which
    writes item results, commits more cheaply: see
    :mod:`watcher.drivers.sqlite_direct`.)
    PostgreSQL ends sessions left idle inside a transaction for
    :data:`STUCK_TRANSACTION_SECONDS`. MySQL and MariaDB run at READ COMMITTED;
    SQL Server at its default READ COMMITTED, through pymssql in a worker
    thread per connection.

    Raises:
        ConfigError: the database's driver is not installed.
    """
    require_driver(url)
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
    options: dict[str, Any] = {}
    if url.dialect in ("mysql", "mariadb"):
        # InnoDB defaults to REPEATABLE READ: a transaction's reads come from the snapshot
        # of its first read, and guarded UPDATEs take gap/next-key locks that deadlock
        # concurrent writers. statefeed's guarded writes (version = :seen) want the latest
        # committed row and record locks only, which is READ COMMITTED.
        options["isolation_level"] = MYSQL_ISOLATION_LEVEL
        if "connect_timeout" not in url.async_url.query:
            options["connect_args"] = {"connect_timeout": timeout}
    elif url.dialect == "mssql":
        # READ COMMITTED is SQL Server's default; with READ_COMMITTED_SNAPSHOT on (see
        # docs/how-to/databases.md) it reads row versions and readers never block
        # writers. use_datetime2 sends datetimes with microseconds instead of DATETIME's
        # 1/300 s.
        # pymssql bounds each query and the login itself (whole seconds); a statement
        # in its worker thread cannot be interrupted from the event loop.
        seconds = max(1, math.ceil(timeout))
        options["connect_args"] = {"use_datetime2": True, "timeout": seconds,
                                   "login_timeout": seconds}
    elif url.dialect == "postgresql":
        from watcher.drivers.pg_direct import connect_options

        options["connect_args"] = connect_options(timeout, url.async_url.query)
    try:
        engine = create_async_engine(
            url.async_url,
            echo=echo,
            pool_size=POOL_SIZE,
            max_overflow=POOL_MAX_OVERFLOW,
            pool_pre_ping=True,
            **options,
        )
    except ImportError as error:
        extra = DRIVER_EXTRAS.get(url.dialect, "")
        raise ConfigError(
            f"the {url.dialect} driver is not installed ({error.name or error}); "
            f"install it with: pip install 'statefeed[{extra}]'"
        ) from None
    if url.dialect == "postgresql":
        _end_stuck_transactions(engine, timeout)
    elif url.dialect in ("mysql", "mariadb"):
        _bound_mysql_sessions(engine, timeout)
    return engine


def _end_stuck_transactions(engine: AsyncEngine, timeout: float) -> None:
    # A SET on each new connection rather than a startup option, which poolers
    # such as PgBouncer refuse.
    from watcher.drivers.pg_direct import statement_timeout

    milliseconds = int(STUCK_TRANSACTION_SECONDS * 1000)

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(f"SET idle_in_transaction_session_timeout = {milliseconds}")
        cursor.execute(statement_timeout(timeout))
        # psycopg prepares a statement after a few runs, and PostgreSQL may then
        # switch to a generic plan; for the guarded item write that plan can walk
        # the ready index over the whole partition instead of seeking the primary
        # key (seen on reduce pages: a tenfold slower write). Plan each run.
        cursor.execute("SET plan_cache_mode = force_custom_plan")
        cursor.close()
        dbapi_connection.commit()


def _bound_mysql_sessions(engine: AsyncEngine, timeout: float) -> None:
    from watcher.drivers.mysql_direct import session_timeouts, tune_keepalive

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        driver_connection = dbapi_connection.driver_connection
        tune_keepalive(driver_connection)
        mariadb = "MariaDB" in driver_connection.get_server_info()
        cursor = dbapi_connection.cursor()
        for setting in session_timeouts(timeout, mariadb):
            cursor.execute(setting)
        cursor.close()


def _configure_sqlite(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event decide how transactions start.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_SECONDS * 1000)}")
        _use_write_ahead_log(cursor)
        # In WAL mode NORMAL syncs the log only at checkpoints, so a commit acknowledged
        # just before a power loss could be rolled back; FULL syncs it at every commit.
        cursor.execute(f"PRAGMA synchronous={SQLITE_SYNCHRONOUS}")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        if connection.get_execution_options().get("sqlite_read"):
            connection.exec_driver_sql("BEGIN")
        else:
            connection.exec_driver_sql("BEGIN IMMEDIATE")


def _use_write_ahead_log(cursor: Any) -> None:
    """Put the database file in WAL mode, waiting while another connection writes.

    ``processor migrate`` sets WAL once; then this is a read that finds it set.
    On a file still in rollback-journal mode (migrated by an older release), the
    switch needs an exclusive lock, and SQLite reports "database is locked" at
    once, without its busy wait, while another connection holds a write lock.

    Raises:
        sqlite3.OperationalError: still locked after the busy timeout.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_SECONDS
    pause = 0.005
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() + pause > deadline:
                raise
        # The hook runs inside the async engine's greenlet: wait without blocking the loop.
        await_only(asyncio.sleep(pause))
        pause = min(pause * 2, 0.2)
