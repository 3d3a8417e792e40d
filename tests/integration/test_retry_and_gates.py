"""retry_failed and set_gate on real databases: a complete partition never holds an
available item, whatever path puts one back; a retry says what it did; a gate move that
means nothing is refused and writes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from processor import AsyncClient, NewItem
from tests.support.engine import running
from watcher import Result, Watcher, WatcherConfig, WorkItem
from watcher.errors import GateError
from watcher.protocol import NonRetryableError
from watcher.records import ItemWrite, PartitionSettings
from watcher.store import Store
from watcher.waits import WaitWrite, new_completion_token, token_hash

FAST = {"poll_interval": 0.05, "lease_duration": 3.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2}


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


async def stranded(store: Store) -> dict[str, int]:
    """Complete partitions holding available items, with how many: must stay empty."""
    infos = await store.partitions_list(status="complete", limit=10_000)
    return {info.id: info.counts["available"] for info in infos
            if info.counts.get("available")}


async def lease(store: Store, partition_id: str, owner: str = "setup") -> int:
    [row] = [row for row in await store.leases_read_free(1000) if row.id == partition_id]
    [won] = await store.leases_take([row], owner, 300)
    return won.version


async def answer(store: Store, partition_id: str, writes: dict[str, tuple[str, int]],
                 owner: str = "setup") -> None:
    """Write each item's (status, gate) as its holder would; every write must count."""
    items = {item.id: item for item in await store.items_list(partition_id)}
    applied = await store.items_apply([
        ItemWrite(partition_id, item_id, items[item_id].version, status, gate,
                  attempts=1 if status == "failed" else 0,
                  last_error="boom" if status == "failed" else None)
        for item_id, (status, gate) in writes.items()], owner)
    assert all(applied), applied


async def close(store: Store, partition_id: str, version: int, gate: int, status: str) -> None:
    assert await store.partition_transition(partition_id, version, "setup", gate=gate,
                                            status=status) is not None


async def test_retry_re_opens_a_complete_partition_at_its_lowest_failed_gate(
        client: AsyncClient, store: Store) -> None:
    """The defect: failed items reset in a partition that stayed complete. Now every
    failed item runs again from its gate, and the partition is open until they have."""
    await client.create_partition("p", [NewItem(f"i{n}", b"", gate=0) for n in range(4)],
                                  on_item_failure="continue")
    version = await lease(store, "p")
    await answer(store, "p", {"i0": ("failed", 0), "i1": ("available", 2),
                              "i2": ("complete", 0), "i3": ("available", 2)})
    version = await store.partition_transition("p", version, "setup", gate=2)
    await answer(store, "p", {"i1": ("failed", 2), "i3": ("complete", 2)})
    await close(store, "p", version, 2, "complete")
    assert (await client.partition("p")).counts == {"complete": 2, "failed": 2}

    report = await client.retry_failed("p")
    assert (report.status_before, report.gate_before, report.status, report.gate) == (
        "complete", 2, "available", 0)
    assert (report.items_reset, report.items_rerun, report.items_left_failed) == (2, 0, 0)
    assert report.reopened and not report.reduce_rearmed
    info = await client.partition("p")
    assert (info.status, info.gate, info.counts) == ("available", 0,
                                                     {"available": 2, "complete": 2})
    assert {item.id: (item.status, item.gate, item.attempts)
            for item in await client.items("p", status="available")} == {
        "i0": ("available", 0, 0), "i1": ("available", 2, 0)}
    assert await stranded(store) == {}
    with pytest.raises(TimeoutError, match="still available at gate 0"):
        await client.wait("p", timeout=0.2)


async def test_retry_runs_a_finished_reduce_again_over_the_items_it_completed(
        client: AsyncClient, store: Store) -> None:
    """A failure before a reduce gate: the retried items reach the reduce gate again,
    and the items the reduce completed there are back too, so it reduces the whole gate."""
    await client.create_partition("p", [NewItem(f"i{n}", b"") for n in range(3)],
                                  reduce_gates=[1, 3], on_item_failure="continue")
    version = await lease(store, "p")
    await answer(store, "p", {"i0": ("failed", 0), "i1": ("available", 1),
                              "i2": ("complete", 0)})
    version = await store.partition_transition("p", version, "setup", gate=1)
    await answer(store, "p", {"i1": ("complete", 1)})  # as the reduce at gate 1 answered
    await close(store, "p", version, 1, "complete")

    report = await client.retry_failed("p")
    assert (report.gate, report.items_reset, report.items_rerun) == (0, 1, 1)
    assert {(item.id, item.status, item.gate) for item in await client.items("p")} == {
        ("i0", "available", 0), ("i1", "available", 1), ("i2", "complete", 0)}
    assert await stranded(store) == {}


@pytest.mark.parametrize("stopped", ["failed", "cancelled"])
async def test_retry_of_a_stopped_partition_runs_the_failures_it_had_passed(
        client: AsyncClient, store: Store, stopped: str) -> None:
    await client.create_partition("p", [NewItem("a", b""), NewItem("b", b"")],
                                  on_item_failure="continue")
    version = await lease(store, "p")
    await answer(store, "p", {"a": ("failed", 0), "b": ("available", 1)})
    version = await store.partition_transition("p", version, "setup", gate=1)
    if stopped == "failed":
        await close(store, "p", version, 1, "failed")
    else:
        assert await client.cancel("p")
    report = await client.retry_failed("p")
    assert (report.status_before, report.gate_before, report.gate, report.items_reset) == (
        stopped, 1, 0, 1)
    info = await client.partition("p")
    assert (info.status, info.gate, info.counts) == ("available", 0, {"available": 2})


async def test_retry_of_a_running_partition_keeps_its_gate_and_says_what_it_left(
        client: AsyncClient, store: Store) -> None:
    await client.create_partition("p", [NewItem("a", b""), NewItem("b", b""),
                                        NewItem("c", b"", gate=1)], on_item_failure="continue")
    version = await lease(store, "p")
    await answer(store, "p", {"a": ("failed", 0), "b": ("available", 1)})
    await store.partition_transition("p", version, "setup", gate=1)
    await answer(store, "p", {"c": ("failed", 1)})
    report = await client.retry_failed("p")
    assert (report.status_before, report.status, report.gate) == ("available", "available", 1)
    assert (report.items_reset, report.items_left_failed, report.reopened) == (1, 1, False)
    statuses = {item.id: item.status for item in await client.items("p")}
    assert statuses == {"a": "failed", "b": "available", "c": "available"}


async def test_a_retry_with_nothing_to_do_writes_nothing(client: AsyncClient,
                                                         store: Store) -> None:
    await client.create_partition("p", [NewItem("a", b"")])
    version = await lease(store, "p")
    await answer(store, "p", {"a": ("complete", 0)})
    await close(store, "p", version, 0, "complete")
    before = await client.partition("p")
    report = await client.retry_failed("p")
    assert not report and not report.reopened and report.items_reset == 0
    after = await client.partition("p")
    assert (after.status, after.version, after.updated_at) == (
        "complete", before.version, before.updated_at)


async def test_add_items_re_opens_a_complete_partition_in_the_same_write(
        client: AsyncClient, store: Store) -> None:
    await client.create_partition("p", [NewItem("a", b"")])
    version = await lease(store, "p")
    await answer(store, "p", {"a": ("complete", 0)})
    await close(store, "p", version, 0, "complete")
    assert await client.add_items("p", [NewItem("b", b"", gate=2)]) is True
    assert (await client.partition("p")).status == "available"
    assert await stranded(store) == {}


async def test_engine_runs_the_retried_items_of_a_complete_partition_and_wait_waits(
        client: AsyncClient, make_store: Any) -> None:
    """End to end with a watcher: a continue partition completes with a failure; after
    the fix and a retry, wait() returns only once the item ran again, through the gates
    after it."""
    broken = {"b"}
    calls: list[tuple[str, int]] = []

    async def process(item: WorkItem) -> Result:
        calls.append((item.id, item.gate))
        if item.id in broken:
            raise NonRetryableError("unreadable scan")
        return Result(gate=item.gate + 1) if item.gate < 2 else Result(done=True)

    await client.create_partition("p", [NewItem("a", b""), NewItem("b", b"")],
                                  on_item_failure="continue")
    watcher = Watcher(make_store(), process, WatcherConfig(owner_id="w1", **FAST))
    async with running(watcher):
        info = await client.wait("p", timeout=20)
        assert (info.status, info.counts) == ("complete", {"complete": 1, "failed": 1})
        broken.clear()
        calls.clear()
        report = await client.retry_failed("p")
        assert (report.reopened, report.gate, report.items_reset) == (True, 0, 1)
        info = await client.wait("p", timeout=20)
    assert (info.status, info.counts) == ("complete", {"complete": 2})
    assert calls == [("b", 0), ("b", 1), ("b", 2)]


# -- set_gate ---------------------------------------------------------------------


async def test_set_gate_refuses_moves_that_mean_nothing_and_writes_nothing(
        client: AsyncClient, store: Store) -> None:
    await client.create_partition("open", [NewItem("a", b""), NewItem("z", b"", gate=4)])
    version = await lease(store, "open")
    await answer(store, "open", {"a": ("complete", 0)})
    await client.create_partition("done", [NewItem("a", b"")])
    done_version = await lease(store, "done")
    await answer(store, "done", {"a": ("complete", 0)})
    await close(store, "done", done_version, 0, "complete")
    await client.create_partition("stopped", [NewItem("a", b"")])
    assert await client.cancel("stopped")
    await client.create_partition("failing", [NewItem("a", b"")])
    failing_version = await lease(store, "failing")
    await answer(store, "failing", {"a": ("failed", 0)})
    await close(store, "failing", failing_version, 0, "failed")
    await client.create_partition("empty", [])
    # One item parked at gate 0 (its wait's deadline far off), another ready at gate 1.
    await client.create_partition("parked", [NewItem("a", b""), NewItem("b", b"", gate=1)])
    await lease(store, "parked")
    [waiting] = [item for item in await store.items_list("parked") if item.id == "a"]
    assert await store.items_apply([ItemWrite(
        "parked", "a", waiting.version, "waiting", 0, 0, retry_delay=600.0,
        wait=WaitWrite(token_hash(new_completion_token()), 600.0))], "setup") == [True]

    refusals = [("done", 99, "it is complete"), ("stopped", 1, "it is cancelled"),
                ("failing", 1, "it is failed"),
                ("open", 5, r"1 item\(s\) at gate 4 are still available"),
                ("empty", 1, "no item of it is available"),
                ("parked", 1, r"1 item\(s\) at gate 0 are waiting for a completion")]
    for partition_id, gate, message in refusals:
        before = await client.partition(partition_id)
        with pytest.raises(GateError, match=message):
            await client.set_gate(partition_id, gate)
        after = await client.partition(partition_id)
        assert (after.status, after.gate, after.version) == (
            before.status, before.gate, before.version), partition_id
    # A move to the gate it is at changes nothing (and writes nothing); forward works.
    await client.set_gate("open", 0)
    assert (await client.partition("open")).version == version
    await client.set_gate("open", 4)
    assert (await client.partition("open")).gate == 4


async def test_partition_settings_survive_a_retry(client: AsyncClient, store: Store) -> None:
    """The retry's partition write changes status, gate and reduce state only."""
    await client.create_partition("p", [NewItem("a", b"")], reduce_gates=[5],
                                  on_item_failure="continue")
    version = await lease(store, "p")
    await answer(store, "p", {"a": ("failed", 0)})
    await close(store, "p", version, 0, "complete")
    await client.retry_failed("p")
    [row] = [row for row in await store.leases_read_free(10) if row.id == "p"]
    # Every setting as created; its queue place (rank_at) is the lease scan's, not fixed.
    assert replace(row.settings, queue_order=0.0) == PartitionSettings(
        frozenset({5}), continue_on_failure=True)


async def test_a_partition_stranded_before_the_fix_is_not_done_and_retry_heals_it(
        client: AsyncClient, store: Store) -> None:
    """A database may hold a complete partition with available items (left by a version
    before this fix): wait() does not call it done, and retry re-opens it."""
    await client.create_partition("p", [NewItem("a", b""), NewItem("b", b"", gate=2)])
    version = await lease(store, "p")
    await answer(store, "p", {"a": ("complete", 0)})
    await close(store, "p", version, 0, "complete")  # closed over "b", as the defect did
    assert await stranded(store) == {"p": 1}
    with pytest.raises(TimeoutError, match="processor retry re-opens it"):
        await client.wait("p", timeout=0.2)
    report = await client.retry_failed("p")
    assert (report.reopened, report.gate, report.items_reset) == (True, 0, 0)
    assert await stranded(store) == {}
    assert (await client.partition("p")).status == "available"
