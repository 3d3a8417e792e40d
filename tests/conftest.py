"""Shared fixtures: real SQLite and PostgreSQL databases, one fresh namespace per test."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
from sqlalchemy import create_engine, text

from watcher.dburl import parse_database_url
from watcher.migrate import downgrade, upgrade
from watcher.store import Store

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
POSTGRES_URL = os.environ.get("PROCESSOR_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)


def _postgres_reachable() -> str | None:
    try:
        engine = create_engine(parse_database_url(POSTGRES_URL).sync_url)
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
        return None
    except Exception as error:  # any failure means "not reachable"
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


_POSTGRES_PROBLEM: str | bool | None = False  # False: not checked yet


def require_postgres() -> None:
    """Skip (locally) or fail (when CI is set) if PostgreSQL is not reachable."""
    global _POSTGRES_PROBLEM
    if _POSTGRES_PROBLEM is False:
        _POSTGRES_PROBLEM = _postgres_reachable()
    if _POSTGRES_PROBLEM:
        message = f"PostgreSQL at {POSTGRES_URL} is not reachable ({_POSTGRES_PROBLEM})"
        if os.environ.get("CI"):
            pytest.fail(message + "; CI must run the PostgreSQL tests", pytrace=False)
        pytest.skip(message)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """A database URL: a fresh SQLite file, or the shared PostgreSQL test database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'statefeed.db'}"
    require_postgres()
    return POSTGRES_URL


@pytest.fixture
def table_prefix(db_url: str) -> str:
    """A fresh table namespace, migrated before the test and dropped after it."""
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    upgrade(db_url, prefix)
    yield prefix
    downgrade(db_url, prefix)


@pytest.fixture
async def make_store(db_url: str, table_prefix: str) -> AsyncIterator[Callable[..., Store]]:
    """Open stores on the test namespace; each has its own engine (like a separate process)."""
    stores: list[Store] = []

    def make(**kwargs) -> Store:
        store = Store.open(db_url, table_prefix, **kwargs)
        stores.append(store)
        return store

    yield make
    for opened in stores:
        await opened.close()


@pytest.fixture
async def store(make_store) -> Store:
    """One store on the test namespace."""
    return make_store()


HANG_REPORT_AFTER = 120.0


@pytest.fixture(autouse=True)
async def _report_hung_tasks():
    """Print every asyncio task's stack if a test runs suspiciously long (diagnostics only)."""
    loop = asyncio.get_running_loop()

    def report() -> None:
        print(f"\n=== test still running after {HANG_REPORT_AFTER} s; asyncio tasks: ===",
              file=sys.stderr)
        for task in asyncio.all_tasks(loop):
            print(f"--- {task!r}", file=sys.stderr)
            task.print_stack(file=sys.stderr)

    handle = loop.call_later(HANG_REPORT_AFTER, report)
    yield
    handle.cancel()
