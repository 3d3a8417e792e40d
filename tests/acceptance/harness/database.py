"""The test's side of the PostgreSQL database the processors run on: database URLs
pointed elsewhere, and SQL on a connection of the test's own, which finds each
processor's sessions by their ``application_name``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import POSTGRES_URL
from tests.support.servers import free_port
from watcher.store.db.urls import parse_database_url


def with_query(url: str, **params: str) -> str:
    """``url`` with query parameters added (psycopg takes them as connection options)."""
    parts = urlsplit(url)
    extra = "&".join(f"{key}={value}" for key, value in params.items())
    query = f"{parts.query}&{extra}" if parts.query else extra
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


def postgres_address() -> tuple[str, int]:
    """Host and port of the test PostgreSQL server."""
    url = parse_database_url(POSTGRES_URL).async_url
    return url.host or "127.0.0.1", url.port or 5432


def via(url: str, port: int, *, password: str | None = None) -> str:
    """``url`` pointed at 127.0.0.1:``port`` (and with ``password``, if given)."""
    parsed = parse_database_url(url).async_url.set(host="127.0.0.1", port=port,
                                                   drivername="postgresql")
    if password is not None:
        parsed = parsed.set(password=password)
    return parsed.render_as_string(hide_password=False)


def closed_port() -> int:
    """A loopback port nobody listens on (it was free a moment ago)."""
    return free_port()


class Sessions:
    """SQL on the test's own engine, and the PostgreSQL sessions of processors whose
    ``application_name`` starts with ``name_prefix``.
    """

    def __init__(self, engine: AsyncEngine, name_prefix: str) -> None:
        self.engine = engine
        self.name_prefix = name_prefix

    def app_name(self, owner: str = "") -> str:
        """The application_name of a processor's sessions (a prefix of every one if '')."""
        return f"{self.name_prefix}{owner}"[:63]

    async def query(self, statement: str, **params: Any) -> list[Any]:
        """Run one SQL statement in its own transaction; returns its rows, if any."""
        async with self.engine.begin() as conn:
            result = await conn.execute(text(statement), params)
            return list(result.all()) if result.returns_rows else []

    async def terminate(self, owner: str = "") -> int:
        """pg_terminate_backend every session of ``owner`` (or of all the processors);
        returns how many ended.
        """
        name = self.app_name(owner)
        rows = await self.query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend' AND left(application_name, :n) = :name",
            n=len(name), name=name)
        return sum(1 for (done,) in rows if done)

    async def states(self, owner: str) -> list[str]:
        """The states of ``owner``'s sessions (idle, active, idle in transaction)."""
        rows = await self.query(
            "SELECT coalesce(state, '') FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = :name",
            name=self.app_name(owner))
        return [state for (state,) in rows]

    async def quiet_states(self, owner: str) -> list[str] | None:
        """``owner``'s session states once none runs a query (``["none"]`` without
        sessions), or ``None`` while one does.
        """
        states = await self.states(owner)
        return None if "active" in states else states or ["none"]

    async def no_transaction(self, owner: str) -> bool:
        """Whether none of ``owner``'s sessions runs a query or holds a transaction open."""
        return not any(s.startswith("idle in transaction") or s == "active"
                       for s in await self.states(owner))
