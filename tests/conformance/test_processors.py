"""The processors' rows and the open partitions' places, on every live database: a row
counts as live until its ``until`` passes by the database clock, is rewritten in place,
and goes with a clean stop; the places are the open partitions' alone, grouped."""

from __future__ import annotations

import asyncio
from datetime import datetime

from watcher.pipelines import ServedRoute
from watcher.records import NewItem, PartitionSettings
from watcher.reports import PlaceCount
from watcher.store.db.clock import FixedClock

OCR = (ServedRoute("ocr", None, True, frozenset({0, 2})),)
V2 = (ServedRoute("invoices", "v2", False, None), ServedRoute("invoices", None, True,
                                                              frozenset({1})))


async def test_a_row_is_live_until_its_until_by_the_database_clock(make_store) -> None:
    clock = FixedClock(datetime(2030, 1, 1, 12, 0, 0))
    store = make_store(clock=clock)
    await store.processors_register("a", OCR, 10.0)
    await store.processors_register("b", None, 20.0)
    [a, b] = await store.processors_live()
    assert (a.owner, a.serves, a.until, a.updated_at) == (
        "a", OCR, datetime(2030, 1, 1, 12, 0, 10), datetime(2030, 1, 1, 12, 0, 0))
    assert (b.owner, b.serves) == ("b", None)  # serves everything
    clock.advance(10.0)  # a's until is now: no longer live
    assert [row.owner for row in await store.processors_live()] == ["b"]
    await store.processors_register("a", OCR, 10.0)  # written again: live again
    assert [row.owner for row in await store.processors_live()] == ["a", "b"]
    clock.advance(30.0)
    assert await store.processors_live() == []


async def test_a_row_is_rewritten_in_place_and_deleted_by_its_owner(store) -> None:
    await store.processors_register("a", OCR, 30.0)
    await store.processors_register("a", V2, 30.0)  # its routes reloaded
    [row] = await store.processors_live()
    assert row.serves == V2
    await store.processors_register("a", None, 30.0)
    assert [row.serves for row in await store.processors_live()] == [None]
    assert await store.processors_unregister("a") is True
    assert await store.processors_live() == []
    assert await store.processors_unregister("a") is False


async def test_processors_writing_their_first_rows_at_once_each_keep_one(make_store) -> None:
    """Ten first writes race (each store with its own connections): one row each, and a
    twin's first write (the same owner twice at once) leaves one row, not an error."""
    stores = [make_store() for _ in range(10)]
    await asyncio.gather(*(store.processors_register(f"w{n}", OCR, 30.0)
                           for n, store in enumerate(stores)),
                         stores[0].processors_register("w0", None, 30.0))
    rows = await stores[1].processors_live()
    assert [row.owner for row in rows] == [f"w{n}" for n in range(10)]


async def test_a_processors_row_keeps_a_long_owner_id_and_many_tables_exactly(store) -> None:
    owner = "Processor-" + "é" * 200
    many = tuple(ServedRoute(f"p{n}", f"v{n}", n % 2 == 0, frozenset(range(n)))
                 for n in range(200))
    await store.processors_register(owner, many, 30.0)
    await store.processors_register(owner.lower(), None, 30.0)  # another owner: ids exact
    rows = {row.owner: row.serves for row in await store.processors_live()}
    assert rows == {owner: many, owner.lower(): None}


async def test_the_open_places_count_only_open_partitions_by_place(store) -> None:
    for n in range(3):
        await store.partition_create(f"i{n}", [NewItem("a", b"")],
                                     PartitionSettings(pipeline="invoices"))
    await store.partition_create("v", [NewItem("a", b"")],
                                 PartitionSettings(pipeline="invoices", pipeline_version="v2"))
    await store.partition_create("d", [NewItem("b", b"", gate=3)])
    await store.partition_create("gone", [NewItem("a", b"")],
                                 PartitionSettings(pipeline="crawl"))
    await store.partition_cancel("gone")
    await store.partition_set_gate("d", 3)
    assert await store.partitions_open_places() == [
        PlaceCount("default", None, 3, 1),
        PlaceCount("invoices", None, 0, 3), PlaceCount("invoices", "v2", 0, 1)]
