"""The engine's two kinds of transaction: one that writes, and one marked as reads only."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine


@asynccontextmanager
async def write_transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection in a write transaction (``BEGIN IMMEDIATE`` on SQLite); commits on exit."""
    async with engine.begin() as conn:
        yield conn


@asynccontextmanager
async def read_transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection in a transaction marked as read-only work: SQLite starts it with a
    plain ``BEGIN`` (:func:`watcher.store.db.engine.create_engine`), so readers do not
    queue behind writers; other databases ignore the mark."""
    async with engine.connect() as conn:
        conn = await conn.execution_options(sqlite_read=True)
        async with conn.begin():
            yield conn
