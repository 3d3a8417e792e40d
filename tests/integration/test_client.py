"""The client library against real databases: happy paths and bad input that writes nothing."""

from __future__ import annotations

import asyncio

import pytest

from processor import (
    AsyncClient,
    Client,
    DuplicateItemError,
    GateError,
    InvalidInputError,
    NewItem,
    PartitionExistsError,
    PartitionNotFoundError,
)


@pytest.fixture
async def client(db_url, table_prefix):
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


async def test_create_and_read(client) -> None:
    await client.create_partition("job", [NewItem("a", b"1"), NewItem("b", b"2", gate=3)])
    info = await client.partition("job")
    assert (info.id, info.status, info.gate, info.owner, info.counts) == (
        "job", "available", 0, "", {"available": 2})
    items = await client.items("job")
    assert [(i.id, i.gate, i.data, i.attempts, i.last_error) for i in items] == [
        ("a", 0, b"1", 0, None), ("b", 3, b"2", 0, None)]
    assert [p.id for p in await client.partitions()] == ["job"]
    assert await client.partitions(status="complete") == []


async def test_partition_gate_starts_at_its_lowest_item(client) -> None:
    await client.create_partition("late", [NewItem("a", b"", gate=4), NewItem("b", b"", 9)])
    assert (await client.partition("late")).gate == 4


@pytest.mark.parametrize(("items", "error", "fragment"), [
    ([NewItem("a", "text")], InvalidInputError, "data must be bytes"),
    ([NewItem("a", b""), NewItem("a", b"")], DuplicateItemError, "more than once"),
    ([NewItem("", b"")], InvalidInputError, "item id must be a non-empty string"),
    ([NewItem("a", b"", gate=-1)], InvalidInputError, "gate must be a whole number"),
    ([NewItem("a", b"", gate=True)], InvalidInputError, "gate must be a whole number"),
    ([{"id": "a"}], InvalidInputError, "pass NewItem"),
    ([NewItem("x" * 300, b"")], InvalidInputError, "limit is 255"),
])
async def test_bad_items_write_nothing(client, items, error, fragment) -> None:
    with pytest.raises(error, match=fragment):
        await client.create_partition("job", items)
    assert await client.partitions() == []


async def test_duplicate_partition(client) -> None:
    await client.create_partition("job", [NewItem("a", b"")])
    with pytest.raises(PartitionExistsError, match="already exists"):
        await client.create_partition("job", [NewItem("b", b"")])
    assert [i.id for i in await client.items("job")] == ["a"]


async def test_add_items_errors_write_nothing(client) -> None:
    with pytest.raises(PartitionNotFoundError, match="does not exist"):
        await client.add_items("nope", [NewItem("a", b"")])
    await client.create_partition("job", [NewItem("a", b"", gate=2)])
    before = await client.partition("job")
    with pytest.raises(DuplicateItemError, match="already exist"):
        await client.add_items("job", [NewItem("new", b"", 2), NewItem("a", b"", 2)])
    with pytest.raises(GateError, match="already at gate 2"):
        await client.add_items("job", [NewItem("new", b"", gate=1)])
    after = await client.partition("job")
    assert [i.id for i in await client.items("job")] == ["a"]
    assert (after.version, after.counts) == (before.version, before.counts)


async def test_set_gate_moves_forward_only(client) -> None:
    await client.create_partition("job", [NewItem("a", b"", gate=3), NewItem("b", b"", gate=5)])
    await client.set_gate("job", 3)  # the gate it is at: nothing changes
    with pytest.raises(GateError, match="stranded"):
        await client.set_gate("job", 5)
    assert (await client.partition("job")).gate == 3
    with pytest.raises(GateError, match="only moves forward"):
        await client.set_gate("job", 1)
    assert (await client.partition("job")).gate == 3
    with pytest.raises(PartitionNotFoundError):
        await client.set_gate("nope", 1)
    with pytest.raises(InvalidInputError):
        await client.set_gate("job", -2)


async def test_set_gate_never_strands_available_items(client) -> None:
    await client.create_partition("job", [NewItem("a", b""), NewItem("b", b"", gate=4)])
    before = await client.partition("job")
    with pytest.raises(GateError, match=r"1 item\(s\) at gate 0 are still available"):
        await client.set_gate("job", 2)
    after = await client.partition("job")
    assert (after.gate, after.version) == (0, before.version)  # nothing written
    await client.set_gate("job", 0)  # the gate it is at: allowed, nothing stranded
    assert (await client.partition("job")).gate == 0


async def test_unknown_things(client) -> None:
    with pytest.raises(PartitionNotFoundError):
        await client.partition("nope")
    with pytest.raises(PartitionNotFoundError):
        await client.items("nope")
    with pytest.raises(PartitionNotFoundError):
        await client.retry_failed("nope")
    with pytest.raises(InvalidInputError, match="unknown status"):
        await client.partitions(status="done")


async def test_wait_times_out_with_a_useful_message(client) -> None:
    await client.create_partition("job", [NewItem("a", b"")])
    with pytest.raises(TimeoutError, match="still available at gate 0"):
        await client.wait("job", timeout=0.1)


async def test_many_items_in_one_transaction(client) -> None:
    items = [NewItem(f"i{n:05}", bytes([n % 256])) for n in range(2500)]
    await client.create_partition("big", items)
    assert (await client.partition("big")).counts == {"available": 2500}


def test_sync_client(db_url, table_prefix) -> None:
    with Client(db_url, table_prefix) as client:
        client.create_partition("job", [NewItem("a", b"x")])
        assert client.partition("job").counts == {"available": 1}
        assert client.add_items("job", [NewItem("b", b"y")]) is False
        assert [i.id for i in client.items("job")] == ["a", "b"]
        with pytest.raises(PartitionExistsError):
            client.create_partition("job", [])
    client.close()  # a second close is harmless


async def test_sync_client_works_inside_a_running_loop(db_url, table_prefix) -> None:
    with Client(db_url, table_prefix) as client:
        client.create_partition("job", [NewItem("a", b"x")])
        await asyncio.sleep(0)
        assert client.partition("job").id == "job"


async def test_big_and_many_items_go_in_whole_and_in_order(client) -> None:
    """Items of several megabytes beside hundreds of small ones: a statement carries a
    bounded share of them (PostgreSQL sends its inserts as JSON, a few big items per
    statement), and every byte, gate and id arrives."""
    big = [NewItem(f"big-{n}", bytes([n]) * 3_000_000 + b"\x00\xff end", gate=n % 2)
           for n in range(4)]
    small = [NewItem(f"small-{n:04}", f"{n}".encode(), gate=1) for n in range(700)]
    await client.create_partition("job", [*big, *small])
    await client.add_items("job", [NewItem("late", b"\x00" * 5_000_000)])
    info = await client.partition("job")
    assert info.counts == {"available": 705}
    for item in [*big, NewItem("late", b"\x00" * 5_000_000)]:
        stored = await client.item("job", item.id)
        assert (stored.data, stored.gate) == (item.data, item.gate or 0), item.id
    stored_small = await client.items("job", limit=1000, with_data=True)
    assert {i.id: i.data for i in stored_small if i.id.startswith("small-")} == {
        i.id: i.data for i in small}
