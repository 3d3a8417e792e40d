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
from sqlalchemy import event

from watcher.models import AVAILABLE, COMPLETE, WAITING
from watcher.records import ItemWrite, NewItem
from watcher.rules.spawn import SpawnConflictError
from watcher.store import Store
from watcher.store.drivers.postgresql import driver as postgresql_driver
from watcher.waits import WaitWrite, new_completion_token, token_hash

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


def _statements_sent(store: Store) -> list[str]:
    """The statements ``store`` sends from here on, through its engine or its driver's
    own connections (the list grows as they go)."""
    sent: list[str] = []
    event.listen(store.engine.sync_engine, "before_cursor_execute",
                 lambda _conn, _cursor, sql, *_: sent.append(sql))
    direct = getattr(store.driver, "direct", None)
    if direct is not None and hasattr(direct, "listeners"):
        direct.listeners.append(sent.append)
    return sent


async def test_a_spawning_batch_over_two_partitions_counts_each(store: Store) -> None:
    """Answers of two partitions in one batch, one of them parking its item: each applied
    answer's children go in, and each partition counts its own. Where the driver chains
    writes (PostgreSQL) the batch is one statement."""
    for pid in ("p", "q"):
        await store.partition_create(pid, [NewItem("a", b"x"), NewItem("b", b"x")])
    await store.leases_take(await store.leases_read_free(5), OWNER, 30.0)
    seen = {(pid, item.id): item.version for pid in ("p", "q")
            for item in await store.items_ready(pid, 0, 10)}

    def answer(pid: str, item_id: str, *children: str, stale: bool = False) -> ItemWrite:
        return ItemWrite(pid, item_id, seen[(pid, item_id)] + stale, COMPLETE, 0, attempts=1,
                         spawn=tuple(NewItem(f"{item_id}-{c}", c.encode(), gate=1)
                                     for c in children))

    parked = ItemWrite("q", "b", seen[("q", "b")], WAITING, 0, attempts=1, retry_delay=60.0,
                       wait=WaitWrite(token_hash(new_completion_token()), 60.0),
                       spawn=(NewItem("b-w", b"w", gate=1),))
    sent = _statements_sent(store)
    applied = await store.items_apply(
        [answer("p", "a", "1", "2", "3"), answer("p", "b", "9", stale=True),
         answer("q", "a", "1"), parked], OWNER)
    assert applied == [True, False, True, True]
    if store.driver.chains_writes:
        assert len(sent) == 1, sent
    ids = {pid: {item.id for item in await store.items_list(pid)} for pid in ("p", "q")}
    assert ids == {"p": {"a", "b", "a-1", "a-2", "a-3"}, "q": {"a", "b", "a-1", "b-w"}}
    assert (await store.partition_get("p")).spawned == 3
    assert (await store.partition_get("q")).spawned == 2
    statuses = {item.id: item.status for item in await store.items_list("q")}
    assert statuses["b"] == WAITING and statuses["b-w"] == AVAILABLE


async def test_a_spawning_batch_past_the_one_statement_bound_goes_in_chunks(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """More rows than one statement carries (PostgreSQL's bound, lowered here): the batch
    goes in a transaction, its rows in chunks, with the same outcome."""
    monkeypatch.setattr(postgresql_driver, "SPAWN_AT_ONCE_ROWS", 2)
    seen = await _versions(store, "folder", "other")
    writes = [_done("folder", seen["folder"], "a", "b", "c"),
              _done("other", seen["other"] + 1, "z")]
    assert await store.items_apply(writes, OWNER) == [True, False]
    assert {item.id for item in await store.items_list("p")} == {
        "folder", "other", "a", "b", "c"}
    assert (await store.partition_get("p")).spawned == 3
