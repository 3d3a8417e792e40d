"""A reduce gate's reads and writes, one suite run on every live database.

A reduce step's write is one transaction, guarded by the partition's version,
its owner and a live lease, and by each item's version: if any guard fails
nothing of it is written (progress, result, item answers, spawned items).
"""

from __future__ import annotations

from sqlalchemy import select

from watcher.models import AVAILABLE, COMPLETE, FAILED
from watcher.records import ItemWrite, LeaseRow, NewItem, PartitionSettings, ReduceState
from watcher.rules.reduce import ReduceWrite
from watcher.store import Store

OWNER = "me"


async def _leased(store: Store, items: list[NewItem]) -> LeaseRow:
    await store.partition_create("p", items, PartitionSettings(reduce_gates=frozenset({0})))
    (lease,) = await store.leases_take(await store.leases_read_free(5), OWNER, 30.0)
    return lease


def _step(**changes: object) -> ReduceWrite:
    fields: dict[str, object] = {"pass_": "pass-1", "page": 1, "after": "i01",
                                 "accumulator": b'{"n": 2}', "result": None, "writes": ()}
    fields.update(changes)
    return ReduceWrite(**fields)  # type: ignore[arg-type]


async def test_a_fresh_partition_has_no_reduce_progress(store: Store) -> None:
    await store.partition_create("p", [NewItem("i", b"x")])
    assert await store.reduce_state_read("p") == ReduceState(1, 0, None, 0, None, None, 0)
    assert await store.reduce_state_read("absent") is None


async def test_entries_page_by_id_with_earlier_failures_on_request(store: Store) -> None:
    lease = await _leased(store, [NewItem(f"i{n}", bytes([n])) for n in range(5)]
                          + [NewItem("later", b"l", gate=1)])
    (first, *_) = await store.items_ready("p", 0, 1)
    assert await store.items_apply(
        [ItemWrite("p", first.id, first.version, FAILED, 0, attempts=1, last_error="bad")],
        OWNER) == [True]
    page = await store.reduce_entries("p", 0, after=None, limit=2, include_failed=False)
    assert [entry.id for entry in page] == ["i1", "i2"]
    rest = await store.reduce_entries("p", 0, after="i2", limit=10, include_failed=False)
    assert [entry.id for entry in rest] == ["i3", "i4"]
    everything = await store.reduce_entries("p", 0, after=None, limit=10, include_failed=True)
    assert [(e.id, e.status, e.last_error) for e in everything][:2] == [
        ("i0", FAILED, "bad"), ("i1", AVAILABLE, None)]
    assert "later" not in {entry.id for entry in everything}
    assert lease.version == (await store.reduce_state_read("p")).version


async def test_a_step_stores_progress_result_answers_and_spawns_in_one_write(
        store: Store) -> None:
    lease = await _leased(store, [NewItem("i0", b"a"), NewItem("i1", b"b")])
    entries = await store.reduce_entries("p", 0, after=None, limit=10, include_failed=False)
    writes = tuple(ItemWrite("p", e.id, e.version, AVAILABLE, 1, attempts=0, data=b"folded")
                   for e in entries)
    step = _step(result=b'{"total": 2}', writes=writes,
                 spawn=(NewItem("summary", b"s", gate=1),), gate=0)
    assert await store.reduce_write("p", lease.version, OWNER, step) == lease.version + 1
    state = await store.reduce_state_read("p")
    assert (state.version, state.pass_, state.page, state.after, state.accumulator,
            state.attempts) == (lease.version + 1, "pass-1", 1, "i01", b'{"n": 2}', 0)
    assert (await store.partition_get("p")).result == b'{"total": 2}'
    items = {item.id: item for item in await store.items_list("p")}
    assert {(items[i].gate, items[i].data) for i in ("i0", "i1")} == {(1, b"folded")}
    assert (items["summary"].gate, items["summary"].parent) == (1, None)
    # The spawned item is recorded as the reduce's at gate 0 (a rewind to 0 removes it).
    i = store.tables.items
    async with store.engine.connect() as conn:
        recorded = dict((await conn.execute(select(i.c.id, i.c.spawned_by_reduce).where(
            i.c.partition_id == "p"))).all())
    assert recorded == {"i0": None, "i1": None, "summary": 0}


async def test_a_failed_guard_writes_nothing_of_the_step(store: Store) -> None:
    lease = await _leased(store, [NewItem("i0", b"a"), NewItem("i1", b"b")])
    entries = await store.reduce_entries("p", 0, after=None, limit=10, include_failed=False)
    fresh = ItemWrite("p", "i0", entries[0].version, COMPLETE, 0, attempts=1)
    stale = ItemWrite("p", "i1", entries[1].version + 7, COMPLETE, 0, attempts=1)
    spawn = (NewItem("child", b"c", gate=1),)
    before = await store.reduce_state_read("p")
    assert await store.reduce_write("p", lease.version + 1, OWNER, _step()) is None
    assert await store.reduce_write("p", lease.version, "stranger", _step()) is None
    assert await store.reduce_write("p", lease.version, OWNER,
                                    _step(result=b"r", writes=(fresh, stale), spawn=spawn)) is None
    assert await store.reduce_state_read("p") == before
    assert (await store.partition_get("p")).result is None
    assert [(i.id, i.status) for i in await store.items_list("p")] == [
        ("i0", AVAILABLE), ("i1", AVAILABLE)]


async def test_a_failed_call_is_counted_and_can_fail_the_partition(store: Store) -> None:
    lease = await _leased(store, [NewItem("i0", b"a")])
    version = await store.reduce_failed("p", lease.version, OWNER, attempts=1,
                                        error="handler said 500", fail=False)
    assert version == lease.version + 1
    state = await store.reduce_state_read("p")
    assert state.attempts == 1
    assert (await store.partition_get("p")).last_error == "handler said 500"
    assert await store.reduce_failed("p", lease.version, OWNER, attempts=2, error="x",
                                     fail=True) is None, "guarded by the version"
    assert await store.reduce_failed("p", version, OWNER, attempts=2, error="gave up",
                                     fail=True) == version + 1
    info = await store.partition_get("p")
    assert (info.status, info.owner, info.last_error) == (FAILED, "", "gave up")
