"""Bounded database round trips on PostgreSQL and MariaDB: a connection that stops
answering (a TCP proxy that stops forwarding: a half-open connection, a stalled
failover) and a statement waiting on a row lock both end within the timeout, with
one WARNING line, a readiness problem, and recovery once the database answers.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import create_async_engine

from tests.acceptance.harness.faults import TcpProxy
from tests.conftest import MARIADB_URL, POSTGRES_URL, require_mariadb, require_postgres
from watcher.records import ItemWrite, NewItem
from watcher.store import Store
from watcher.store.db.migrate import downgrade, upgrade
from watcher.store.db.round_trips import DatabaseTimeoutError
from watcher.store.db.urls import parse_database_url

TIMEOUT = 1.0


def _through(url: str, port: int, password: str | None = None) -> str:
    """``url`` pointed at 127.0.0.1:``port`` (the proxy), with ``password`` if given."""
    parsed = parse_database_url(url).async_url.set(host="127.0.0.1", port=port)
    if password is not None:
        parsed = parsed.set(password=password)
    scheme = urlsplit(url).scheme
    return parsed.set(drivername=scheme).render_as_string(hide_password=False)


@pytest.fixture(params=[pytest.param("postgres", marks=pytest.mark.postgres),
                        pytest.param("mariadb", marks=pytest.mark.mariadb)])
async def server(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, str]]:
    """(URL, fresh table prefix) on PostgreSQL or MariaDB."""
    if request.param == "postgres":
        require_postgres()
        url = POSTGRES_URL
    else:
        require_mariadb()
        url = MARIADB_URL
    prefix = f"to{uuid.uuid4().hex[:8]}_"
    await asyncio.to_thread(upgrade, url, prefix)
    yield url, prefix
    await asyncio.to_thread(downgrade, url, prefix)


async def _leased_item(store: Store, owner: str = "w") -> ItemWrite:
    """A partition with one item, leased by ``owner``; the write that completes the item."""
    await store.partition_create("p", [NewItem("a", b"1")])
    [_] = await store.leases_take(await store.leases_read_free(5), owner, 60)
    [item] = await store.items_ready("p", 0, 10)
    return ItemWrite("p", "a", item.version, "complete", 0, 1)


async def test_a_stalled_connection_times_out_once_logged_and_recovers(
        server, caplog: pytest.LogCaptureFixture) -> None:
    url, prefix = server
    host, port = parse_database_url(url).async_url.host, parse_database_url(url).async_url.port
    async with TcpProxy(host or "127.0.0.1", port or 5432) as proxy:
        proxy.forward()
        # PostgreSQL trusts local connections: a password in the URL shows the log masks it.
        secret = "hunter2-secret" if url.startswith("postgres") else None
        store = Store.open(_through(url, proxy.port, secret), prefix, db_timeout=TIMEOUT)
        try:
            write = await _leased_item(store)
            assert store.problem() is None
            proxy.stall()
            caplog.set_level(logging.DEBUG, logger="watcher.store.db.round_trips")
            # The direct path (hot statements) and the engine path (transactions).
            with pytest.raises(DatabaseTimeoutError) as caught:
                await store.items_apply([write], "w")
            assert "items_apply" in str(caught.value)
            with pytest.raises(DatabaseTimeoutError):
                await store.partition_state("p")
            with pytest.raises(DatabaseTimeoutError):  # a new connection: the handshake stalls
                await store.items_ready("p", 0, 10)
            problem = store.problem()
            assert problem is not None
            assert "items_apply" in problem and "partition_state" in problem
            warnings = [r.getMessage() for r in caplog.records
                        if r.levelno == logging.WARNING and "database_timeout" in r.getMessage()]
            assert len(warnings) == 1, warnings
            assert "what=items_apply" in warnings[0] and f":{proxy.port}/" in warnings[0]
            assert "hunter2" not in caplog.text
            proxy.forward()
            # The stalled write may reach the server now; guarded, it applies once at most.
            applied = await store.items_apply([write], "w")
            state = await store.partition_state("p")
            assert state is not None
            [item] = await store.items_list("p")
            assert item.status == "complete" and item.version == write.seen_version + 1
            assert applied in ([True], [False])
            assert (await store.items_ready("p", 0, 10)) == []
            assert store.problem() is None
            assert "action=database_timeouts_ended" in caplog.text
        finally:
            await store.close()


async def test_a_statement_waiting_on_a_row_lock_ends_at_the_server_timeout(
        server, caplog: pytest.LogCaptureFixture) -> None:
    url, prefix = server
    store = Store.open(url, prefix, db_timeout=TIMEOUT)
    engine = create_async_engine(parse_database_url(url).async_url)
    try:
        write = await _leased_item(store)
        caplog.set_level(logging.WARNING, logger="watcher.store.db.round_trips")
        async with engine.connect() as holder:
            transaction = await holder.begin()
            await holder.execute(text(f"SELECT id FROM {prefix}items WHERE id = 'a' FOR UPDATE"))
            with pytest.raises(OperationalError) as caught:
                await store.items_apply([write], "w")
            # The server ended it (its statement or lock wait timeout): the connection stays.
            assert not isinstance(caught.value, DatabaseTimeoutError), caught.value
            assert store.driver.timed_out(caught.value)
            problem = store.problem()
            assert problem is not None and "items_apply" in problem
            assert "what=items_apply" in caplog.text
            await transaction.rollback()
        assert await store.items_apply([write], "w") == [True]
        assert store.problem() is None
        [item] = await store.items_list("p")
        assert (item.status, item.version) == ("complete", write.seen_version + 1)
    finally:
        await engine.dispose()
        await store.close()


async def test_connections_keep_tcp_alive(server) -> None:
    """A vanished peer (failover, half-open connection) is noticed on idle connections too."""
    url, prefix = server
    store = Store.open(url, prefix, db_timeout=TIMEOUT)
    try:
        await store.ping()
        async with store.engine.connect() as conn:
            raw = await conn.get_raw_connection()
            driver_connection = raw.driver_connection
            if url.startswith("postgres"):
                fd = driver_connection.pgconn.socket  # type: ignore[union-attr]
                sock = socket.socket(fileno=socket.dup(fd))
            else:
                sock = driver_connection._writer.transport.get_extra_info("socket")  # type: ignore[union-attr]
            try:
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 10
            finally:
                if url.startswith("postgres"):
                    sock.close()
    finally:
        await store.close()


async def test_a_database_timeout_must_be_positive() -> None:
    from watcher.errors import ConfigError

    with pytest.raises(ConfigError, match="database timeout"):
        Store.open("sqlite:///unused.db", db_timeout=0)
