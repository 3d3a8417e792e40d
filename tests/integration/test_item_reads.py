"""One item read by its key and items found by id across partitions, with their error
history, through the client on every live database."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from processor import (
    AsyncClient,
    Client,
    InvalidInputError,
    ItemNotFoundError,
    NewItem,
    PartitionNotFoundError,
)
from watcher.store import Store


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


async def test_item_reads_one_item_with_its_data(client: AsyncClient) -> None:
    await client.create_partition("job", [NewItem("a", b'{"x": 1}'), NewItem("b", b"2", 3)])
    item = await client.item("job", "b")
    assert (item.partition_id, item.id, item.gate, item.data, item.status, item.attempts,
            item.parent, item.error_history) == ("job", "b", 3, b"2", "available", 0,
                                                 None, ())
    bare = await client.item("job", "a", with_data=False)
    assert (bare.id, bare.data) == ("a", b"")


async def test_item_missing_partition_or_item_names_it(client: AsyncClient) -> None:
    await client.create_partition("job", [NewItem("a", b"")])
    with pytest.raises(PartitionNotFoundError, match="'nope' does not exist"):
        await client.item("nope", "a")
    with pytest.raises(ItemNotFoundError, match="partition 'job' has no item 'zz'") as caught:
        await client.item("job", "zz")
    assert (caught.value.partition_id, caught.value.item_id) == ("job", "zz")
    assert isinstance(caught.value, LookupError)


@pytest.mark.parametrize(("partition_id", "item_id"), [("", "a"), ("job", ""),
                                                        ("job", "x" * 300), ("job", 7)])
async def test_item_bad_ids_are_refused(client: AsyncClient, partition_id: object,
                                        item_id: object) -> None:
    with pytest.raises(InvalidInputError):
        await client.item(partition_id, item_id)  # type: ignore[arg-type]


async def test_find_items_lists_each_partition_holding_the_id(client: AsyncClient) -> None:
    for name in ("p3", "p1", "p2"):
        await client.create_partition(name, [NewItem("shared", b"data"), NewItem(name, b"")])
    await client.create_partition("other", [NewItem("Shared", b""), NewItem("shared2", b"")])
    found = await client.find_items("shared")
    assert [(item.partition_id, item.id, item.data) for item in found] == [
        ("p1", "shared", b""), ("p2", "shared", b""), ("p3", "shared", b"")]
    assert [item.partition_id for item in await client.find_items("shared", limit=2)] == [
        "p1", "p2"]
    assert await client.find_items("absent") == []
    with pytest.raises(InvalidInputError, match="limit must be a whole number"):
        await client.find_items("shared", limit=0)
    with pytest.raises(InvalidInputError):
        await client.find_items("")


async def test_error_history_is_decoded_and_old_rows_give_none(
        client: AsyncClient, store: Store) -> None:
    await client.create_partition("job", [NewItem("a", b""), NewItem("b", b"")])
    items = store.tables.items
    history = ('[{"at":"2024-05-01 10:00:00.250000","attempt":1,"gate":0,"error":"boom"},'
               '{"at":"2024-05-01T10:00:02","attempt":2,"gate":0,"error":"HTTP 500: down"}]')
    async with store.engine.begin() as conn:
        await conn.execute(items.update().where(items.c.id == "a")
                           .values(error_history=history))
    item = await client.item("job", "a")
    assert [(str(e.at), e.attempt, e.gate, e.error) for e in item.error_history] == [
        ("2024-05-01 10:00:00.250000", 1, 0, "boom"),
        ("2024-05-01 10:00:02", 2, 0, "HTTP 500: down")]
    assert (await client.item("job", "b")).error_history == ()
    page = await client.items("job")
    assert [len(info.error_history) for info in page] == [2, 0]
    assert [len(info.error_history) for info in await client.find_items("a")] == [2]


def test_sync_client_reads_items(db_url: str, table_prefix: str) -> None:
    with Client(db_url, table_prefix) as client:
        client.create_partition("job", [NewItem("a", b"1")])
        assert client.item("job", "a").data == b"1"
        assert [item.partition_id for item in client.find_items("a")] == ["job"]
        with pytest.raises(ItemNotFoundError):
            client.item("job", "b")
