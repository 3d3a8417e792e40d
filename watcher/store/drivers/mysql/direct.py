"""Sending the engine's hottest statements to MariaDB/MySQL through aiomysql directly.

Through SQLAlchemy's engine each statement is a transaction: a pool checkout
that pings the server, ``BEGIN``, the statement and ``COMMIT``, four round
trips and as many greenlet switches. The ready read and the gate summary
are single statements, atomic by themselves, so they go instead as one
autocommit statement on an open connection of this module's small pool; the
batch of result writes is one statement too, sent in a transaction of its own
on a connection that does not autocommit, so that it can be rolled back when
fewer rows changed than were sent (:meth:`MySQLDirect.write_batch`).

Connections take the engine's connect arguments (host, credentials,
``charset``, TLS, ``FOUND_ROWS``, so a write counts the rows it matched) and
run at READ COMMITTED, as the engine's do. A statement that meets a dead idle
connection (the server restarted, or ended the session) is sent again once on
a new one, as the engine's pool pre-ping would have arranged; a failure while
a commit is under way is never sent again (it may have been applied).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import aiomysql
import pymysql
from sqlalchemy.engine import URL, Dialect
from sqlalchemy.engine.default import DefaultDialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ClauseElement

from watcher.config import DEFAULT_DB_TIMEOUT
from watcher.errors import ValueRefusedError
from watcher.store.drivers.base import Followers
from watcher.store.drivers.compiled import StatementCache
from watcher.store.drivers.conflicts import error_number
from watcher.store.drivers.mysql.engine import session_timeouts, tune_keepalive
from watcher.store.drivers.mysql.packet import READ_PACKET_LIMIT, check_packet
from watcher.store.drivers.pool import ConnectionPool, Verdict

# Connections the hot path may hold at once, per kind (autocommit or not).
MAX_CONNECTIONS = 4
READ_COMMITTED = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"
# The batch write joins its JSON rows to the items and checks the lease with
# EXISTS. Left to itself, the optimizer turns that EXISTS into a semi-join and,
# on a freshly filled table (no statistics yet), starts from the partitions and
# reads every item of each one. Without semi-joins (and, on MariaDB, without
# turning EXISTS into IN) it reads the JSON rows, finds each item by its primary
# key and then its partition by its own: PostgreSQL's plan.
OPTIMIZER = {True: "SET SESSION optimizer_switch = 'semijoin=off,exists_to_in=off'",
             False: "SET SESSION optimizer_switch = 'semijoin=off'"}
# Server errors ending a statement for its time: MariaDB's max_statement_time,
# MySQL's max_execution_time, and the lock wait timeout.
TIMEOUT_CODES = frozenset({1969, 3024, 1205})


def is_timeout(error: BaseException) -> bool:
    """Whether ``error`` (the driver's, or SQLAlchemy's around it) is the server ending
    a statement for its time."""
    return error_number(getattr(error, "orig", error)) in TIMEOUT_CODES


# Client errors meaning the connection is gone: server gone away, lost during a
# query, out of sync, cannot connect, lost during the handshake.
DISCONNECTS = frozenset({2006, 2013, 2014, 2003, 2055})


def is_disconnect(error: BaseException) -> bool:
    """Whether ``error`` means the connection is gone (not a refused statement)."""
    if isinstance(error, pymysql.err.InterfaceError | ConnectionError | EOFError):
        return True
    return (isinstance(error, pymysql.err.OperationalError)
            and error_number(error) in DISCONNECTS)


class MySQLDirect:
    """Runs compiled statements on a few aiomysql connections of its own.

    ``connect_args`` are the keyword arguments of :func:`aiomysql.connect`
    (``dialect.create_connect_args(url)``); ``dialect`` compiles the
    statements (its paramstyle must be ``pyformat``) and names the errors.
    ``listeners`` are called with each statement's text as it is sent.
    """

    def __init__(self, connect_args: Mapping[str, Any], dialect: Dialect, *,
                 timeout: float = DEFAULT_DB_TIMEOUT,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self._connect_args = dict(connect_args)
        # aiomysql's connect_timeout bounds the TCP connect only; the store's round-trip
        # bound covers the handshake.
        self._connect_args.setdefault("connect_timeout", timeout)
        self._timeout = timeout
        self._dialect = dialect
        self._compiled = StatementCache(dialect)
        self._pools = {autocommit: _Connections(self, autocommit, max_connections)
                       for autocommit in (True, False)}
        self.listeners: list[Callable[[str], None]] = []
        # The server's max_allowed_packet, read by each new connection (None: none yet).
        self.packet_limit: int | None = None

    @classmethod
    def for_url(cls, url: URL, dialect: Dialect, *,
                timeout: float = DEFAULT_DB_TIMEOUT) -> MySQLDirect:
        """Connections with the arguments SQLAlchemy gives aiomysql for ``url`` (whatever
        driver the engine has); statements compiled for ``dialect``'s database, each
        ended by the server after ``timeout`` seconds."""
        from sqlalchemy.dialects.mysql.aiomysql import MySQLDialect_aiomysql

        _, kwargs = MySQLDialect_aiomysql().create_connect_args(
            url.set(drivername="mysql+aiomysql"))
        compiling = cast("type[DefaultDialect]", type(dialect))(paramstyle="pyformat")
        return cls(kwargs, compiling, timeout=timeout)

    async def fetch(self, statement: ClauseElement, params: Mapping[str, Any]
                    ) -> Sequence[tuple[Any, ...]]:
        """Run one statement (autocommit); returns its rows (none for a write).

        Raises:
            sqlalchemy.exc.DBAPIError: the database failed or refused it, or could
                not be reached (parameters hidden).
            ValueRefusedError: the statement is over the server's packet; not sent.
        """
        compiled = self._compiled[statement]
        sql = compiled.sql
        self._sent(sql)
        values = compiled.values(params)

        async def run(conn: aiomysql.Connection) -> list[tuple[Any, ...]]:
            check_packet(sql, values, self.packet_limit)  # known once a connection opened
            async with conn.cursor() as cursor:
                await cursor.execute(sql, values)
                return compiled.rows(await cursor.fetchall())

        return await self._on_connection(True, run, sql)

    async def execute(self, statement: ClauseElement, params: Mapping[str, Any]) -> int:
        """Run one write statement (autocommit); returns how many rows it matched (the
        connections count found rows, not changed ones).

        Raises:
            sqlalchemy.exc.DBAPIError: as :meth:`fetch`.
            ValueRefusedError: the statement is over the server's packet; not sent.
        """
        compiled = self._compiled[statement]
        sql = compiled.sql
        self._sent(sql)
        values = compiled.values(params)

        async def run(conn: aiomysql.Connection) -> int:
            check_packet(sql, values, self.packet_limit)
            async with conn.cursor() as cursor:
                matched: int = await cursor.execute(sql, values)
            return matched

        result: int = await self._on_connection(True, run, sql)
        return result

    async def write_batch(self, statement: ClauseElement, params: Mapping[str, Any],
                          expected: int,
                          then: tuple[ClauseElement, Mapping[str, Any]] | None = None) -> int:
        """Run ``statement`` in a transaction of its own; commit it when it changed
        ``expected`` rows, roll it back otherwise. Returns how many it changed
        (so a figure other than ``expected`` means nothing was written). With
        ``then`` (a statement and its parameters), that statement runs too, after
        ``statement`` changed ``expected`` rows and before the commit.

        Raises:
            sqlalchemy.exc.DBAPIError: the database failed or refused it, or could
                not be reached (then nothing was written, unless the connection
                dropped during the commit, which leaves the outcome unknown).
            ValueRefusedError: the statement is over the server's packet; not sent.
        """
        compiled = self._compiled[statement]
        sql = compiled.sql
        self._sent(sql)
        values = compiled.values(params)
        following = None if then is None else self._compiled[then[0]]
        then_values = {} if then is None or following is None else following.values(then[1])

        async def run(conn: aiomysql.Connection) -> int:
            check_packet(sql, values, self.packet_limit)  # known once a connection opened
            if following is not None:
                check_packet(following.sql, then_values, self.packet_limit)
            async with conn.cursor() as cursor:
                changed: int = await cursor.execute(sql, values)
                if following is not None and changed == expected:
                    self._sent(following.sql)
                    await cursor.execute(following.sql, then_values)
            await self._end(conn, commit=changed == expected)
            return changed

        return await self._on_connection(False, run, sql)

    async def execute_followed(self, statement: ClauseElement, params: Mapping[str, Any],
                               then_first_of: Followers) -> int:
        """Run ``statement`` in a transaction of its own and, where it matched a row, the
        statements of ``then_first_of`` in turn until one matches a row; then commit.
        Returns how many rows ``statement`` matched (none: nothing more ran, nothing is
        written). The first statement locks the rows it matched, so what the followers
        look for cannot change meanwhile.

        Raises:
            sqlalchemy.exc.DBAPIError: as :meth:`write_batch`.
            ValueRefusedError: a statement is over the server's packet; nothing is sent.
        """
        compiled = self._compiled[statement]
        sql = compiled.sql
        values = compiled.values(params)
        followers = [(self._compiled[follower].sql, self._compiled[follower].values(row))
                     for follower, row in then_first_of]

        async def run(conn: aiomysql.Connection) -> int:
            for text, sent in ((sql, values), *followers):
                check_packet(text, sent, self.packet_limit)
            async with conn.cursor() as cursor:
                self._sent(sql)
                matched: int = await cursor.execute(sql, values)
                for text, sent in followers if matched else ():
                    self._sent(text)
                    if await cursor.execute(text, sent):
                        break
            await self._end(conn, commit=bool(matched))
            return matched

        result: int = await self._on_connection(False, run, sql)
        return result

    async def _end(self, conn: aiomysql.Connection, *, commit: bool) -> None:
        """Commit ``conn``'s transaction, or roll it back. A failure leaves the outcome
        unknown, so the write must not be sent again (raised as :class:`_Unrepeatable`)."""
        try:
            self._sent("COMMIT" if commit else "ROLLBACK")
            await (conn.commit() if commit else conn.rollback())
        except (pymysql.err.Error, ConnectionError, EOFError) as error:
            raise _Unrepeatable(error) from None

    def _sent(self, sql: str) -> None:
        for listener in self.listeners:
            listener(sql)

    async def _on_connection(self, autocommit: bool, run: Callable[[aiomysql.Connection], Any],
                             sql: str) -> Any:
        try:
            return await self._run(autocommit, run)
        except pymysql.err.Error as error:
            raise DBAPIError.instance(sql, None, error, pymysql.err.Error, hide_parameters=True,
                                      connection_invalidated=is_disconnect(error),
                                      dialect=self._dialect) from None
        except (ConnectionError, EOFError) as error:
            raise DBAPIError.instance(sql, None, error, Exception, hide_parameters=True,
                                      connection_invalidated=True,
                                      dialect=self._dialect) from None

    async def _run(self, autocommit: bool, run: Callable[[aiomysql.Connection], Any]) -> Any:
        try:
            return await self._pools[autocommit].run(run)
        except _Unrepeatable as failed:  # the commit's outcome is unknown: never resent
            raise failed.error from None

    async def _connect(self, autocommit: bool) -> aiomysql.Connection:
        if self._pools[autocommit].closed:
            raise pymysql.err.OperationalError(2006, "the store is closed")
        conn = await aiomysql.connect(**self._connect_args, autocommit=autocommit)
        try:
            tune_keepalive(conn)
            mariadb = "MariaDB" in conn.get_server_info()
            async with conn.cursor() as cursor:
                await cursor.execute(READ_COMMITTED)
                await cursor.execute(OPTIMIZER[mariadb])
                for setting in session_timeouts(self._timeout, mariadb):
                    await cursor.execute(setting)
                await cursor.execute(READ_PACKET_LIMIT)
                (limit,) = await cursor.fetchone()
                self.packet_limit = int(limit)
        except BaseException:
            conn.close()
            raise
        return conn

    async def close(self) -> None:
        """Close the idle connections; those in use close when their statement ends."""
        for pool in self._pools.values():
            await pool.close()


class _Connections(ConnectionPool[aiomysql.Connection]):
    """The direct path's connections of one kind: autocommit (reads), or not (the
    batch write, in a transaction of its own)."""

    def __init__(self, direct: MySQLDirect, autocommit: bool, max_connections: int) -> None:
        super().__init__(max_connections)
        self._direct = direct
        self._autocommit = autocommit

    async def open(self) -> aiomysql.Connection:
        """A new connection at READ COMMITTED with the session's bounds set.

        Raises:
            pymysql.err.OperationalError: the pool is closed, or the server cannot
                be reached.
        """
        return await self._direct._connect(self._autocommit)

    def verdict(self, conn: aiomysql.Connection, error: BaseException) -> Verdict:
        """A refused or failed statement keeps the connection; a lost connection is
        replaced; a cut-off commit or a cancellation drops it."""
        if isinstance(error, _Unrepeatable):
            return Verdict.DROP
        if isinstance(error, pymysql.err.Error | ConnectionError | EOFError):
            return Verdict.DEAD if is_disconnect(error) else Verdict.KEEP
        if isinstance(error, ValueRefusedError):  # refused before it was sent
            return Verdict.KEEP
        return Verdict.DROP

    async def recover(self, conn: aiomysql.Connection, error: BaseException) -> None:
        """Roll back the failed statement's transaction (a connection that does not
        autocommit).

        Raises:
            pymysql.err.Error: the rollback failed (``conn`` is closed).
        """
        if isinstance(error, ValueRefusedError) or conn.get_autocommit():
            return
        try:
            await conn.rollback()
        except BaseException:
            conn.close()
            raise

    async def discard(self, conn: aiomysql.Connection) -> None:
        """Close ``conn``."""
        conn.close()


class _Unrepeatable(Exception):
    """A failure after which the statement must not be sent again (during a commit)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error
