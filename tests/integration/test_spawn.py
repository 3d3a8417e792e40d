"""Spawn in library mode, end to end on every live database: a step's answer adds items
to its partition in the transaction that writes the answer, exactly once, and the gate
waits for them."""

from __future__ import annotations

import asyncio
import json

import pytest

from processor import AsyncClient, NewItem
from tests.support.engine import running, wait_until
from watcher import CountingHooks, Result, Watcher, WatcherConfig, WorkItem
from watcher.protocol import ReduceCall, ReduceResult
from watcher.records import ItemWrite, LeaseRow
from watcher.rules.spawn import SpawnConflictError

FAST = {"poll_interval": 0.05, "lease_duration": 3.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2}


def config(owner: str = "w1", **overrides: object) -> WatcherConfig:
    return WatcherConfig(**{"owner_id": owner, **FAST, **overrides})  # type: ignore[arg-type]


async def test_spawn_at_the_same_gate_holds_the_gate(db_url, table_prefix, make_store) -> None:
    """An inbox unpacks into five items at its own gate; gate 1 starts only after every
    one of them finished gate 0, and each records its parent."""
    client = AsyncClient(db_url, table_prefix)
    finished_gate_0: set[str] = set()
    early: list[str] = []

    async def process(item: WorkItem) -> Result:
        if item.gate == 0 and item.id == "inbox":
            return Result(gate=1, spawn=[NewItem(f"doc-{n}", json.dumps(n).encode())
                                         for n in range(5)])
        if item.gate == 0:
            await asyncio.sleep(0.05)
            finished_gate_0.add(item.id)
            return Result(gate=1)
        if len(finished_gate_0) < 5:
            early.append(item.id)
        return Result(done=True)

    hooks = CountingHooks()
    await client.create_partition("p", [NewItem("inbox", b"{}")])
    async with running(Watcher(make_store(), process, config(), hooks)):
        info = await client.wait("p", timeout=30)
    assert info.status == "complete"
    assert info.counts == {"complete": 6}
    assert hooks.counts["items_spawned"] == 5
    assert info.spawned == 5
    assert early == [], "gate 1 ran before the spawned items finished gate 0"
    items = {item.id: item for item in await client.items("p")}
    assert items["inbox"].parent is None
    assert {items[f"doc-{n}"].parent for n in range(5)} == {"inbox"}
    assert items["doc-3"].data == b"3"
    await client.close()


async def test_spawn_at_a_later_gate_waits_there(db_url, table_prefix, make_store) -> None:
    """Children spawned at gate 2 run only once the partition reaches gate 2."""
    client = AsyncClient(db_url, table_prefix)
    calls: list[tuple[str, int]] = []

    async def process(item: WorkItem) -> Result:
        calls.append((item.id, item.gate))
        if item.id.startswith("root") and item.gate == 0:
            return Result(gate=1, spawn=[NewItem(f"{item.id}-late", b"x", gate=2)])
        if item.gate == 1:
            return Result(gate=2)
        return Result(done=True)

    await client.create_partition("p", [NewItem(f"root{n}", b"") for n in range(3)])
    async with running(Watcher(make_store(), process, config())):
        info = await client.wait("p", timeout=30)
    assert info.status == "complete" and info.spawned == 3
    late = [gate for item_id, gate in calls if item_id.endswith("-late")]
    assert late == [2, 2, 2]
    first_late = next(n for n, (item_id, _) in enumerate(calls) if item_id.endswith("-late"))
    assert all(gate >= 1 for _, gate in calls[first_late:])
    await client.close()


async def test_bad_spawns_fail_the_item_and_write_nothing(db_url, table_prefix,
                                                          make_store) -> None:
    """Each malformed spawn fails its item with a message naming the problem, and no
    child of it is stored."""
    client = AsyncClient(db_url, table_prefix)
    answers = {
        "dup-in-answer": [NewItem("twin", b""), NewItem("twin", b"")],
        "exists": [NewItem("fresh", b""), NewItem("taken", b"")],
        "below": [NewItem("low", b"", gate=0)],
        "bad-id": [NewItem("", b"")],
        "not-bytes": [NewItem("text", "hello")],  # type: ignore[arg-type]
        "too-many": [NewItem(f"many-{n}", b"") for n in range(4)],
    }

    async def process(item: WorkItem) -> Result:
        if item.id in answers:
            return Result(done=True, spawn=answers[item.id])
        return Result(done=True)

    await client.create_partition(
        "p", [NewItem(item_id, b"", 1) for item_id in answers] + [NewItem("taken", b"", 5)])
    async with running(Watcher(make_store(), process, config(max_spawn=3))):
        info = await client.wait("p", timeout=30)
    items = {item.id: item for item in await client.items("p")}
    assert set(items) == {*answers, "taken"}, "a refused spawn wrote a child"
    assert info.spawned == 0
    errors = {item_id: items[item_id].last_error or "" for item_id in answers}
    assert all(items[item_id].status == "failed" for item_id in answers), errors
    assert all(items[item_id].attempts <= 1 for item_id in answers), "a refusal was retried"
    assert "'twin' more than once" in errors["dup-in-answer"]
    assert "'taken'" in errors["exists"] and "already holds" in errors["exists"]
    assert "below gate 1" in errors["below"]
    assert "non-empty string" in errors["bad-id"]
    assert "must be bytes" in errors["not-bytes"]
    assert "over the limit of 3" in errors["too-many"] and "page" in errors["too-many"]
    await client.close()


async def test_a_refused_spawn_dispatches_none_of_its_children(db_url, table_prefix,
                                                               make_store) -> None:
    """An answer whose spawn the database refuses (an id the partition holds) is written
    as the item's failure instead; the children it named were never stored, so none is
    called (a phantom call would share the real item's Idempotency-Key)."""
    client = AsyncClient(db_url, table_prefix)
    called: list[str] = []

    async def process(item: WorkItem) -> Result:
        called.append(item.id)
        if item.id == "parent":
            return Result(done=True, spawn=[NewItem("fresh", b""), NewItem("taken", b"")])
        return Result(done=True)

    await client.create_partition("p", [NewItem("parent", b""), NewItem("taken", b"", 1)])
    async with running(Watcher(make_store(), process, config())):
        info = await client.wait("p", timeout=30)
    items = {item.id: item for item in await client.items("p")}
    assert items["parent"].status == "failed" and "already holds" in (
        items["parent"].last_error or "")
    assert "fresh" not in items and "fresh" not in called, called
    assert info.status == "failed"
    await client.close()


async def test_a_fenced_write_spawns_nothing(db_url, table_prefix, make_store) -> None:
    """An answer that comes after its partition was cancelled is fenced off, and its
    spawn with it. (The processor may also see the cancel first and give the call up:
    then no answer comes, and nothing is spawned either.)"""
    client = AsyncClient(db_url, table_prefix)
    release = asyncio.Event()
    started = asyncio.Event()
    ended = asyncio.Event()  # the call answered, or was given up

    async def process(item: WorkItem) -> Result:
        started.set()
        try:
            await release.wait()
        finally:
            ended.set()
        return Result(done=True, spawn=[NewItem("orphan", b"")])

    await client.create_partition("p", [NewItem("slow", b"")])
    watcher = Watcher(make_store(), process, config())
    async with running(watcher):
        await asyncio.wait_for(started.wait(), 10)
        assert await client.cancel("p")
        release.set()
        await asyncio.wait_for(ended.wait(), 10)
    info = await client.partition("p")
    assert info.status == "cancelled"
    assert [item.id for item in await client.items("p")] == ["slow"]
    assert info.spawned == 0
    await client.close()


async def test_recursive_tree_then_reduce_counts_every_node(db_url, table_prefix,
                                                             make_store) -> None:
    """A tree three levels deep, each node spawning its children at gate 0, then a reduce
    at gate 1 counts the nodes: the count is exact, and no gate-1 work starts before the
    last gate-0 call ends."""
    client = AsyncClient(db_url, table_prefix)
    log: list[tuple[str, str]] = []
    fanout, depth = 3, 3

    async def process(item: WorkItem) -> Result:
        log.append(("start", item.id))
        level = item.id.count(".")
        children = ([NewItem(f"{item.id}.{n}", b"") for n in range(fanout)]
                    if level < depth else [])
        await asyncio.sleep(0.002)
        log.append(("end", item.id))
        return Result(gate=1, spawn=children)

    async def reduce(call: ReduceCall) -> ReduceResult:
        log.append(("reduce", str(len(call.items))))
        return ReduceResult(result=json.dumps(len(call.items)).encode())

    expected = sum(fanout ** level for level in range(depth + 1))
    await client.create_partition("p", [NewItem("n", b"")], reduce_gates=[1])
    async with running(Watcher(make_store(), process, config(concurrency=8), reduce=reduce)):
        info = await client.wait("p", timeout=60)
    assert info.status == "complete"
    assert json.loads(info.result or b"null") == expected
    assert info.spawned == expected - 1
    reduce_at = next(n for n, (what, _) in enumerate(log) if what == "reduce")
    assert all(what == "reduce" for what, _ in log[reduce_at:])
    assert sum(1 for what, _ in log if what == "end") == expected
    await client.close()


async def test_reduce_spawns_the_next_map(db_url, table_prefix, make_store) -> None:
    """map -> reduce -> map: the reduce's answer spawns the next gate's items."""
    client = AsyncClient(db_url, table_prefix)
    seen: list[tuple[str, int]] = []

    async def process(item: WorkItem) -> Result:
        seen.append((item.id, item.gate))
        return Result(gate=1) if item.gate == 0 else Result(done=True)

    async def reduce(call: ReduceCall) -> ReduceResult:
        return ReduceResult(spawn=[NewItem(f"next-{item.id}", b"") for item in call.items])

    await client.create_partition("p", [NewItem(f"a{n}", b"") for n in range(4)],
                                  reduce_gates=[1])
    async with running(Watcher(make_store(), process, config(), reduce=reduce)):
        info = await client.wait("p", timeout=30)
    assert info.status == "complete" and info.spawned == 4
    assert sorted(item_id for item_id, gate in seen if gate == 2) == [
        f"next-a{n}" for n in range(4)]
    items = {item.id: item for item in await client.items("p")}
    assert items["next-a0"].parent is None and items["next-a0"].gate == 2
    await client.close()


async def test_spawned_items_are_read_without_waiting_for_a_poll(db_url, table_prefix,
                                                                 make_store) -> None:
    """With a 20 s poll interval, children at the current gate still run at once."""
    client = AsyncClient(db_url, table_prefix)
    done = asyncio.Event()

    async def process(item: WorkItem) -> Result:
        if item.id == "root":
            return Result(done=True, spawn=[NewItem("child", b"")])
        done.set()
        return Result(done=True)

    await client.create_partition("p", [NewItem("root", b"")])
    watcher = Watcher(make_store(), process,
                      config(poll_interval=20.0, lease_duration=90.0))
    async with running(watcher):
        await wait_until(done.is_set, timeout=10, message="the spawned child's call")
    await client.close()


async def test_one_batch_spawning_an_id_twice_is_refused_whole(store, make_store) -> None:
    """Two answers of one batch spawn the same id: the batch writes nothing and the error
    names the second answer; alone, the first is written with its child."""
    await store.partition_create("p", [NewItem("a", b""), NewItem("b", b"")])
    await store.leases_take([LeaseRow("p", 1, 0, "")], "w1", 30)
    first = ItemWrite("p", "a", 1, "complete", None, 0, spawn=(NewItem("x", b"1", 0),))
    second = ItemWrite("p", "b", 1, "complete", None, 0, spawn=(NewItem("x", b"2", 0),))
    with pytest.raises(SpawnConflictError, match=r"item 'b'.*'x'"):
        await store.items_apply([first, second], "w1")
    assert [item.id for item in await store.items_list("p")] == ["a", "b"]
    assert await store.items_apply([first], "w1") == [True]
    items = {item.id: item for item in await store.items_list("p")}
    assert items["x"].parent == "a" and items["x"].data == b"1"
    assert (await store.partition_get("p")).spawned == 1
