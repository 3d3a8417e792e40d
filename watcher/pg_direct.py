"""Sending the engine's hottest statements to PostgreSQL through psycopg directly.

SQLAlchemy's async engine spends about 250 µs of CPU on one transaction here
(pool checkout with a ping, BEGIN, the statement and COMMIT, each across a
greenlet switch); a single autocommit statement on a psycopg pool connection
costs about 50 µs. The statements themselves stay SQLAlchemy constructs built
in :mod:`watcher.store`; this module compiles each once for the store's
dialect and sends it. Only single statements come here, each atomic by itself,
so autocommit takes nothing from their guarantees.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool
from sqlalchemy.engine import URL, Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ClauseElement

# Connections the hot path may hold at once (the SQLAlchemy engine has its own).
MAX_CONNECTIONS = 4
# How long a statement waits for a connection before failing like an outage.
CHECKOUT_TIMEOUT = 5.0


class DirectStatements:
    """Runs compiled single statements on a small pool of autocommit psycopg connections.

    ``listeners`` are called with each statement's text as it is sent (the
    benchmark counts statements this way).
    """

    def __init__(self, url: URL, dialect: Dialect, *,
                 max_connections: int = MAX_CONNECTIONS,
                 checkout_timeout: float = CHECKOUT_TIMEOUT) -> None:
        self._dialect = dialect
        self._pool = AsyncConnectionPool(
            url.set(drivername="postgresql").render_as_string(hide_password=False),
            min_size=1, max_size=max_connections, timeout=checkout_timeout,
            kwargs={"autocommit": True}, open=False, name="statefeed-direct")
        self._opened = False
        self._compiled: dict[ClauseElement, tuple[str, dict[str, Any]]] = {}
        self.listeners: list[Callable[[str], None]] = []

    def _compile(self, statement: ClauseElement) -> tuple[str, dict[str, Any]]:
        found = self._compiled.get(statement)
        if found is None:
            compiled = statement.compile(dialect=self._dialect)
            # The values SQLAlchemy bound itself (literals such as ``version + 1``).
            defaults = {name: value for name, value in compiled.params.items()
                        if value is not None}
            found = self._compiled[statement] = (str(compiled), defaults)
        return found

    async def fetch(self, statement: ClauseElement, params: Mapping[str, Any]
                    ) -> Sequence[tuple[Any, ...]]:
        """Run ``statement`` with ``params``; returns its rows (none for a plain write).

        Raises:
            sqlalchemy.exc.DBAPIError: the database failed or refused it (the
                same types the SQLAlchemy engine raises, parameters hidden),
                including when no connection could be had within the
                checkout timeout (:data:`CHECKOUT_TIMEOUT` by default).
        """
        sql, defaults = self._compile(statement)
        for listener in self.listeners:
            listener(sql)
        try:
            if not self._opened:
                await self._pool.open(wait=False)
                self._opened = True
            async with self._pool.connection() as conn:
                cursor = await conn.execute(sql, {**defaults, **params})
                return await cursor.fetchall() if cursor.description else []
        except psycopg.Error as error:
            raise DBAPIError.instance(sql, None, error, psycopg.Error, hide_parameters=True,
                                      dialect=self._dialect) from None

    async def close(self) -> None:
        """Close the pool's connections."""
        if self._opened:
            await self._pool.close()
            self._opened = False
