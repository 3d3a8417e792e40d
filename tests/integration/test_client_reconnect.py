"""A client write after the database killed the client's session (PostgreSQL's
``pg_terminate_backend``): the dead connection is discarded, and the next call
succeeds, or raises one clear retryable error once and then succeeds."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from processor import AsyncClient, NewItem
from tests.conftest import POSTGRES_URL
from watcher.errors import ConnectionLostError, DatabaseError

APP = "reconnect-" + uuid.uuid4().hex[:8]


@pytest.fixture
async def killer(db_url: str) -> AsyncIterator[Callable[[], Awaitable[int]]]:
    if not db_url.startswith("postgresql"):
        pytest.skip("sessions are killed by application name on PostgreSQL")
    admin = create_async_engine(POSTGRES_URL.replace("postgresql://", "postgresql+asyncpg://", 1))

    async def kill() -> int:
        async with admin.connect() as conn:
            killed = (await conn.execute(text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = :app"), {"app": APP})).fetchall()
            await conn.commit()
        return len(killed)

    yield kill
    await admin.dispose()


async def _call_after_kill(call: Callable[[], Awaitable[Any]]) -> Any:
    """The call; once more if it raised (the one clear error a lost session may cost)."""
    try:
        return await call()
    except ConnectionLostError:
        return await call()


async def test_every_client_write_works_after_its_session_is_killed(
        db_url: str, table_prefix: str, killer: Callable[[], Awaitable[int]]) -> None:
    url = f"{db_url}?application_name={APP}"
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
            assert await killer() >= 1, "the client's sessions were found"
            await _call_after_kill(write)
            await client.add_items("p", [NewItem(f"after{n}", b"")])  # and at once again
        assert {item.id for item in await client.items("p")} >= {"a", "b", "after0"}


async def test_writes_killed_mid_call_cost_one_clear_error_each(
        db_url: str, table_prefix: str, killer: Callable[[], Awaitable[int]]) -> None:
    """Four producers add items while their sessions are killed ten times: each killed
    call raises one ConnectionLostError (never a run of PendingRollbackError): no more
    errors than sessions killed, and the calls after the kills go through."""
    url = f"{db_url}?application_name={APP}"
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
            killed += await killer()
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
