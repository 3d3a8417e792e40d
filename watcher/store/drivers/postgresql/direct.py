"""Sending the engine's hottest statements to PostgreSQL through psycopg directly.

SQLAlchemy's async engine spends several times a statement's own cost on one
transaction (pool checkout with a ping, BEGIN, the statement and COMMIT, each
across a greenlet switch); one autocommit statement on an open psycopg
connection costs a fraction of that (docs/explanation/how-it-works.md gives the figures). The
statements themselves stay SQLAlchemy constructs, built by the store and the
PostgreSQL driver (:mod:`.driver`); this
module compiles each once for the store's dialect and sends it. Only single
statements come here, each atomic by itself, so autocommit takes nothing from
their guarantees.

The connections are kept in the direct paths' own small pool
(:mod:`watcher.store.drivers.pool`, which says why not psycopg_pool).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import psycopg
from sqlalchemy.engine import URL, Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ClauseElement

from watcher.config import DEFAULT_DB_TIMEOUT
from watcher.store.drivers.compiled import StatementCache
from watcher.store.drivers.pool import ConnectionPool, Verdict
from watcher.store.drivers.postgresql import pooler
from watcher.store.drivers.postgresql.engine import connect_options, statement_timeout

T = TypeVar("T")

# Connections the hot path may hold at once (the SQLAlchemy engine has its own).
MAX_CONNECTIONS = 4


class _Connections(ConnectionPool[psycopg.AsyncConnection[Any]]):
    """Autocommit psycopg connections, each with the server's statement timeout set."""

    def __init__(self, conninfo: str, options: Mapping[str, Any], timeout: float,
                 max_connections: int) -> None:
        super().__init__(max_connections)
        self._conninfo = conninfo
        self._options = dict(options)
        self._statement_timeout = statement_timeout(timeout)

    async def open(self) -> psycopg.AsyncConnection[Any]:
        """A new autocommit connection.

        Raises:
            psycopg.OperationalError: the pool is closed, or the server cannot be reached.
        """
        if self.closed:
            raise psycopg.OperationalError("the store is closed")
        conn = await psycopg.AsyncConnection.connect(
            self._conninfo, autocommit=True, **self._options)
        try:
            await conn.execute(self._statement_timeout)
        except BaseException:
            await conn.close()
            raise
        return conn

    def verdict(self, conn: psycopg.AsyncConnection[Any], error: BaseException) -> Verdict:
        """A psycopg error keeps the connection unless it broke it; anything else
        (a cancellation mid-statement) leaves the session's state unknown."""
        if isinstance(error, psycopg.Error):
            return Verdict.DEAD if conn.broken else Verdict.KEEP
        return Verdict.DROP

    async def discard(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Close ``conn``."""
        await conn.close()


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
        conninfo = pooler.without_option(url).set(drivername="postgresql").render_as_string(
            hide_password=False)
        self._dialect = dialect
        options = {**connect_options(timeout, url.query), **pooler.psycopg_options(url)}
        self._connections = _Connections(conninfo, options, timeout, max_connections)
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

        async def rows(cursor: psycopg.AsyncCursor[Any]) -> Sequence[tuple[Any, ...]]:
            return await cursor.fetchall() if cursor.description else []

        return await self._send(statement, params, rows)

    async def execute(self, statement: ClauseElement, params: Mapping[str, Any]) -> int:
        """Run the write ``statement`` with ``params``; returns how many rows it matched.

        Raises:
            sqlalchemy.exc.DBAPIError: as :meth:`fetch`.
        """

        async def matched(cursor: psycopg.AsyncCursor[Any]) -> int:
            return cursor.rowcount

        return await self._send(statement, params, matched)

    async def fetch_chain(self, steps: Sequence[tuple[ClauseElement, Mapping[str, Any]]]
                          ) -> list[Sequence[tuple[Any, ...]]]:
        """Run each statement of ``steps`` with its parameters, in order, on one
        connection in one round trip (a pipeline, ended by one sync: the server runs
        them as one transaction, and a statement that fails skips those after it);
        returns each one's rows.

        Raises:
            sqlalchemy.exc.DBAPIError: as :meth:`fetch` (nothing is written).
        """
        sent = [self._prepared(statement, params) for statement, params in steps]

        async def run(conn: psycopg.AsyncConnection[Any]) -> list[Sequence[tuple[Any, ...]]]:
            async with conn.pipeline():
                cursors = [await conn.execute(sql, values) for sql, values in sent]
            return [await cursor.fetchall() if cursor.description else []
                    for cursor in cursors]

        try:
            return await self._connections.run(run)
        except psycopg.Error as error:
            raise DBAPIError.instance(sent[0][0], None, error, psycopg.Error,
                                      hide_parameters=True, dialect=self._dialect) from None

    async def _send(self, statement: ClauseElement, params: Mapping[str, Any],
                    answer: Callable[[psycopg.AsyncCursor[Any]], Awaitable[T]]) -> T:
        sql, values = self._prepared(statement, params)

        async def run(conn: psycopg.AsyncConnection[Any]) -> T:
            return await answer(await conn.execute(sql, values))

        try:
            return await self._connections.run(run)
        except psycopg.Error as error:
            raise DBAPIError.instance(sql, None, error, psycopg.Error, hide_parameters=True,
                                      dialect=self._dialect) from None

    def _prepared(self, statement: ClauseElement, params: Mapping[str, Any]
                  ) -> tuple[str, Any]:
        """``statement``'s text (compiled once) and its values for ``params``; the
        listeners are told the text as it is sent."""
        compiled = self._compiled[statement]
        for listener in self.listeners:
            listener(compiled.sql)
        return compiled.sql, compiled.values(params)

    async def close(self) -> None:
        """Close the idle connections; those in use close when their statement ends."""
        await self._connections.close()
