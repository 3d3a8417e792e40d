"""Sending the engine's hottest statements to PostgreSQL through psycopg directly.

SQLAlchemy's async engine spends several times a statement's own cost on one
transaction (pool checkout with a ping, BEGIN, the statement and COMMIT, each
across a greenlet switch); one autocommit statement on an open psycopg
connection costs a fraction of that (docs/explanation/how-it-works.md gives the figures). The
statements themselves stay SQLAlchemy constructs, built by the store and the
PostgreSQL driver (:mod:`watcher.drivers.postgresql`); this
module compiles each once for the store's dialect and sends it. Only single
statements come here, each atomic by itself, so autocommit takes nothing from
their guarantees.

The connections are kept in a small pool of its own rather than psycopg_pool:
the engine already retries and backs off on outages and reports each outage
once, and that pool instead waits for a connection in the background, up to a
timeout, and logs a warning for every connection a server restart kills.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import psycopg
from sqlalchemy.engine import URL, Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ClauseElement

from watcher.config import DEFAULT_DB_TIMEOUT
from watcher.drivers.compiled import StatementCache

log = logging.getLogger(__name__)

# Connections the hot path may hold at once (the SQLAlchemy engine has its own).
MAX_CONNECTIONS = 4
# TCP keepalives, so that a connection whose peer vanished (a failover, a half-open
# connection) fails within idle + interval * count seconds even while idle.
KEEPALIVE_IDLE = 10
KEEPALIVE_INTERVAL = 5
KEEPALIVE_COUNT = 3


def connect_options(timeout: float, given: Collection[str] = ()) -> dict[str, Any]:
    """libpq connection options bounding a connection's waits by ``timeout`` seconds:
    the connect (``connect_timeout``, 2 at least), TCP keepalives, and unacknowledged
    data (``tcp_user_timeout``). Options the URL sets (``given``) are left to it."""
    options: dict[str, Any] = {
        "connect_timeout": max(2, math.ceil(timeout)), "keepalives": 1,
        "keepalives_idle": KEEPALIVE_IDLE, "keepalives_interval": KEEPALIVE_INTERVAL,
        "keepalives_count": KEEPALIVE_COUNT, "tcp_user_timeout": int(timeout * 1000)}
    return {key: value for key, value in options.items() if key not in given}


def statement_timeout(timeout: float) -> str:
    """The SET that makes the server end a statement (or a lock wait) after ``timeout``
    seconds; a SET rather than a startup option, which poolers such as PgBouncer refuse."""
    return f"SET statement_timeout = {max(1, int(timeout * 1000))}"


class DirectStatements:
    """Runs compiled single statements on a few autocommit psycopg connections.

    A statement that fails because an idle pooled connection had died (the
    server restarted, or ended the session) is sent once more on a new
    connection, as a pool's pre-ping would have arranged. The server ends a
    statement after ``timeout`` seconds; a statement interrupted (by the
    store's round-trip bound) closes its connection. ``listeners`` are
    called with each statement's text as it is sent (the benchmark counts
    statements this way).
    """

    def __init__(self, url: URL, dialect: Dialect, *, timeout: float = DEFAULT_DB_TIMEOUT,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self._conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._dialect = dialect
        self._options = connect_options(timeout, url.query)
        self._statement_timeout = statement_timeout(timeout)
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._closed = False
        self._compiled = StatementCache(dialect)
        self.listeners: list[Callable[[str], None]] = []

    async def fetch(self, statement: ClauseElement, params: Mapping[str, Any]
                    ) -> Sequence[tuple[Any, ...]]:
        """Run ``statement`` with ``params``; returns its rows (none for a plain write).

        Raises:
            sqlalchemy.exc.DBAPIError: the database failed or refused it, or
                could not be reached: the same types the SQLAlchemy engine
                raises, with the parameters hidden.
        """
        compiled = self._compiled[statement]
        sql = compiled.sql
        for listener in self.listeners:
            listener(sql)
        values = compiled.values(params)
        try:
            async with self._slots:
                return await self._run(sql, values)
        except psycopg.Error as error:
            raise DBAPIError.instance(sql, None, error, psycopg.Error, hide_parameters=True,
                                      dialect=self._dialect) from None

    async def _run(self, sql: str, values: dict[str, Any]) -> Sequence[tuple[Any, ...]]:
        while True:
            reused = bool(self._idle)
            conn = self._idle.pop() if reused else await self._connect()
            try:
                cursor = await conn.execute(sql, values)
                rows = await cursor.fetchall() if cursor.description else []
            except psycopg.Error:
                if not conn.broken:  # the statement failed; the connection is fine
                    await self._give_back(conn)
                    raise
                await conn.close()
                if not reused:
                    raise
                log.debug("action=direct_connection_dead; sending again on a new connection")
                continue
            except BaseException:  # cancelled mid-statement: the session's state is unknown
                await conn.close()
                raise
            await self._give_back(conn)
            return rows

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        if self._closed:
            raise psycopg.OperationalError("the store is closed")
        conn = await psycopg.AsyncConnection.connect(
            self._conninfo, autocommit=True, **self._options)
        try:
            await conn.execute(self._statement_timeout)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _give_back(self, conn: psycopg.AsyncConnection[Any]) -> None:
        if self._closed:
            await conn.close()
        else:
            self._idle.append(conn)

    async def close(self) -> None:
        """Close the idle connections; those in use close when their statement ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()
