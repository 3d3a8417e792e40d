"""One pass through every public store method, for checks that need every statement."""

from __future__ import annotations

import inspect

import pytest

from watcher.errors import GateError, PartitionExistsError
from watcher.records import ItemWrite, LeaseRow, NewItem, PartitionSettings
from watcher.reduction import ReduceStep
from watcher.store import Store

# Store methods that never run on SQL Server or MySQL (PostgreSQL LISTEN) or run no SQL.
NOT_STATEMENTS = {"notifications", "close"}


def store_methods() -> set[str]:
    """The public store methods that run SQL on every database."""
    return {
        name for name, member in inspect.getmembers(Store)
        if not name.startswith("_") and name not in NOT_STATEMENTS
        and (inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(member))
    }


async def drive_every_method(store: Store) -> None:
    """Call every public store method on an empty namespace.

    Goes through the branches that issue distinct SQL (new data or not, a retry
    delay or not, a stale renewal, a lost race, a refused gate move).
    """
    await store.ping()
    await store.now()
    await store.partition_create("p1", [NewItem("a", b"1"), NewItem("b", b"2"),
                                        NewItem("c", b"3", gate=2)])
    with pytest.raises(PartitionExistsError):
        await store.partition_create("p1", [])
    await store.partition_create("p2", [NewItem("z", b"9")])
    assert await store.items_add("p1", [NewItem("d", b"4", gate=1)]) is False
    await store.partition_get("p1")
    await store.partitions_list(status="available", limit=10)
    await store.items_list("p1")
    await store.lease_stats()
    free = await store.leases_read_free(10)
    won = await store.leases_take(free, "w1", 30)
    assert {row.id for row in won} == {"p1", "p2"}
    await store.leases_of_owner("w1", 10)
    versions = {row.id: row.version for row in won}
    # A stale version makes the renewal re-read the partition and retry once.
    held = await store.leases_renew({"p1": versions["p1"] - 1, "p2": versions["p2"]}, "w1", 30)
    versions = {pid: version for pid, (version, _) in held.held.items()}
    await store.partition_state("p1")
    ready = await store.items_ready("p1", 0, 10)
    await store.items_ready("p1", 0, 10, exclude=[ready[0].id])
    by_id = {item.id: item for item in ready}
    # Every shape of guarded item write: with and without new data, with and without delay.
    applied = await store.items_apply([
        ItemWrite("p1", "a", by_id["a"].version, "available", 0, 1, data=b"x",
                  last_error="boom", retry_delay=0.5),
        ItemWrite("p1", "b", by_id["b"].version, "failed", 0, 1, last_error="no"),
    ], "w1")
    assert applied == [True, True]
    await store.items_apply([ItemWrite("p1", "a", by_id["a"].version + 1, "complete", 0, 1,
                                       data=b"y")], "w1")
    await store.items_apply([ItemWrite("p2", "z", 1, "available", 0, 1, retry_delay=1.0)], "w1")
    await store.gate_summary("p1", 0)
    new_version = await store.partition_transition("p1", versions["p1"], "w1", status="failed")
    assert new_version is not None
    assert await store.items_retry_failed("p1") == 1
    # The retry moved the version on: a transition with the old one loses.
    assert await store.partition_transition("p1", new_version, "w1", gate=1) is None
    with pytest.raises(GateError, match="stranded"):
        await store.partition_set_gate("p1", 2)
    await store.partition_create("p4", [])
    await store.partition_set_gate("p4", 2)
    with pytest.raises(GateError, match="only moves forward"):
        await store.partition_set_gate("p4", 0)
    await _drive_reduce_methods(store)
    await store.leases_release({"p2": versions["p2"] + 1}, "w1")
    await store.leases_take([LeaseRow("p2", 0, 0, "")], "w2", 30)  # a lost race




async def _drive_reduce_methods(store: Store) -> None:
    """The reduce gate's reads and guarded writes, each shape once."""
    await store.partition_create("p3", [NewItem("r1", b"1"), NewItem("r2", b"2")],
                                 PartitionSettings(frozenset({0}), continue_on_failure=True))
    free = [row for row in await store.leases_read_free(10) if row.id == "p3"]
    [lease] = await store.leases_take(free, "w1", 30)
    assert lease.settings == PartitionSettings(frozenset({0}), continue_on_failure=True)
    state = await store.reduce_state_read("p3")
    assert state is not None and state.pass_ is None
    entries = await store.reduce_entries("p3", 0, after=None, limit=10, include_failed=True)
    await store.reduce_entries("p3", 0, after="r1", limit=10, include_failed=False)
    version = await store.reduce_failed("p3", lease.version, "w1", attempts=1, error="x",
                                        fail=False)
    assert version is not None
    step = ReduceStep("apply", 1, "r1", b"[]", b"{}", (
        ItemWrite("p3", "r1", entries[0].version, "complete", 0, 0),
        ItemWrite("p3", "r2", entries[1].version, "available", 1, 0, data=b"z")))
    written = await store.reduce_write("p3", version, "w1", step)
    assert written is not None
    assert await store.reduce_write("p3", version, "w1", step) is None  # a lost guard
    await store.reduce_failed("p3", written, "w1", attempts=9, error="y", fail=True)
