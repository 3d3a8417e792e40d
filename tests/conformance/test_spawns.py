"""Spawned items at the store, one suite run on every live database.

What an answer spawns is inserted in the transaction that writes the answer,
and only if that write applies: a stale or fenced-off answer spawns nothing, so
an answer written twice spawns once. An id the partition holds already refuses
the whole batch, naming the answer at fault, and writes none of it. (The engine
end to end, over HTTP and under faults, is tested in tests/integration and
tests/acceptance.)
"""

from __future__ import annotations

import pytest

from watcher.models import AVAILABLE, COMPLETE
from watcher.records import ItemWrite, NewItem
from watcher.rules.spawn import SpawnConflictError
from watcher.store import Store

OWNER = "me"


async def _versions(store: Store, *ids: str) -> dict[str, int]:
    await store.partition_create("p", [NewItem(item_id, b"x") for item_id in ids])
    await store.leases_take(await store.leases_read_free(5), OWNER, 30.0)
    return {item.id: item.version for item in await store.items_ready("p", 0, 100)}


def _done(item_id: str, version: int, *children: str, gate: int = 1) -> ItemWrite:
    return ItemWrite("p", item_id, version, COMPLETE, 0, attempts=1,
                     spawn=tuple(NewItem(child, child.encode(), gate=gate) for child in children))


async def test_an_applied_answer_spawns_its_children_once(store: Store) -> None:
    seen = await _versions(store, "folder")
    write = _done("folder", seen["folder"], "a.txt", "b.txt")
    assert await store.items_apply([write], OWNER) == [True]
    assert await store.items_apply([write], OWNER) == [False], "the same answer again"
    items = {item.id: item for item in await store.items_list("p")}
    assert set(items) == {"folder", "a.txt", "b.txt"}
    assert {(items[c].parent, items[c].gate, items[c].status, items[c].data)
            for c in ("a.txt", "b.txt")} == {("folder", 1, AVAILABLE, b"a.txt"),
                                             ("folder", 1, AVAILABLE, b"b.txt")}
    info = await store.partition_get("p")
    assert info.spawned == 2 and info.version == 2, "spawning leaves the lease's version"


async def test_a_fenced_off_answer_spawns_nothing(store: Store) -> None:
    seen = await _versions(store, "x", "y")
    applied = await store.items_apply(
        [_done("x", seen["x"] + 1, "from-stale"), _done("y", seen["y"], "from-fresh")], OWNER)
    assert applied == [False, True]
    assert await store.items_apply([_done("x", seen["x"], "from-stranger")], "stranger") == [
        False]
    ids = {item.id for item in await store.items_list("p")}
    assert ids == {"x", "y", "from-fresh"}
    assert (await store.partition_get("p")).spawned == 1


@pytest.mark.parametrize("clash", ["held", "twice in the batch"])
async def test_a_clashing_id_refuses_the_whole_batch(store: Store, clash: str) -> None:
    seen = await _versions(store, "x", "y", "held")
    other = "held" if clash == "held" else "new"
    writes = [_done("x", seen["x"], "new"), _done("y", seen["y"], other)]
    with pytest.raises(SpawnConflictError) as caught:
        await store.items_apply(writes, OWNER)
    assert other in str(caught.value) and "'y'" in str(caught.value)
    items = await store.items_list("p")
    assert {item.id for item in items} == {"x", "y", "held"}
    assert {item.status for item in items} == {AVAILABLE}, "no answer of the batch is written"
    assert (await store.partition_get("p")).spawned == 0
