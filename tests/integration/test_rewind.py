"""rewind on real databases: which items go back, which spawned ones are removed, what a
reduce does again, what is refused (writing nothing), and the version guard."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from processor import AsyncClient, NewItem
from tests.support.engine import running
from watcher import Result, Watcher, WatcherConfig, WorkItem
from watcher.errors import (
    AlreadyCompletedError,
    GateError,
    InvalidInputError,
    ItemNotFoundError,
    PartitionChangedError,
    PartitionNotFoundError,
)
from watcher.records import ItemWrite, PartitionSettings
from watcher.rules.reduce import ReduceWrite
from watcher.rules.timeline import decode_timeline
from watcher.store import Store
from watcher.waits import WaitWrite, new_completion_token, token_hash


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


async def lease(store: Store, partition_id: str, owner: str = "setup") -> int:
    [row] = [row for row in await store.leases_read_free(1000) if row.id == partition_id]
    [won] = await store.leases_take([row], owner, 300)
    return won.version


async def answer(store: Store, partition_id: str, writes: dict[str, tuple[str, int]],
                 spawn: dict[str, tuple[NewItem, ...]] | None = None,
                 owner: str = "setup") -> None:
    """Write each item's (status, gate) as its holder would; every write must count."""
    items = {item.id: item for item in await store.items_list(partition_id)}
    applied = await store.items_apply([
        ItemWrite(partition_id, item_id, items[item_id].version, status, gate,
                  attempts=1 if status == "failed" else 0,
                  last_error="boom" if status == "failed" else None,
                  spawn=(spawn or {}).get(item_id, ()))
        for item_id, (status, gate) in writes.items()], owner)
    assert all(applied), applied


async def places(client: AsyncClient, partition_id: str) -> dict[str, tuple[str, int, int]]:
    return {item.id: (item.status, item.gate, item.attempts)
            for item in await client.items(partition_id)}


async def spawned_tree(client: AsyncClient, store: Store) -> int:
    """Partition "p", complete at gate 2 with a reduce at gate 2: a0 spawned c1 (gate 1)
    at gate 1, c1 spawned g1 at gate 2; a1 failed at gate 1; a2 completed at gate 0;
    b0 spawned c0 at gate 0 (below any rewind to 1). Returns the version."""
    await client.create_partition("p", [NewItem(f"a{n}", b"") for n in range(3)]
                                  + [NewItem("b0", b"")],
                                  reduce_gates=[2], on_item_failure="continue")
    version = await lease(store, "p")
    await answer(store, "p", {"a0": ("available", 1), "a1": ("available", 1),
                              "a2": ("complete", 0), "b0": ("available", 1)},
                 spawn={"b0": (NewItem("c0", b"", 0),)})
    await answer(store, "p", {"c0": ("complete", 0)})
    version = await store.partition_transition("p", version, "setup", gate=1)
    assert version is not None
    await answer(store, "p", {"a0": ("available", 2), "a1": ("failed", 1),
                              "b0": ("available", 2)},
                 spawn={"a0": (NewItem("c1", b"", 1),)})
    await answer(store, "p", {"c1": ("available", 2)}, spawn={"c1": (NewItem("g1", b"", 2),)})
    version = await store.partition_transition("p", version, "setup", gate=2)
    assert version is not None
    # The reduce at gate 2 answers: it completes every item there, with a result.
    items = {item.id: item.version for item in await store.items_list("p")}
    version = await store.reduce_write("p", version, "setup", ReduceWrite(
        None, 0, None, None, b"sum", tuple(
            ItemWrite("p", item_id, items[item_id], "complete", 2, 0)
            for item_id in ("a0", "b0", "c1", "g1"))))
    assert version is not None
    assert (await client.partition("p")).result == b"sum"
    version = await store.partition_transition("p", version, "setup", status="complete")
    assert version is not None
    return version


async def test_rewind_sends_every_item_at_the_gate_back_and_removes_what_they_spawned(
        client: AsyncClient, store: Store) -> None:
    await spawned_tree(client, store)
    before = await client.partition("p")
    assert before.counts == {"complete": 6, "failed": 1}

    report = await client.rewind("p", 1)
    assert (report.status_before, report.gate_before, report.gate) == ("complete", 2, 1)
    assert report.version_before == before.version and report.reopened
    assert (report.items_reset, report.items_removed, report.items_rerun) == (3, 2, 0)
    assert report.reduces_again == (2,)
    # a0, a1, b0 go back to gate 1 with attempts reset; c1 and its child g1 are gone
    # (a0 spawns c1 again); a2 and c0 stay below the gate as they were.
    assert await places(client, "p") == {
        "a0": ("available", 1, 0), "a1": ("available", 1, 0), "b0": ("available", 1, 0),
        "a2": ("complete", 0, 0), "c0": ("complete", 0, 0)}
    info = await client.partition("p")
    assert (info.status, info.gate, info.result, info.spawned) == ("available", 1, None, 1)
    assert info.version > before.version and info.last_error is None
    timeline = decode_timeline((await store.partition_timeline("p"))[1])
    [mark] = timeline.rewinds
    assert (mark.from_gate, mark.to_gate, mark.items, mark.removed) == (2, 1, 3, 2)
    assert timeline.gates[-1].gate == 1 and timeline.gates[-1].ended is None
    # The error history of a1 keeps its failed attempt.
    [a1] = [item for item in await client.items("p") if item.id == "a1"]
    assert a1.last_error == "boom"


async def test_failed_only_sends_back_the_failed_items_and_rearms_the_reduce(
        client: AsyncClient, store: Store) -> None:
    await spawned_tree(client, store)
    report = await client.rewind("p", 1, failed_only=True)
    # Only a1 goes back; the reduce at gate 2 runs again over the items it completed.
    assert (report.items_reset, report.items_removed, report.items_rerun) == (1, 0, 4)
    assert await places(client, "p") == {
        "a0": ("available", 2, 0), "a1": ("available", 1, 0), "b0": ("available", 2, 0),
        "c1": ("available", 2, 0), "g1": ("available", 2, 0), "a2": ("complete", 0, 0),
        "c0": ("complete", 0, 0)}


async def test_items_sends_back_only_the_named_ones_and_what_they_spawned(
        client: AsyncClient, store: Store) -> None:
    await spawned_tree(client, store)
    report = await client.rewind("p", 2, items=["a0"])
    # a0 goes back to 2, where it had spawned nothing: c1 (spawned at gate 1, standing
    # at 2) cannot be told apart from a child of gate 2 and goes, with g1.
    assert (report.items_reset, report.items_removed) == (1, 2)
    got = await places(client, "p")
    assert got["a0"] == ("available", 2, 0) and "c1" not in got and "g1" not in got
    assert got["a1"] == ("failed", 1, 1) and got["b0"] == ("available", 2, 0)


@pytest.mark.parametrize(("gate", "kwargs", "error", "match"), [
    (3, {}, GateError, "only goes back"),
    (1, {"items": ["nope"]}, ItemNotFoundError, "no item 'nope'"),
    (1, {"items": ["a2"]}, GateError, "at gate 0, before it"),
    (1, {"items": ["a0"], "failed_only": True}, GateError, "complete, not failed"),
    (2, {"failed_only": True}, GateError, "no failed item at gate 2"),
    (1, {"version": 1}, PartitionChangedError, "not 1 as expected"),
])
async def test_refusals_write_nothing(client: AsyncClient, store: Store, gate: int,
                                      kwargs: dict[str, object], error: type[Exception],
                                      match: str) -> None:
    await spawned_tree(client, store)
    before = await places(client, "p")
    info = await client.partition("p")
    with pytest.raises(error, match=match):
        await client.rewind("p", gate, **kwargs)  # type: ignore[arg-type]
    assert await places(client, "p") == before
    after = await client.partition("p")
    assert (after.status, after.gate, after.version) == (info.status, info.gate, info.version)


async def test_bad_input_is_refused_before_the_database(client: AsyncClient) -> None:
    with pytest.raises(InvalidInputError, match="gate must be a whole number"):
        await client.rewind("p", -1)
    with pytest.raises(InvalidInputError, match="names no item"):
        await client.rewind("p", 0, items=[])
    with pytest.raises(PartitionNotFoundError):
        await client.rewind("nowhere", 0)


async def test_the_version_guards_the_rewind_and_fences_the_holder_out(
        client: AsyncClient, store: Store) -> None:
    await client.create_partition("q", [NewItem("x", b""), NewItem("y", b"")])
    version = await lease(store, "q", owner="w1")
    await answer(store, "q", {"x": ("available", 1), "y": ("available", 1)}, owner="w1")
    version = await store.partition_transition("q", version, "w1", gate=1)
    assert version is not None
    seen = await client.partition("q")
    stale = {item.id: item.version for item in await client.items("q")}
    report = await client.rewind("q", 0, version=seen.version)
    assert (report.items_reset, report.status_before) == (2, "available")
    # The holder's gate move and its item results at the old versions are refused.
    assert await store.partition_transition("q", version, "w1", gate=2) is None
    assert await store.items_apply([ItemWrite("q", "x", stale["x"], "complete", 1, 0)],
                                   "w1") == [False]
    info = await client.partition("q")
    assert (info.owner, info.gate, info.status) == ("", 0, "available")
    # Free to lease again at once.
    assert "q" in [row.id for row in await store.leases_read_free(1000)]


async def test_a_parked_item_goes_back_and_its_old_token_is_refused(
        client: AsyncClient, store: Store) -> None:
    await client.create_partition("w", [NewItem("x", b"")])
    await lease(store, "w")
    token = new_completion_token()
    [x] = await client.items("w")
    assert await store.items_apply([ItemWrite(
        "w", "x", x.version, "waiting", 1, 0, retry_delay=60,
        wait=WaitWrite(token_hash(token), 60.0, "fail"))], "setup") == [True]
    assert (await places(client, "w"))["x"][0] == "waiting"
    await client.rewind("w", 0)
    assert await places(client, "w") == {"x": ("available", 0, 0)}
    with pytest.raises(AlreadyCompletedError):
        await client.complete(token)


async def test_a_removed_spawned_items_token_is_told_its_item_was_deleted(
        client: AsyncClient, store: Store) -> None:
    """A rewind removes what the re-run items spawned; a wait one of those held ends
    with it, and its token answers 409 (the item was deleted), not 404."""
    await client.create_partition("w", [NewItem("x", b"")])
    await lease(store, "w")
    await answer(store, "w", {"x": ("complete", 1)}, spawn={"x": (NewItem("c", b"", 1),)})
    token = new_completion_token()
    c = next(item for item in await client.items("w") if item.id == "c")
    assert await store.items_apply([ItemWrite(
        "w", "c", c.version, "waiting", 1, 0, retry_delay=60,
        wait=WaitWrite(token_hash(token), 60.0))], "setup") == [True]
    await client.rewind("w", 0)
    assert set(await places(client, "w")) == {"x"}
    with pytest.raises(AlreadyCompletedError, match="deleted"):
        await client.complete(token)


async def test_skipped_items_of_a_quorum_go_back_too(client: AsyncClient,
                                                     store: Store) -> None:
    await store.partition_create("k", [NewItem(f"i{n}", b"") for n in range(3)],
                                 PartitionSettings(quorum=((0, 1),)))
    await lease(store, "k")
    await answer(store, "k", {"i0": ("complete", 0)})
    assert await store.quorum_settle("k", 0, 1) == 1
    assert {status for status, _, _ in (await places(client, "k")).values()} == {
        "complete", "skipped"}
    report = await client.rewind("k", 0)
    assert report.items_reset == 3
    assert {status for status, _, _ in (await places(client, "k")).values()} == {"available"}


async def reduce_at(store: Store, partition_id: str, version: int, gate: int,
                    completes: list[str], spawn: tuple[NewItem, ...], *,
                    recorded: bool) -> int:
    """The reduce at ``gate`` completes ``completes`` and spawns ``spawn``, recorded as
    its own (``recorded`` False: as a processor before revision 0018 wrote it, with no
    reduce named). Returns the new version."""
    items = {item.id: item.version for item in await store.items_list(partition_id)}
    written = await store.reduce_write(partition_id, version, "setup", ReduceWrite(
        None, 0, None, None, f"sum at {gate}".encode(), tuple(
            ItemWrite(partition_id, item_id, items[item_id], "complete", gate, 0)
            for item_id in completes), spawn, gate if recorded else None))
    assert written is not None
    return written


async def reduced_tree(client: AsyncClient, store: Store, *, recorded: bool = True) -> None:
    """Partition "r", complete at gate 4, with reduces at gates 1 and 3: a0 and a1 pass
    gate 0; the reduce at gate 1 completes them and spawns s (at gate 2) and t (at
    gate 3); s spawns s.k (gate 3) at gate 2; the reduce at gate 3 completes s, t and
    s.k and spawns z (gate 4), which fails there."""
    await client.create_partition("r", [NewItem("a0", b""), NewItem("a1", b"")],
                                  reduce_gates=[1, 3], on_item_failure="continue")
    version = await lease(store, "r")
    await answer(store, "r", {"a0": ("available", 1), "a1": ("available", 1)})

    async def move(**change: object) -> int:
        moved = await store.partition_transition("r", version, "setup", **change)
        assert moved is not None
        return moved

    version = await move(gate=1)
    version = await reduce_at(store, "r", version, 1, ["a0", "a1"], (
        NewItem("s", b"", 2), NewItem("t", b"", 3)), recorded=recorded)
    version = await move(gate=2)
    await answer(store, "r", {"s": ("available", 3)}, spawn={"s": (NewItem("s.k", b"", 3),)})
    version = await move(gate=3)
    version = await reduce_at(store, "r", version, 3, ["s", "t", "s.k"],
                              (NewItem("z", b"", 4),), recorded=recorded)
    version = await move(gate=4)
    await answer(store, "r", {"z": ("failed", 4)})
    await move(status="complete")
    info = await client.partition("r")
    assert (info.counts, info.spawned) == ({"complete": 5, "failed": 1}, 4)


@pytest.mark.parametrize(("gate", "kwargs", "report", "left", "spawned"), [
    # Both reduces run again: all they spawned goes (s.k with its parent s).
    (1, {}, (2, 4, 0, (1, 3)), {"a0": ("available", 1, 0), "a1": ("available", 1, 0)}, 0),
    # Only the reduce at 3 runs again: z goes; s and t (the reduce at 1's) go back to 2,
    # and s.k goes as s's child (s spawns it again at gate 2).
    (2, {}, (2, 2, 0, (3,)), {"a0": ("complete", 1, 0), "a1": ("complete", 1, 0),
                              "s": ("available", 2, 0), "t": ("available", 2, 0)}, 2),
    # z, the only failed item, is the reduce at 3's: removed, not sent back; that
    # reduce takes back the items it completed and spawns z afresh.
    (3, {"failed_only": True}, (0, 1, 3, (3,)), {
        "a0": ("complete", 1, 0), "a1": ("complete", 1, 0), "s": ("available", 3, 0),
        "t": ("available", 3, 0), "s.k": ("available", 3, 0)}, 3),
    # s named: the reduce at 1 that spawned it runs again, so it goes, with all the
    # reduces spawned; that reduce takes back a0 and a1.
    (1, {"items": ["s"]}, (0, 4, 2, (1, 3)), {"a0": ("available", 1, 0),
                                              "a1": ("available", 1, 0)}, 0),
    # After every reduce: z goes back to 4, and nothing a reduce spawned is removed.
    (4, {"failed_only": True}, (1, 0, 0, ()), {
        "a0": ("complete", 1, 0), "a1": ("complete", 1, 0), "s": ("complete", 3, 0),
        "t": ("complete", 3, 0), "s.k": ("complete", 3, 0), "z": ("available", 4, 0)}, 4),
])
async def test_what_a_reduce_that_runs_again_spawned_is_removed_with_its_descendants(
        client: AsyncClient, store: Store, gate: int, kwargs: dict[str, object],
        report: tuple[object, ...], left: dict[str, tuple[str, int, int]],
        spawned: int) -> None:
    await reduced_tree(client, store)
    done = await client.rewind("r", gate, **kwargs)  # type: ignore[arg-type]
    assert (done.items_reset, done.items_removed, done.items_rerun,
            done.reduces_again) == report
    assert await places(client, "r") == left
    info = await client.partition("r")
    assert (info.spawned, info.gate, info.status) == (spawned, gate, "available")
    assert (info.result is None) == bool(done.reduces_again)


async def test_items_a_reduce_spawned_before_it_was_recorded_are_kept(
        client: AsyncClient, store: Store) -> None:
    """Rows written before revision 0018 name no reduce: such an item cannot be told from
    a client's, and a rewind sends it back as before (its own children still go)."""
    await reduced_tree(client, store, recorded=False)
    report = await client.rewind("r", 1)
    assert (report.items_reset, report.items_removed) == (5, 1)
    assert await places(client, "r") == {
        item_id: ("available", 1, 0) for item_id in ("a0", "a1", "s", "t", "z")}


async def test_the_error_history_keeps_the_earlier_attempts_and_the_timeline_the_rewind(
        client: AsyncClient, store: Store) -> None:
    """x fails its two attempts under the engine; a rewind sends it back with its attempts
    reset, its error history as it was (times and all), and the rewind on the timeline.
    Run again, x fails once more, then passes: the history holds the three failures, the
    earlier two first."""
    calls: list[str] = []
    fail_next = {"x": 2}

    async def process(item: WorkItem) -> Result:
        calls.append(item.id)
        if item.id == "x" and fail_next["x"] > 0:
            fail_next["x"] -= 1
            raise RuntimeError(f"boom {calls.count('x')}")
        return Result(done=True)

    config = WatcherConfig(owner_id="w", max_retries=1, poll_interval=0.05,
                           lease_duration=3.0, retry_backoff=0.05, retry_backoff_max=0.2)
    await client.create_partition("h", [NewItem("x", b""), NewItem("y", b"")],
                                  on_item_failure="continue")
    async with running(Watcher(store, process, config)):
        assert (await client.wait("h", timeout=30)).status == "complete"
    first = await client.item("h", "x")
    assert first.status == "failed" and first.attempts == 2
    before = first.error_history
    assert [(entry.attempt, entry.gate) for entry in before] == [(1, 0), (2, 0)]
    assert ["boom 1" in before[0].error, "boom 2" in before[1].error] == [True, True]

    report = await client.rewind("h", 0, failed_only=True)
    assert (report.items_reset, report.status_before) == (1, "complete")
    back = await client.item("h", "x")
    assert (back.status, back.gate, back.attempts) == ("available", 0, 0)
    assert back.error_history == before  # every earlier attempt, as it was stamped
    [mark] = (await client.partition_timeline("h")).rewinds
    assert (mark.from_gate, mark.to_gate, mark.items, mark.removed) == (0, 0, 1, 0)

    fail_next["x"] = 1
    async with running(Watcher(store, process, config)):
        assert (await client.wait("h", timeout=30)).status == "complete"
    after = await client.item("h", "x")
    assert after.status == "complete"
    assert after.error_history[:2] == before
    [third] = after.error_history[2:]
    assert (third.attempt, third.gate) == (1, 0) and "boom 3" in third.error
    assert third.at >= before[-1].at
    [mark_after] = (await client.partition_timeline("h")).rewinds
    assert mark_after == mark
