"""Values a database refuses, told from outages on every write path; and values at the
documented item size limit that must fit every database at its default settings.

Real databases throughout: the refused values are values the server really
refuses (a statement larger than MariaDB's own ``max_allowed_packet``, read at
test time), never a mocked error.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import aiomysql
import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from processor import AsyncClient, NewItem
from tests.support.engine import running
from watcher import Store, Watcher, WatcherConfig
from watcher.config import DEFAULT_MAX_ITEM_BYTES
from watcher.errors import ValueRefusedError
from watcher.protocol import ReduceCall, ReduceResult, WorkItem
from watcher.protocol import Result as EngineResult
from watcher.records import ItemWrite, LeaseRow
from watcher.rules.reduce import ReduceWrite

FAST = {"poll_interval": 0.05, "lease_duration": 3.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2, "shutdown_timeout": 5.0}
WAIT = 60.0
MARIADB_DEFAULT_PACKET = 16 * 1024 * 1024


async def _server_packet(store: Store) -> int:
    async with store.engine.connect() as conn:
        return int((await conn.execute(text("SELECT @@max_allowed_packet"))).scalar_one())


async def to_reduce_gate(item: WorkItem) -> EngineResult:
    return EngineResult(gate=1)


# -- item 2: a refused reduce write fails the reduce, an outage is retried -----


MARIADB_ONLY = pytest.mark.parametrize("db_url", [
    pytest.param("mariadb", marks=pytest.mark.mariadb)], indirect=True)


@MARIADB_ONLY
@pytest.mark.parametrize("what", ["result", "item data"])
async def test_a_reduce_answer_the_database_refuses_fails_the_partition_once(
        db_url: str, table_prefix: str, make_store: Callable[..., Store],
        caplog: pytest.LogCaptureFixture, what: str) -> None:
    """A reduce answer larger than the server's max_allowed_packet (read from the server
    itself) is refused: the partition fails with an error naming the problem and the
    fix, the reducer is called once, and the refusal is logged once."""
    store = make_store()
    packet = await _server_packet(store)
    huge = b"\x00" * (packet * 3 // 4 + 1024)  # as base64, just over the packet
    calls: list[ReduceCall] = []

    async def reduce(call: ReduceCall) -> ReduceResult:
        calls.append(call)
        if what == "result":
            return ReduceResult(result=huge)
        return ReduceResult(items={"b": EngineResult(done=True, data=huge)})

    caplog.set_level(logging.INFO)
    # A lease far longer than the refused write of tens of MB takes on a loaded machine:
    # one that ran out mid-write would call the reducer again, under a new lease.
    watcher = Watcher(store, to_reduce_gate, WatcherConfig(
        owner_id="w", max_item_bytes=2 * packet, **{**FAST, "lease_duration": 60.0}),
        reduce=reduce)
    async with AsyncClient(db_url, table_prefix) as client:
        await client.create_partition("p", [NewItem("a", b"1"), NewItem("b", b"2")],
                                      reduce_gates=[1])
        async with running(watcher):
            info = await client.wait("p", timeout=WAIT)
            await asyncio.sleep(0.3)  # a wedged reduce would be called again meanwhile
        items = await client.items("p")
    assert info.status == "failed" and info.gate == 1
    assert len(calls) == 1, f"the reducer was called {len(calls)} times"
    error = info.last_error or ""
    assert "refused to store the reduce answer" in error, error
    assert f"max_allowed_packet of {packet} bytes" in error, error
    assert "retry the partition" in error, error
    assert [item.status for item in items] == ["available", "available"]  # nothing written
    refusals = [r for r in caplog.records if "action=reduce_unstorable" in r.getMessage()]
    assert len(refusals) == 1 and refusals[0].levelno == logging.WARNING


async def test_a_reduce_write_outage_is_retried_not_taken_for_a_refusal(
        db_url: str, table_prefix: str, make_store: Callable[..., Store]) -> None:
    """A reduce write that fails for an outage (a lost connection while the database
    does not answer) is made again, and the partition completes."""
    store = make_store()
    write = store.reduce_write
    ping = store.ping
    outages = 2

    async def failing_write(*args: Any, **kwargs: Any) -> Any:
        nonlocal outages
        if outages:
            outages -= 1
            raise OperationalError("UPDATE partitions ...", {}, ConnectionError("gone"),
                                   connection_invalidated=True)
        return await write(*args, **kwargs)

    async def failing_ping() -> None:
        if outages:
            raise ConnectionError("the database is down")
        await ping()

    store.reduce_write = failing_write  # type: ignore[method-assign]
    store.ping = failing_ping  # type: ignore[method-assign]
    calls: list[ReduceCall] = []

    async def reduce(call: ReduceCall) -> ReduceResult:
        calls.append(call)
        return ReduceResult(result=b'{"ok": true}')

    watcher = Watcher(store, to_reduce_gate, WatcherConfig(owner_id="w", **FAST),
                      reduce=reduce)
    async with AsyncClient(db_url, table_prefix) as client:
        await client.create_partition("p", [NewItem("a", b"1")], reduce_gates=[1])
        async with running(watcher):
            info = await client.wait("p", timeout=WAIT)
    assert info.status == "complete", info.last_error
    assert info.result_json() == {"ok": True}
    assert outages == 0 and 2 <= len(calls) <= 3  # the step was made again


# -- item 7: the documented largest item fits a default MariaDB packet ------


@pytest.fixture
def sent_statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The size in bytes of each statement text sent to MariaDB, as the server gets it
    (the escaped text pymysql builds), on the engine's and the direct connections."""
    sizes: list[int] = []
    execute = aiomysql.Cursor.execute

    async def recording(self: Any, query: Any, args: Any = None) -> Any:
        try:
            return await execute(self, query, args)
        finally:
            sent = getattr(self, "_executed", None)
            if sent is not None:
                sizes.append(len(sent.encode("utf-8", "surrogateescape")
                                 if isinstance(sent, str) else sent))

    monkeypatch.setattr(aiomysql.Cursor, "execute", recording)
    yield sizes


@MARIADB_ONLY
@pytest.mark.parametrize("byte", [b"\x00", b"\\", b"'"], ids=["zero", "backslash", "quote"])
async def test_the_largest_item_fits_a_default_mariadb_packet_whatever_its_bytes(
        db_url: str, table_prefix: str, make_store: Callable[..., Store],
        sent_statements: list[int], byte: bytes) -> None:
    """8 MiB of bytes that the text protocol escapes to two each travels in statements
    under MariaDB's default 16 MiB packet: a client insert, a result write, and a
    reduce write carrying the partition result, the accumulator and item data."""
    value = byte * DEFAULT_MAX_ITEM_BYTES
    accumulator = json.dumps("x" * (4 * 1024 * 1024 - 2)).encode()
    store = make_store()
    await store.partition_create("p", [NewItem("a", value), NewItem("b", b"")])
    (lease,) = await store.leases_take([LeaseRow("p", 1, 0, "")], "w", 60.0)
    ready = {item.id: item for item in await store.items_ready("p", 0, 10)}
    assert ready["a"].data == value
    assert await store.items_apply([ItemWrite("p", "b", ready["b"].version, "available", 0,
                                              attempts=0, data=value)], "w") == [True]
    (_, b_item) = await store.items_list("p")
    step = ReduceWrite(pass_="apply", page=0, after=None, accumulator=accumulator,
                      result=value, writes=(ItemWrite("p", "a", ready["a"].version,
                                                      "complete", 0, attempts=0,
                                                      data=value[::-1] + byte),))
    assert await store.reduce_write("p", lease.version, "w", step) == lease.version + 1
    items = {item.id: item for item in await store.items_list("p")}
    info = await store.partition_get("p")
    assert items["a"].data == value + byte and b_item.data == value
    assert info is not None and info.result == value
    # The statements that carried the value were seen (over 8 MiB), and fit 16 MiB.
    assert DEFAULT_MAX_ITEM_BYTES < max(sent_statements) < MARIADB_DEFAULT_PACKET, (
        max(sent_statements))
    assert sum(size > DEFAULT_MAX_ITEM_BYTES for size in sent_statements) >= 4


@MARIADB_ONLY
async def test_a_client_value_over_the_servers_packet_gets_a_clear_error(
        db_url: str, table_prefix: str, make_store: Callable[..., Store]) -> None:
    """An insert the server's packet cannot carry is refused before it is sent, with an
    error naming the setting (not a lost connection), and nothing is written."""
    packet = await _server_packet(make_store())
    async with AsyncClient(db_url, table_prefix, max_item_bytes=2 * packet) as client:
        with pytest.raises(ValueRefusedError, match=f"max_allowed_packet of {packet} bytes"):
            await client.create_partition("p", [NewItem("a", b"\\" * (packet * 3 // 4 + 1))])
        assert await client.partitions() == []
        await client.create_partition("q", [NewItem("a", b"ok")])  # the connection is fine
        assert [item.data for item in await client.items("q")] == [b"ok"]
