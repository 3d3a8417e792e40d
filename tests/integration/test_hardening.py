"""Promises that hostile or careless use must not break, on every live database: a gate
set while another runs strands no item, ids are checked one way everywhere, and values
over a limit fail alone."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from processor import AsyncClient, DuplicateItemError, InvalidInputError, NewItem
from tests.support.engine import count_calls, running, wait_until
from watcher import Result, Store, Watcher, WatcherConfig, WorkItem
from watcher.errors import ConfigError, GateError

FAST = {"poll_interval": 0.05, "lease_duration": 3.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2}


async def test_set_gate_while_a_gate_runs_never_strands_items(
        db_url: str, table_prefix: str, make_store: Callable[..., Any]) -> None:
    """A client moving the gate of a running partition is refused while items below
    the target are still available: a complete partition never has an available item."""
    release = asyncio.Event()

    async def slow(item: WorkItem) -> Result:
        await asyncio.wait_for(release.wait(), 20)
        return Result(done=True)

    async with AsyncClient(db_url, table_prefix) as client:
        await client.create_partition("p", [NewItem(f"i{n:03}", b"") for n in range(100)])
        watcher = Watcher(make_store(), slow, WatcherConfig(owner_id="w", concurrency=8,
                                                            **FAST))
        async with running(watcher):
            await wait_until(lambda: watcher.supervisors, message="the partition leased")
            with pytest.raises(GateError, match="still available"):
                await client.set_gate("p", 1)
            release.set()
            info = await client.wait("p", timeout=30)
        assert info.status == "complete" and info.counts == {"complete": 100}
        assert info.gate == 0


@pytest.mark.parametrize(("bad_id", "what"), [
    ("with\x00nul", "NUL"),
    ("lone\ud800surrogate", "unpaired surrogate"),
])
async def test_ids_get_one_validation_on_every_database(db_url: str, table_prefix: str,
                                                        bad_id: str, what: str) -> None:
    async with AsyncClient(db_url, table_prefix) as client:
        with pytest.raises(InvalidInputError, match=what):
            await client.create_partition(bad_id, [NewItem("a", b"")])
        with pytest.raises(InvalidInputError, match=what):
            await client.create_partition("p", [NewItem(bad_id, b"")])
        assert await client.partitions() == []


async def test_ids_the_database_takes_for_equal_are_duplicates_not_an_existing_partition(
        db_url: str, table_prefix: str) -> None:
    async with AsyncClient(db_url, table_prefix) as client:
        try:
            await client.create_partition("p", [NewItem("a", b""), NewItem("a ", b"")])
        except DuplicateItemError as error:  # MariaDB: trailing spaces compare equal
            assert error.item_ids == ["a", "a "]
            assert await client.partitions() == []
        else:  # SQLite and PostgreSQL compare them exactly
            assert [item.id for item in await client.items("p")] == ["a", "a "]


@pytest.mark.parametrize("buffer", [0, 8])
async def test_slots_free_at_the_queue_until_the_write_buffer_is_full(
        db_url: str, table_prefix: str, make_store: Callable[..., Any], buffer: int) -> None:
    """While result writes are held up, finished calls free their slots only while the
    writer's buffer has room: then the processor stops calling the handler instead of
    piling up results it may have to throw away (with no buffer, at the first
    ``concurrency`` calls)."""
    calls: list[str] = []
    writes_open = asyncio.Event()

    async def process(item: WorkItem) -> Result:
        calls.append(item.id)
        return Result(done=True)

    store = make_store()
    apply = store.items_apply

    async def held_apply(*args: Any, **kwargs: Any) -> Any:
        await asyncio.wait_for(writes_open.wait(), 30)
        return await apply(*args, **kwargs)

    store.items_apply = held_apply  # type: ignore[method-assign]
    cycles = count_calls(store, "leases_read_free")
    config = WatcherConfig(owner_id="w", concurrency=4, result_buffer=buffer, **FAST)
    async with AsyncClient(db_url, table_prefix) as client:
        await client.create_partition("p", [NewItem(f"i{n:02}", b"") for n in range(40)])
        watcher = Watcher(store, process, config)
        async with running(watcher):
            await wait_until(lambda: len(calls) >= 4 + buffer, message="the buffer filled")
            seen = cycles["leases_read_free"]
            await wait_until(lambda: cycles["leases_read_free"] >= seen + 5,
                             message="five more lease cycles")
            # Each queued answer below the bound freed its slot; one entry may pass it by
            # the results that finished together, at most a concurrency's worth.
            assert 4 + buffer <= len(calls) <= 4 + buffer + (4 if buffer else 0), calls
            writes_open.set()
            info = await client.wait("p", timeout=30)
    assert info.counts == {"complete": 40} and len(calls) == 40


@pytest.mark.mariadb
async def test_a_result_over_the_servers_packet_fails_only_its_item(tmp_path) -> None:
    """MariaDB would drop the connection on a statement over max_allowed_packet, which
    looks like an outage: the driver refuses it before sending, the writer fails only
    its item with an error naming the setting; every other partition completes."""
    from sqlalchemy import create_engine, text

    from tests.conftest import MARIADB_URL, require_mariadb
    from watcher.store.db.migrate import downgrade, upgrade
    from watcher.store.db.urls import parse_database_url

    require_mariadb()
    admin = create_engine(parse_database_url(MARIADB_URL).sync_url)
    with admin.connect() as conn:
        packet = int(conn.execute(text("SELECT @@global.max_allowed_packet")).scalar_one())
    admin.dispose()
    prefix = f"pk{uuid.uuid4().hex[:8]}_"
    upgrade(MARIADB_URL, prefix)
    big = b"\x00" * (packet * 3 // 4 + 1024)  # as base64, just over the server's packet

    async def process(item: WorkItem) -> Result:
        return Result(done=True, data=big if item.id == "huge" else b"ok")

    try:
        store = Store.open(MARIADB_URL, prefix)
        async with AsyncClient(MARIADB_URL, prefix) as client:
            await client.create_partition("bad", [NewItem("huge", b""), NewItem("fine", b"")])
            for n in range(3):
                await client.create_partition(f"other{n}", [NewItem(f"i{k}", b"")
                                                             for k in range(20)])
            # A lease far longer than the refused write of tens of MB takes on a loaded
            # machine: one that ran out mid-write would call the item again.
            watcher = Watcher(store, process, WatcherConfig(
                owner_id="w", max_item_bytes=2 * packet, **{**FAST, "lease_duration": 60.0}))
            async with running(watcher):
                bad = await client.wait("bad", timeout=60)
                others = [await client.wait(f"other{n}", timeout=60) for n in range(3)]
            items = {item.id: item for item in await client.items("bad")}
        await store.close()
    finally:
        downgrade(MARIADB_URL, prefix)
    assert all(info.status == "complete" for info in others)
    assert bad.status == "failed" and bad.counts == {"complete": 1, "failed": 1}
    assert items["huge"].status == "failed" and items["fine"].data == b"ok"
    assert f"max_allowed_packet of {packet} bytes" in (items["huge"].last_error or "")


async def test_items_over_the_size_limit_are_refused_at_the_door(
        db_url: str, table_prefix: str) -> None:
    async with AsyncClient(db_url, table_prefix, max_item_bytes=1000) as client:
        with pytest.raises(InvalidInputError, match="is 1001 bytes; the limit is 1000"):
            await client.create_partition("p", [NewItem("a", b"x" * 1000),
                                                NewItem("b", b"x" * 1001)])
        assert await client.partitions() == []
        await client.create_partition("p", [NewItem("a", b"x" * 1000)])
        with pytest.raises(InvalidInputError, match="max_item_bytes"):
            await client.add_items("p", [NewItem("c", b"x" * 5000)])
        assert [item.id for item in await client.items("p")] == ["a"]
    with pytest.raises(ConfigError, match="max_item_bytes"):
        AsyncClient(db_url, table_prefix, max_item_bytes=0)


async def test_an_answer_over_the_size_limit_fails_only_its_item(
        db_url: str, table_prefix: str, make_store: Callable[..., Any]) -> None:
    async def process(item: WorkItem) -> Result:
        return Result(done=True, data=b"y" * (2000 if item.id == "big" else 10))

    async with AsyncClient(db_url, table_prefix) as client:
        await client.create_partition("p", [NewItem("big", b""), NewItem("small", b"")],
                                      on_item_failure="continue")
        watcher = Watcher(make_store(), process, WatcherConfig(owner_id="w", max_item_bytes=1000,
                                                               **FAST))
        async with running(watcher):
            info = await client.wait("p", timeout=30)
        items = {item.id: item for item in await client.items("p")}
    assert info.status == "complete" and info.counts == {"complete": 1, "failed": 1}
    assert "2000 bytes, over the item size limit of 1000" in (items["big"].last_error or "")
    assert items["small"].data == b"y" * 10


@pytest.mark.parametrize("readable", [True, False], ids=["readable", "unreadable"])
async def test_an_item_stored_around_the_limit_fails_alone(
        db_url: str, table_prefix: str, make_store: Callable[..., Any], readable: bool) -> None:
    """An item over the size limit, stored without the client (by SQL, or by an older
    release), fails with a clear error; the other items of its partition run. When
    the database cannot even return it (PostgreSQL refuses values over 1 GB in a
    read), the failed read finds it by its stored size and fails it alone."""
    from sqlalchemy.exc import OperationalError

    calls: list[str] = []

    async def process(item: WorkItem) -> Result:
        calls.append(item.id)
        return Result(done=True)

    store = make_store()
    await store.partition_create("p", [NewItem("huge", b"z" * 5000),
                                       *(NewItem(f"i{n}", b"") for n in range(5))])
    if not readable:  # reads fail while the huge item is ready, as they would for 550 MB
        ready = store.items_ready

        async def failing_read(*args: Any, **kwargs: Any) -> Any:
            rows = await ready(*args, **kwargs)
            if any(row.id == "huge" for row in rows):
                raise OperationalError("SELECT ...", {}, Exception(
                    "invalid memory alloc request size 1100000000"))
            return rows

        store.items_ready = failing_read  # type: ignore[method-assign]
    async with AsyncClient(db_url, table_prefix) as client:
        watcher = Watcher(store, process, WatcherConfig(owner_id="w", max_item_bytes=1000,
                                                        **FAST))
        async with running(watcher):
            info = await client.wait("p", timeout=30)
        items = {item.id: item for item in await client.items("p")}
    assert info.status == "failed" and info.counts == {"complete": 5, "failed": 1}
    assert sorted(calls) == [f"i{n}" for n in range(5)]
    error = items["huge"].last_error or ""
    assert "is 5000 bytes, over the item size limit of 1000 bytes" in error
