"""A synchronous DB-API driver under SQLAlchemy's asyncio engine: one worker thread per connection.

SQL Server's Python drivers that need no ODBC install (pymssql, on FreeTDS) are
synchronous, and SQLAlchemy's ``mssql+aioodbc`` needs an ODBC driver. So for
``mssql://`` the engine runs pymssql the way aioodbc runs pyodbc: every call
on a connection (connect, execute, fetch, commit, close) runs in that
connection's own single worker thread, and SQLAlchemy's asyncio adaptation
(``sqlalchemy.connectors.asyncio``) awaits it. A driver connection is only ever
touched by its one thread, one call at a time; the event loop never blocks.

What is verified where: this adaptation is exercised live against MariaDB with
PyMySQL in ``tests/databases/test_mariadb.py`` (every store method);
the SQL Server dialect on top of it is verified by compilation only, because no
SQL Server runs in CI. See docs/how-to/databases.md.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any, TypeVar, cast

from sqlalchemy.connectors.asyncio import (
    AsyncAdapt_dbapi_connection,
    AsyncAdapt_dbapi_module,
    AsyncAdapt_terminate,
)
from sqlalchemy.dialects.mssql.pymssql import MSDialect_pymssql
from sqlalchemy.util.concurrency import await_

T = TypeVar("T")

_DBAPI_NAMES = (
    "Warning", "Error", "InterfaceError", "DatabaseError", "DataError", "OperationalError",
    "IntegrityError", "InternalError", "ProgrammingError", "NotSupportedError",
    "STRING", "BINARY", "NUMBER", "DATETIME", "ROWID", "Binary", "__version__",
)


class _Worker:
    """The one thread that owns a driver connection."""

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor, functools.partial(function, *args, **kwargs))

    def stop(self) -> None:
        self._executor.shutdown(wait=False)


class _Cursor:
    """An awaitable cursor (what SQLAlchemy's asyncio adaptation expects) over a sync one."""

    def __init__(self, connection: _Connection) -> None:
        self._worker = connection.worker
        self._raw_connection = connection.raw
        self._cursor: Any = None

    async def __aenter__(self) -> _Cursor:
        self._cursor = await self._worker.call(self._raw_connection.cursor)
        return self

    @property
    def description(self) -> Any:
        return self._cursor.description

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    @property
    def lastrowid(self) -> Any:
        return self._cursor.lastrowid

    @property
    def arraysize(self) -> int:
        return self._cursor.arraysize

    @arraysize.setter
    def arraysize(self, value: int) -> None:
        self._cursor.arraysize = value

    async def execute(self, operation: Any, parameters: Any = None) -> Any:
        if parameters is None:
            return await self._worker.call(self._cursor.execute, operation)
        return await self._worker.call(self._cursor.execute, operation, parameters)

    async def executemany(self, operation: Any, parameters: Sequence[Any]) -> Any:
        return await self._worker.call(self._cursor.executemany, operation, parameters)

    async def fetchone(self) -> Any:
        return await self._worker.call(self._cursor.fetchone)

    async def fetchmany(self, size: int | None = None) -> Any:
        return await self._worker.call(self._cursor.fetchmany, size or self.arraysize)

    async def fetchall(self) -> Any:
        return await self._worker.call(self._cursor.fetchall)

    async def nextset(self) -> Any:
        return await self._worker.call(self._cursor.nextset)

    async def setinputsizes(self, *sizes: Any) -> None:
        return None  # advisory in DB-API; neither pymssql nor PyMySQL uses it

    def setoutputsize(self, size: Any, column: Any = None) -> None:
        return None

    async def close(self) -> None:
        if self._cursor is not None:
            await self._worker.call(self._cursor.close)


class _Connection:
    """An awaitable connection over a sync one, bound to its worker thread."""

    def __init__(self, raw: Any, worker: _Worker) -> None:
        self.raw = raw
        self.worker = worker

    def cursor(self, *args: Any) -> _Cursor:
        return _Cursor(self)

    async def commit(self) -> None:
        await self.worker.call(self.raw.commit)

    async def rollback(self) -> None:
        await self.worker.call(self.raw.rollback)

    async def close(self) -> None:
        try:
            await self.worker.call(self.raw.close)
        finally:
            self.worker.stop()


class ThreadedConnection(AsyncAdapt_terminate, AsyncAdapt_dbapi_connection):
    """The DB-API connection SQLAlchemy's pool holds.

    Driver-specific methods the dialects call (``autocommit(flag)``, ``ping()``,
    ``character_set_name()``, ...) run in the worker thread like everything else.
    """

    __slots__ = ()

    @property
    def _own(self) -> _Connection:
        """The worker-owned connection this adapter was made with."""
        return cast(_Connection, self._connection)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not set yet, or private: never the driver's
            raise AttributeError(name)
        attribute = getattr(self._own.raw, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            return await_(self._own.worker.call(attribute, *args, **kwargs))

        return call

    def close(self) -> None:
        self.terminate()

    async def _terminate_graceful_close(self) -> None:
        await self._own.close()

    def _terminate_force_close(self) -> None:
        # Garbage collection or an invalidated connection outside the event loop.
        try:
            self._own.raw.close()
        finally:
            self._own.worker.stop()


class ThreadedDBAPI(AsyncAdapt_dbapi_module):
    """The DB-API module the dialect sees: the sync driver's names, async-adapted connect()."""

    def __init__(self, driver: ModuleType) -> None:
        super().__init__(driver, dbapi_module=driver)
        self.paramstyle = driver.paramstyle
        for name in _DBAPI_NAMES:
            if hasattr(driver, name):
                setattr(self, name, getattr(driver, name))

    def connect(self, *args: Any, **kwargs: Any) -> ThreadedConnection:
        worker = _Worker(f"statefeed-{self.driver.__name__}")

        async def open_connection() -> _Connection:
            try:
                raw = await worker.call(self.driver.connect, *args, **kwargs)
            except BaseException:
                worker.stop()
                raise
            return _Connection(raw, worker)

        return await_(ThreadedConnection.create(self, cast("Awaitable[Any]", open_connection())))


class ThreadedDialect:
    """Mixin making a sync driver's dialect an asyncio one; name the sync dialect first.

    ``class X(ThreadedDialect, SyncDialect): sync_dialect = SyncDialect``.
    """

    sync_dialect: Any
    is_async = True
    has_terminate = True
    supports_statement_cache = True

    @classmethod
    def import_dbapi(cls) -> Any:
        return ThreadedDBAPI(cls.sync_dialect.import_dbapi())

    def do_terminate(self, dbapi_connection: Any) -> None:
        dbapi_connection.terminate()

    def get_driver_connection(self, connection: Any) -> Any:
        return connection._connection.raw


class MSDialectThreaded_pymssql(ThreadedDialect, MSDialect_pymssql):
    """SQL Server through pymssql, for the asyncio engine (``mssql+pymssql_threaded://``)."""

    sync_dialect = MSDialect_pymssql
    driver = "pymssql_threaded"
    supports_statement_cache = True


dialect = MSDialectThreaded_pymssql
