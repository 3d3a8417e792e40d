"""Item reads and guarded, fenced result writes against real databases."""

from __future__ import annotations

import asyncio

from watcher.dispatch.writer import ResultWriter
from watcher.records import ItemWrite, NewItem


async def _leased(store, items, owner="me"):
    await store.partition_create("p", items)
    (lease,) = await store.leases_take(await store.leases_read_free(5), owner, 30.0)
    return lease


async def test_ready_items_are_read_in_one_batch_at_the_gate(store) -> None:
    await _leased(store, [NewItem(f"i{n:02}", b"x", gate=n % 2) for n in range(10)])
    ready = await store.items_ready("p", 0, 100)
    assert sorted(item.id for item in ready) == [f"i{n:02}" for n in range(0, 10, 2)]
    assert len(await store.items_ready("p", 0, 2)) == 2


async def test_item_write_is_guarded_by_version(store) -> None:
    await _leased(store, [NewItem("i", b"x")])
    (item,) = await store.items_ready("p", 0, 10)
    write = ItemWrite("p", "i", item.version, "available", 1, attempts=0, data=b"y")
    assert await store.items_apply([write], "me") == [True]
    assert await store.items_apply([write], "me") == [False], "same version twice"
    (info,) = await store.items_list("p")
    assert (info.gate, info.data, info.version) == (1, b"y", item.version + 1)


async def test_item_write_is_fenced_by_the_lease(store) -> None:
    lease = await _leased(store, [NewItem("i", b"x")])
    (item,) = await store.items_ready("p", 0, 10)
    write = ItemWrite("p", "i", item.version, "complete", 0, attempts=0)
    assert await store.items_apply([write], "someone-else") == [False]
    await store.leases_release({"p": lease.version}, "me")
    assert await store.items_apply([write], "me") == [False], "released lease fences writes"
    (info,) = await store.items_list("p")
    assert (info.status, info.version) == ("available", item.version)


async def test_batched_writes_report_each_outcome(store) -> None:
    await _leased(store, [NewItem(f"i{n}", b"x") for n in range(4)])
    ready = {item.id: item for item in await store.items_ready("p", 0, 10)}
    writes = [
        ItemWrite("p", "i0", ready["i0"].version, "complete", 0, attempts=0),
        ItemWrite("p", "i1", ready["i1"].version + 5, "complete", 0, attempts=0),  # stale
        ItemWrite("p", "i2", ready["i2"].version, "available", 0, attempts=1,
                  last_error="boom", retry_delay=60.0),
        ItemWrite("p", "i3", ready["i3"].version, "failed", 0, attempts=1, last_error="bad"),
    ]
    assert await store.items_apply(writes, "me") == [True, False, True, True]
    by_id = {info.id: info for info in await store.items_list("p")}
    assert by_id["i0"].status == "complete" and by_id["i1"].status == "available"
    assert (by_id["i2"].attempts, by_id["i2"].last_error) == (1, "boom")
    assert by_id["i3"].status == "failed"
    ready_now = [item.id for item in await store.items_ready("p", 0, 10)]
    assert ready_now == ["i1"], "i2 waits for its retry time"


async def test_gate_summary(store) -> None:
    await _leased(store, [NewItem("a", b"", 0), NewItem("b", b"", 10), NewItem("c", b"", 20)])
    summary = await store.gate_summary("p", 0)
    assert (summary.pending, summary.failed, summary.next_gate) == (1, 0, 10)
    assert summary.seconds_to_next_retry is not None and summary.seconds_to_next_retry < 1
    (item,) = await store.items_ready("p", 0, 10)
    await store.items_apply(
        [ItemWrite("p", "a", item.version, "failed", 0, attempts=1, last_error="x")], "me")
    summary = await store.gate_summary("p", 0)
    assert (summary.pending, summary.failed, summary.next_gate) == (0, 1, 10)


async def test_a_write_the_database_refuses_fails_only_its_own_item(store) -> None:
    """A batch holding one write the database cannot store (a gate beyond any integer
    column) is split: the good writes land, the bad item fails in place with an error
    naming why, and the writer goes on (it does not retry the batch forever).
    """
    await _leased(store, [NewItem(name, b"x") for name in ("bad", "good1", "good2")])
    ready = {item.id: item for item in await store.items_ready("p", 0, 10)}
    writer = ResultWriter(store, "me", batch_size=10)
    writes = [
        ItemWrite("p", "good1", ready["good1"].version, "complete", 0, attempts=0),
        ItemWrite("p", "bad", ready["bad"].version, "available", 2**70, attempts=0, data=b"y"),
        ItemWrite("p", "good2", ready["good2"].version, "available", 1, attempts=0),
    ]
    try:
        applied = await asyncio.wait_for(
            asyncio.gather(*(writer.submit(write) for write in writes)), timeout=20)
    finally:
        await writer.close(grace=5)
    assert applied == [True, True, True]
    items = {info.id: info for info in await store.items_list("p")}
    assert (items["good1"].status, items["good2"].gate) == ("complete", 1)
    bad = items["bad"]
    assert (bad.status, bad.gate, bad.data) == ("failed", 0, b"x")
    assert "could not be stored" in bad.last_error and str(2**70) in bad.last_error


ODD_IDS = ['quote"d', "back\\slash", "comma,{brace}", "ünï €😀", "a'b", "[1, 2]", "null"]


async def test_batched_writes_store_odd_texts_and_bytes_exactly(store) -> None:
    """Ids, error texts and bytes that need quoting or escaping in any encoding of the
    batch (JSON, arrays, SQL literals) are stored unchanged, and each row meets its own
    item; so do the ids an in-hand exclusion names."""
    await _leased(store, [NewItem(name, b"x") for name in ODD_IDS])
    ready = {item.id: item for item in await store.items_ready("p", 0, 100)}
    every_byte = bytes(range(256))
    message = 'said "no" \\ then \\u0000 and ünï €😀 \\x00'
    writes = [
        ItemWrite("p", name, ready[name].version, "available", 3, attempts=0,
                  data=every_byte + name.encode())
        for name in ODD_IDS[:3]
    ] + [
        ItemWrite("p", name, ready[name].version, "available", 0, attempts=1,
                  last_error=f"{message} {name}", retry_delay=60.0)
        for name in ODD_IDS[3:5]
    ]
    assert await store.items_apply(writes, "me") == [True] * 5
    items = {info.id: info for info in await store.items_list("p")}
    for name in ODD_IDS[:3]:
        assert (items[name].gate, items[name].data) == (3, every_byte + name.encode())
    for name in ODD_IDS[3:5]:
        assert (items[name].last_error, items[name].data) == (f"{message} {name}", b"x")
    left = await store.items_ready("p", 0, 100, exclude=[ODD_IDS[5]])
    assert [item.id for item in left] == [ODD_IDS[6]]
