"""A client write after the database killed the client's session (PostgreSQL's
``pg_terminate_backend``, MariaDB's ``KILL CONNECTION`` from another connection): the
dead connection is discarded, and the next call succeeds, or raises one clear
retryable error once and then succeeds."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine

from processor import AsyncClient, NewItem
from tests.conftest import MARIADB_URL, POSTGRES_URL
from watcher.errors import ConnectionLostError, DatabaseError
from watcher.store.db.urls import parse_database_url

APP = "reconnect-" + uuid.uuid4().hex[:8]


Killer = tuple[str, Callable[[], Awaitable[int]]]


@pytest.fixture
async def killer(db_url: str) -> AsyncIterator[Killer]:
    """The client's URL, and a function that kills every session it opened from
    another connection and says how many it killed."""
    if db_url.startswith("postgresql"):
        async for pair in _postgres_killer(db_url):
            yield pair
    elif db_url.startswith("mysql"):
        async for pair in _mariadb_killer(db_url):
            yield pair
    else:
        pytest.skip("sessions are killed on PostgreSQL and MariaDB")


async def _postgres_killer(db_url: str) -> AsyncIterator[Killer]:
    """Sessions are found by their application name."""
    # The admin connection uses statefeed's own driver (psycopg, a core dependency): a
    # plain install runs this test.
    admin = create_async_engine(parse_database_url(POSTGRES_URL).async_url)

    async def kill() -> int:
        async with admin.connect() as conn:
            killed = (await conn.execute(text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = :app"), {"app": APP})).fetchall()
            await conn.commit()
        return len(killed)

    yield f"{db_url}?application_name={APP}", kill
    await admin.dispose()


async def _mariadb_killer(db_url: str) -> AsyncIterator[Killer]:
    """MariaDB has no application name: the client logs in as a user of its own,
    and its sessions are found by that user and killed with ``KILL CONNECTION``."""
    user = APP.replace("-", "_")
    admin = create_async_engine(parse_database_url(MARIADB_URL).async_url)
    database = db_url.rsplit("/", 1)[1].split("?")[0]
    async with admin.connect() as conn:
        await conn.execute(text(f"CREATE USER IF NOT EXISTS '{user}'@'%'"))
        await conn.execute(text(f"GRANT ALL ON `{database}`.* TO '{user}'@'%'"))
        await conn.commit()

    async def kill() -> int:
        async with admin.connect() as conn:
            ids = (await conn.execute(text(
                "SELECT id FROM information_schema.processlist WHERE user = :user"),
                {"user": user})).scalars().all()
            killed = 0
            for session in ids:
                try:
                    await conn.execute(text(f"KILL CONNECTION {int(session)}"))
                    killed += 1
                except DBAPIError:
                    pass  # it ended meanwhile
        return killed

    yield db_url.replace("root@", f"{user}@", 1), kill
    async with admin.connect() as conn:
        await conn.execute(text(f"DROP USER IF EXISTS '{user}'@'%'"))
        await conn.commit()
    await admin.dispose()


async def _call_after_kill(call: Callable[[], Awaitable[Any]]) -> Any:
    """The call; once more if it raised (the one clear error a lost session may cost)."""
    try:
        return await call()
    except ConnectionLostError:
        return await call()


async def test_every_client_write_works_after_its_session_is_killed(
        db_url: str, table_prefix: str, killer: Killer) -> None:
    url, kill = killer
    async with AsyncClient(url, table_prefix) as client:
        await client.create_partition("p", [NewItem("a", b"")])
        writes: list[Callable[[], Awaitable[Any]]] = [
            lambda: client.create_partition("q", [NewItem("a", b"")]),
            lambda: client.add_items("p", [NewItem("b", b"")]),
            lambda: client.pause("p"),
            lambda: client.resume("p"),
            lambda: client.retry_failed("p"),
            lambda: client.cancel("q"),
        ]
        for n, write in enumerate(writes):
            assert await kill() >= 1, "the client's sessions were found"
            await _call_after_kill(write)
            await client.add_items("p", [NewItem(f"after{n}", b"")])  # and at once again
        assert {item.id for item in await client.items("p")} >= {"a", "b", "after0"}


async def test_writes_killed_mid_call_cost_one_clear_error_each(
        db_url: str, table_prefix: str, killer: Killer) -> None:
    """Four producers add items while their sessions are killed ten times: each killed
    call raises one ConnectionLostError (never a run of PendingRollbackError): no more
    errors than sessions killed, and the calls after the kills go through."""
    url, kill = killer
    errors: list[BaseException] = []
    after_kill: list[bool] = []
    async with AsyncClient(url, table_prefix) as client:
        await client.create_partition("p", [NewItem("a", b"")])
        stop = asyncio.Event()

        async def producer(n: int) -> None:
            batch, failed = 0, False
            while not stop.is_set():
                batch += 1
                try:
                    await client.add_items("p", [NewItem(f"w{n}-{batch}-{k}", b"x" * 100)
                                                 for k in range(200)])
                except DatabaseError as error:
                    errors.append(error)
                    if failed:
                        after_kill.append(False)  # a second failure in a row
                    failed = True
                else:
                    if failed:
                        after_kill.append(True)
                    failed = False

        tasks = [asyncio.create_task(producer(n)) for n in range(4)]
        killed = 0
        for _ in range(10):
            await asyncio.sleep(0.3)
            killed += await kill()
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.gather(*tasks)
        after = len(errors)
        await client.add_items("p", [NewItem("last", b"")])
    assert errors, "no call was killed: the test did not test anything"
    assert all(isinstance(error, ConnectionLostError) for error in errors), {
        type(error).__name__: str(error)[:200] for error in errors}
    assert "retry the call" in str(errors[0])
    assert len(errors) <= killed, f"{len(errors)} errors for {killed} sessions killed"
    assert after_kill and after_kill[-1], "the producers went on after the kills"
    assert len(errors) == after
