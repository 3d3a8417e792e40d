"""One pass through every public store method, for checks that need every statement."""

from __future__ import annotations

import asyncio
import inspect
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import delete

from watcher.errors import (
    GateError,
    KeyNotFoundError,
    PartitionChangedError,
    PartitionExistsError,
    PartitionLeasedError,
    PartitionNotFoundError,
)
from watcher.models import FlowScope
from watcher.pipelines import ServedRoute
from watcher.records import ItemWrite, LeaseRow, NewItem, PartitionClose, PartitionSettings
from watcher.rules.error_history import appended
from watcher.rules.reduce import ReduceWrite
from watcher.rules.spawn import SpawnConflictError
from watcher.rules.timeline import Progress
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
    # A stale version held (a client write moved it on) is renewed at the version read.
    held = await store.leases_renew({"p1": versions["p1"] - 1, "p2": versions["p2"]}, "w1", 30)
    versions = {pid: version for pid, (version, _) in held.held.items()}
    # Items done since: the renewal adds them to p1's timeline (p2's is only read).
    held = await store.leases_renew(versions, "w1", 30, {"p1": Progress(0, 2, 1.0),
                                                         "p2": Progress(0, 0)},
                                    {row.id: row.timeline for row in won})
    versions = {pid: version for pid, (version, _) in held.held.items()}
    await store.partition_state("p1")
    ready = await store.items_ready("p1", 0, 10)
    await store.items_ready("p1", 0, 10, exclude=[ready[0].id])
    await store.items_oversize("p1", 0, 0, limit=10)
    by_id = {item.id: item for item in ready}
    # Every shape of guarded item write: with and without new data, with and without delay.
    applied = await store.items_apply([
        ItemWrite("p1", "a", by_id["a"].version, "available", 0, 1, data=b"x",
                  last_error="boom", retry_delay=0.5,
                  error_history=appended(None, attempt=1, gate=0, error="boom")),
        ItemWrite("p1", "b", by_id["b"].version, "failed", 0, 1, last_error="no"),
    ], "w1")
    assert applied == [True, True]
    await store.items_apply([ItemWrite("p1", "a", by_id["a"].version + 1, "complete", 0, 1,
                                       data=b"y")], "w1")
    await store.items_apply([ItemWrite("p2", "z", 1, "available", 0, 1, retry_delay=1.0)], "w1")
    # A write that spawns: the children go in with it; one already stored refuses it whole.
    assert await store.items_apply([ItemWrite("p2", "z", 2, "available", 0, 0,
                                              spawn=(NewItem("z1", b"s", 0),))], "w1") == [True]
    with pytest.raises(SpawnConflictError, match="'z1'"):
        await store.items_apply([ItemWrite("p2", "z", 3, "available", 0, 0,
                                           spawn=(NewItem("z1", b"s", 0),))], "w1")
    # The close a drained gate tries first: refused while an item failed (p1) or waits (p2).
    for pid, failures_allowed in (("p1", False), ("p2", True)):
        assert await store.partition_close_when_done(
            pid, versions[pid], "w1", gate=0, failures_allowed=failures_allowed,
            timeline="{}") is None
    # The close sent with a batch of results (PostgreSQL; elsewhere not tried): refused.
    assert await store.items_apply_closing(
        [ItemWrite("p2", "nope", 1, "complete", 0, 1)], "w1",
        [PartitionClose("p2", versions["p2"], 0, True, "{}")]) == ([False], [False])
    await store.gate_summary("p1", 0)
    new_version = await store.partition_transition("p1", versions["p1"], "w1", status="failed",
                                                   timeline=held.timelines["p1"])
    assert new_version is not None
    assert (await store.partition_timeline("p1"))[1] == held.timelines["p1"]
    report = await store.items_retry_failed("p1")
    assert (report.items_reset, report.reopened) == (1, True)
    # The retry moved the version on: a transition with the old one loses.
    assert await store.partition_transition("p1", new_version, "w1", gate=1) is None
    with pytest.raises(GateError, match="stranded"):
        await store.partition_set_gate("p1", 2)
    await store.partition_create("p4", [])
    with pytest.raises(GateError, match="nothing would ever run there"):
        await store.partition_set_gate("p4", 2)
    await store.partition_create("p7", [NewItem("g", b""), NewItem("h", b"", gate=2)])
    await store.leases_take(
        [row for row in await store.leases_read_free(10) if row.id == "p7"], "w3", 30)
    assert await store.items_apply([ItemWrite("p7", "g", 1, "complete", 0, 0)], "w3") == [True]
    await store.partition_set_gate("p7", 2)
    # w1 lost p7 to w3 with two items of gate 2 done: it hands them over.
    # p7 as an older processor created it during an upgrade: no timeline row yet. The
    # hand-over inserts it; a holder's write inserts it too, where it is missing again.
    await _drop_timeline_row(store, "p7")
    assert await store.timelines_hand_over({"p7": Progress(2, 2, 1.0), "p4": Progress(0, 0)}) == 1
    await _drop_timeline_row(store, "p7")
    state = await store.partition_state("p7")
    assert state is not None
    assert await store.partition_transition("p7", state.version, "w3", timeline="{}") is not None
    assert await store.partition_timeline("p7") == (True, "{}")
    with pytest.raises(GateError, match="only moves forward"):
        await store.partition_set_gate("p7", 0)
    await _drive_reduce_methods(store)
    await _drive_operations(store)
    await store.leases_release({"p2": versions["p2"] + 1}, "w1")
    await store.leases_take([LeaseRow("p2", 0, 0, "")], "w2", 30)  # a lost race
    # Item retention: open partitions by page; a batch at a plain gate and one at the
    # reduce gate a partition stands at.
    await store.partitions_open_page(after=None, limit=10)
    await store.partitions_open_page(after="p1", limit=10)
    # On p7 (open at gate 2, its item "g" complete), so that p1 keeps its complete item
    # for the checks callers of this scenario make afterwards.
    await asyncio.sleep(0.05)  # g is then older than the cutoff
    await store.items_purge_finished("p7", older_than=0.001, batch=10)
    await store.items_purge_finished("p7", older_than=0.001, batch=10, after="g")
    await store.partition_create("p9", [NewItem("r", b"")], PartitionSettings(frozenset({0})))
    await store.items_purge_finished("p9", older_than=0.001, batch=10)
    await store.removed_waits_purge(batch=10)
    await _drive_item_lookups(store)
    await _drive_flow(store)
    await _drive_schedules(store)
    await _drive_waits(store)
    await _drive_operator_answers(store)
    await _drive_rewind(store)
    await _drive_pipelines(store)
    await _drive_processors(store)


async def _drive_pipelines(store: Store) -> None:
    """Lease reads limited to the places a processor serves, a version pinned at a lease,
    an operator's move to another version, and the counts per pipeline and version."""
    await store.partition_create("pp1", [NewItem("a", b"")], PartitionSettings(pipeline="ocr"))
    await store.partition_create("pp2", [NewItem("a", b"")],
                                 PartitionSettings(pipeline="ocr", pipeline_version="v1"))
    every = (ServedRoute("ocr", "v2", True, frozenset({0})), ServedRoute("ocr", None, True, None))
    free = await store.leases_read_free(20, every)
    assert {row.id for row in free} == {"pp1", "pp2"}
    v2 = (ServedRoute("ocr", "v2", True, frozenset({0, 1})),)
    assert [row.id for row in await store.leases_read_free(20, v2)] == ["pp1"]
    await store.leases_take([row for row in free if row.id == "pp1"], "w7", 30)
    assert await store.partitions_pin_version([("pp1", "v2")], "w7") == ["pp1"]
    assert await store.partitions_pin_version([("pp1", "v3")], "w7") == []  # pinned once
    assert [row.id for row in await store.leases_of_owner("w7", 10, v2)] == ["pp1"]
    move = await store.partition_move_version("pp1", "v3")
    assert (move.before, move.after, move.released) == ("v2", "v3", True)
    with pytest.raises(PartitionNotFoundError):
        await store.partition_move_version("nothing", "v1")
    with pytest.raises(PartitionChangedError):
        await store.partition_move_version("pp2", "v2", version=99)
    counts = {(count.pipeline, count.version): count.open
              for count in await store.pipelines_count() if count.pipeline == "ocr"}
    assert counts == {("ocr", "v1"): 1, ("ocr", "v3"): 1}


async def _drive_processors(store: Store) -> None:
    """The processors' rows (made, rewritten, deleted; one serving everything) and the
    open partitions' places."""
    await store.processors_register("w8", (ServedRoute("ocr", None, True, frozenset({0})),), 30)
    await store.processors_register("w8", (ServedRoute("ocr", "v3", False, None),), 30)
    await store.processors_register("w9", None, 30)
    assert [(row.owner, row.serves) for row in await store.processors_live()] == [
        ("w8", (ServedRoute("ocr", "v3", False, None),)), ("w9", None)]
    assert await store.processors_unregister("w9") is True
    assert await store.processors_unregister("w9") is False
    places = {(place.pipeline, place.version, place.gate): place.partitions
              for place in await store.partitions_open_places() if place.pipeline == "ocr"}
    assert places == {("ocr", "v1", 0): 1, ("ocr", "v3", 0): 1}


async def _drive_rewind(store: Store) -> None:
    """A rewind with a spawned child to remove and a reduce to run again, one narrowed to
    named failed items (a reduce gate re-armed), and a refusal (rolled back)."""
    await store.partition_create("r1", [NewItem("m", b""), NewItem("n", b"")],
                                 PartitionSettings(frozenset({1}), continue_on_failure=True))
    [lease] = await store.leases_take(
        [row for row in await store.leases_read_free(100) if row.id == "r1"], "w1", 30)
    assert await store.items_apply([
        ItemWrite("r1", "m", 1, "complete", 1, 0, spawn=(NewItem("m1", b"", 1),)),
        ItemWrite("r1", "n", 1, "failed", 0, 1, last_error="x")], "w1") == [True, True]
    assert await store.partition_transition("r1", lease.version, "w1", gate=1,
                                            status="complete") is not None
    report = await store.partition_rewind("r1", 0, failed_only=True, items=["n"])
    assert (report.items_reset, report.items_rerun) == (1, 1)
    report = await store.partition_rewind("r1", 0, version=report.version_before + 1)
    assert (report.items_reset, report.items_removed) == (2, 1)
    with pytest.raises(GateError, match="only goes back"):
        await store.partition_rewind("r1", 1)
    await _drive_notifications(store)


async def _drive_notifications(store: Store) -> None:
    """The notifications' outbox: closes that write an event (the drained gate's close
    and a holder's transition), the delivery loop's claim and each way it settles (a
    claim left to another processor too), the listings, the counts, a dead event sent
    again, and the purge of delivered ones."""
    from watcher.outbox import DeliveryState

    url = "https://example.com/hook"
    for pid in ("n1", "n2"):
        await store.partition_create(pid, [], PartitionSettings(notify=url))
    rows = [row for row in await store.leases_read_free(10) if row.id in ("n1", "n2")]
    won = {row.id: row for row in await store.leases_take(rows, "w9", 30)}
    assert won["n1"].settings.notify == url
    assert await store.partition_close_when_done("n1", won["n1"].version, "w9", gate=0,
                                                 failures_allowed=False, timeline="{}",
                                                 notify=True) is not None
    assert await store.partition_transition("n2", won["n2"].version, "w9", status="failed",
                                            notify=True) is not None
    claimed = await store.notifications_claim("d1", 10, 30.0)
    assert [event.partition_id for event in claimed] == ["n1", "n2"]
    assert await store.notification_settle(claimed[0], "d1", DeliveryState.DELIVERED,
                                           body=b"{}")
    assert await store.notification_settle(claimed[1], "d1", DeliveryState.PENDING,
                                           retry_in=0.0, error="HTTP 503", body=b"{}")
    (left,) = await store.notifications_claim("d1", 10, 30.0)
    # d1 may not send it (an internal host): it leaves it, unspent, and passes it by.
    assert await store.notification_leave(left, "d1", error="host is internal")
    assert await store.notifications_claim("d1", 10, 30.0, passing=[left.seq]) == []
    (again,) = await store.notifications_claim("d2", 10, 30.0)
    assert again.attempts == left.attempts
    assert await store.notification_settle(again, "d2", DeliveryState.DEAD, error="HTTP 400")
    assert not await store.notification_settle(again, "d2", DeliveryState.DEAD)  # settled
    await store.notifications_list()
    await store.notifications_list(state="dead", partition_id="n2", after=0, limit=10)
    assert (await store.notifications_counts())["dead"] == 1
    assert await store.notifications_redeliver([again.seq]) == 1
    await asyncio.sleep(0.05)
    assert await store.notifications_purge(0.001, 10) == 1


async def _drive_schedules(store: Store) -> None:
    """Add, read, pause, resume and delete a schedule; the ticker's due read; and each
    outcome of a tick's transaction."""
    from dataclasses import replace

    from watcher.schedules.records import DueSchedule, NewSchedule
    from watcher.schedules.timing import Timing
    from watcher.store.schedules import TickOutcome

    await store.schedule_add(NewSchedule("s1", Timing(every=3600.0), no_overlap=True,
                                         items=(NewItem("i", b"1"),),
                                         settings=PartitionSettings(key="tenant")))
    info = await store.schedule_get("s1")
    assert info is not None
    await store.schedules_list(after=None, limit=10)
    await store.schedules_list(after="a", limit=10)
    await store.schedule_items("s1")
    await store.schedules_due(10)
    due = DueSchedule("s1", info.version, info.timing, info.catch_up, True, info.created_at,
                      info.created_at, None, "tenant")
    tick = datetime(2030, 1, 1)
    assert await store.schedule_tick(due, tick, tick, create=True) is TickOutcome.CREATED
    assert await store.schedule_tick(due, tick, tick, create=True) is TickOutcome.LOST
    again = replace(due, version=due.version + 1, last_partition="s1/2030-01-01T00:00:00Z")
    assert await store.schedule_tick(again, tick, tick, create=True) is TickOutcome.OVERLAP
    again = replace(again, version=again.version + 1, no_overlap=False)
    assert await store.schedule_tick(again, tick, tick, create=True) is TickOutcome.EXISTED
    again = replace(again, version=again.version + 1)
    assert await store.schedule_tick(again, None, tick, create=False) is TickOutcome.PASSED
    assert await store.schedule_pause("s1", True) is True
    assert await store.schedule_pause("s1", False) is True
    await store.schedule_delete("s1")


async def _drop_timeline_row(store: Store, partition_id: str) -> None:
    """Delete a partition's timeline row, as if an older processor had created it."""
    t = store.tables.timelines
    async with store.engine.begin() as conn:
        await conn.execute(delete(t).where(t.c.partition_id == partition_id))


async def _drive_waits(store: Store) -> None:
    """A parking write (the item and its wait), a heartbeat, an operator's token, a
    completion that parks again, one refused as already completed, the read of expired
    waits, the summary of parked items, a completion by item, a refused park, a
    quorum's count and the tokens of calls given up."""
    from watcher.errors import AlreadyCompletedError
    from watcher.protocol import Result
    from watcher.waits import Wait, WaitWrite, token_hash

    await store.partition_create("pw", [NewItem("w", b"")])
    await store.leases_take(
        [row for row in await store.leases_read_free(20) if row.id == "pw"], "w5", 30)
    token = "t" * 43
    assert await store.items_apply([ItemWrite("pw", "w", 1, "waiting", 0, 0, data=b"p",
                                              retry_delay=60.0,
                                              wait=WaitWrite(token_hash(token), 60.0))],
                                   "w5") == [True]
    await store.wait_heartbeat(token, 120)
    operator = await store.wait_operator_token("pw", "w")  # a second token, same wait
    assert operator != token
    again = await store.wait_complete(operator, Result(wait=Wait(30)),
                                      traceparent=f"00-{'1' * 32}-{'2' * 16}-01")
    assert again.completion_token is not None
    with pytest.raises(AlreadyCompletedError):
        await store.wait_complete(token, Result(done=True))
    await store.items_wait_expired("pw", 0, 10)
    await store.waits_summary(["pw"])
    assert (await store.wait_complete_item("pw", "w", Result(done=True))).status == "complete"
    assert not await store.partition_park("pw", 1, "w5")  # its version moved on
    assert await store.quorum_settle("pw", 0, 1) == 1  # w is complete at gate 0
    given_up = "g" * 43  # a call's token, given up in flight: its wait never begins
    await store.waits_never_begun("pw", [("w", given_up)])
    with pytest.raises(AlreadyCompletedError):
        await store.wait_complete(given_up, Result(done=True))


async def _drive_operator_answers(store: Store) -> None:
    """An operator's answers for items (``processor replay --apply``): new data and a gate,
    a parking answer, an error, one that spawns, and a stale version refused."""
    from watcher.errors import ItemChangedError
    from watcher.protocol import Result, RetryableError
    from watcher.waits import Wait

    await store.partition_create("pa", [NewItem("a", b"1"), NewItem("b", b"2"),
                                        NewItem("c", b"3"), NewItem("d", b"4")])
    versions = {item.id: item.version for item in await store.items_list("pa")}
    token = "r" * 43
    assert (await store.item_apply_answer("pa", "a", versions["a"],
                                          Result(gate=1, data=b"{}"), completion_token=token)
            ).gate == 1
    assert (await store.item_apply_answer("pa", "b", versions["b"], Result(wait=Wait(60)),
                                          completion_token=token)).status == "waiting"
    assert (await store.item_apply_answer("pa", "c", versions["c"], RetryableError("x"),
                                          completion_token=token)).attempts == 1
    await store.item_apply_answer("pa", "d", versions["d"],
                                  Result(done=True, spawn=[NewItem("e", b"5")]),
                                  completion_token=token)
    with pytest.raises(ItemChangedError):
        await store.item_apply_answer("pa", "a", versions["a"], Result(done=True),
                                      completion_token=token)
    await store.partition_cancel("pa")  # out of the free partitions the later steps take


async def _drive_item_lookups(store: Store) -> None:
    """One item by its key (with its data or without), and an id in every partition."""
    item = await store.item_get("p1", "a")
    assert item is not None and item.data == b"y"
    assert [(entry.attempt, entry.error) for entry in item.error_history] == [(1, "boom")]
    assert await store.item_get("p1", "a", with_data=False) is not None
    assert await store.item_get("p1", "no such item") is None
    with pytest.raises(PartitionNotFoundError):
        await store.item_get("no such partition", "a")
    assert {found.partition_id for found in await store.items_find("a", 10)} == {"p1"}


async def _drive_flow(store: Store) -> None:
    """Flow control, each shape once: keyed partitions (by the key's fair-queuing clock,
    and scheduled), a key's limits, the grants of its in-flight limit, pauses of a key
    and of the fleet, the rows listed, a rate limit's bucket and a handler's hold."""
    await store.partition_create("k1", [NewItem("a", b"")],
                                 PartitionSettings(priority=5, key="tenant"))
    later = datetime.now(UTC) + timedelta(days=1)
    await store.partition_create("k2", [NewItem("a", b"")],
                                 PartitionSettings(key="tenant"), start_at=later)
    assert "k2" not in {row.id for row in await store.leases_read_free(50)}, "not before its start"
    await store.key_prepare("tenant")  # it exists already: nothing is written
    with pytest.raises(KeyNotFoundError):
        await store.flow_limits_set(FlowScope.KEY, "no such key", max_inflight=1)
    await store.flow_limits_set(FlowScope.KEY, "tenant", max_inflight=2, rate_limit=5.0)
    await store.flow_limits_set(FlowScope.HANDLER, "h", rate_limit=1.0, define=True)
    assert await store.key_limits(["tenant", "k-none"]) == {"tenant": 2}
    assert await store.key_rates(["tenant", "k-none"]) == {"tenant": 5.0}
    # Grants: all that is free; none beside it (a row that wants); an even share kept
    # while another wants (an update); a grant of nothing removed.
    assert (await store.flow_grant("tenant", "w1", limit=2, wanted=3, in_use=0,
                                   duration=30)).slots == 2
    assert (await store.flow_grant("tenant", "w2", limit=2, wanted=1, in_use=0,
                                   duration=30)).slots == 0
    shared = await store.flow_grant("tenant", "w1", limit=2, wanted=2, in_use=0, duration=30)
    assert (shared.slots, shared.target) == (1, 1)
    await store.flow_grant("tenant", "w1", limit=2, wanted=0, in_use=0, duration=30)
    assert await store.flow_grants_list("tenant") == [("w2", 0, 1)]
    assert await store.flow_grants_live(limit=100) == {"tenant": [("w2", 0, 1)]}
    assert await store.flow_grants_release("w2") == 1
    # Pauses: a key (twice: the second changes nothing), the fleet; then resumed.
    assert await store.flow_pause(FlowScope.KEY, "tenant", True) is True
    assert await store.flow_pause(FlowScope.KEY, "tenant", True) is False
    assert await store.flow_pause(FlowScope.FLEET, "", True, define=True) is True
    assert await store.flow_pause(FlowScope.FLEET, "", False) is True
    assert await store.flow_pause(FlowScope.KEY, "tenant", False) is True
    rows = await store.flow_controls_list()
    assert [(row.scope, row.name) for row in rows] == [("fleet", ""), ("handler", "h"),
                                                       ("key", "tenant")]
    assert [row.name for row in await store.flow_controls_list(
        FlowScope.KEY, limit=10, after=("handler", "h"))] == ["tenant"]
    # A rate limit's bucket, and a handler's hold (its Retry-After).
    assert 0 <= await store.flow_tokens_claim(FlowScope.KEY, "tenant", rate=5.0, want=3) <= 3
    await store.flow_block(FlowScope.HANDLER, "h", 60.0)
    assert 0 < await store.flow_blocked_for(FlowScope.HANDLER, "h") <= 60
    assert await store.flow_blocked_for(FlowScope.HANDLER, "no such handler") == 0




async def _drive_reduce_methods(store: Store) -> None:
    """The reduce gate's reads and guarded writes, each shape once."""
    await store.partition_create("p3", [NewItem("r1", b"1"), NewItem("r2", b"2")],
                                 PartitionSettings(frozenset({0}), continue_on_failure=True))
    free = [row for row in await store.leases_read_free(10) if row.id == "p3"]
    [lease] = await store.leases_take(free, "w1", 30)
    # Its settings as created (the lease also carries its queue place, rank_at).
    assert (lease.settings.reduce_gates, lease.settings.continue_on_failure) == (
        frozenset({0}), True)
    state = await store.reduce_state_read("p3")
    assert state is not None and state.pass_ is None
    entries = await store.reduce_entries("p3", 0, after=None, limit=10, include_failed=True)
    await store.reduce_entries("p3", 0, after="r1", limit=10, include_failed=False)
    version = await store.reduce_failed("p3", lease.version, "w1", attempts=1, error="x",
                                        fail=False)
    assert version is not None
    step = ReduceWrite("apply", 1, "r1", b"[]", b"{}", (
        ItemWrite("p3", "r1", entries[0].version, "complete", 0, 0),
        ItemWrite("p3", "r2", entries[1].version, "available", 1, 0, data=b"z")),
        spawn=(NewItem("r3", b"3", 1),))
    written = await store.reduce_write("p3", version, "w1", step)
    assert written is not None
    assert await store.reduce_write("p3", version, "w1", step) is None  # a lost guard
    await store.reduce_failed("p3", written, "w1", attempts=9, error="y", fail=True)
    # A retry of a complete partition that failed an item before its reduce gate: it
    # re-opens at the failed gate, and the items the reduce completed go back to it.
    await store.partition_create("p8", [NewItem("f", b""), NewItem("k", b"")],
                                 PartitionSettings(frozenset({1}), continue_on_failure=True))
    [lease] = await store.leases_take(
        [row for row in await store.leases_read_free(10) if row.id == "p8"], "w1", 30)
    assert await store.items_apply([ItemWrite("p8", "f", 1, "failed", 0, 1, last_error="x"),
                                    ItemWrite("p8", "k", 1, "complete", 1, 0)], "w1") == [
        True, True]
    assert await store.partition_transition("p8", lease.version, "w1", gate=1,
                                            status="complete") is not None
    report = await store.items_retry_failed("p8")
    assert (report.items_reset, report.items_rerun, report.gate) == (1, 1, 0)


async def _drive_operations(store: Store) -> None:
    """Paged reads, cancel, delete, purge, the leader lease and the backlog, each shape once."""
    first = await store.partitions_page(status=None, limit=1)
    assert first.next_cursor is not None
    await store.partitions_page(status="available", after=first.next_cursor, limit=2)
    page = await store.items_page("p1", limit=1)
    await store.items_page("p1", status="available", gate=1, after=page.next_cursor, limit=5,
                           with_data=False)
    await store.backlog_read(1000)
    # The console's reads: a prefix page without counts, gate counts, finished per minute.
    assert [info.id for info in await store.partitions_page(prefix="p1", with_counts=False)
            ] == ["p1"]
    counts = await store.items_gate_counts(["p1", "p4", "unknown"])
    assert set(counts) == {"p1", "p4"} and counts["p4"] == {}
    # The live feed's poll: every watched partition in one read, unknown ids left out.
    watched = await store.partition_states(["p1", "p4", "unknown"])
    assert set(watched) == {"p1", "p4"}
    assert len((await store.partitions_finished_per_minute(3, 100)).finished["complete"]) == 3
    await store.partition_create("p5", [NewItem("x", b"1"), NewItem("y", b"2")])
    # A pause holds it out of the lease scan and its ready read; a resume lifts it.
    assert await store.partition_pause("p5", True) is True
    assert await store.items_ready("p5", 0, 10) == []
    assert await store.partition_pause("p5", False) is True
    assert await store.partition_cancel("p5") == "available"
    assert await store.partition_cancel("p5") == "cancelled"
    await store.leases_stopped("w1", 30)
    # A leased partition refuses a plain delete; force takes it.
    await store.partition_create("p6", [NewItem(item_id, b"") for item_id in "abcd"])
    free = [row for row in await store.leases_read_free(10) if row.id == "p6"]
    await store.leases_take(free, "w1", 30)
    with pytest.raises(PartitionLeasedError):
        await store.partition_delete_begin("p6")
    await store.partition_delete_begin("p6", force=True)
    batch = await store.partition_delete_batch("p6", 3)
    assert (batch.items, batch.done) == (3, False)
    assert (await store.partition_delete_batch("p6", 3)).done
    # Purge: candidates, a dry-run count, and a batch that marks and deletes at once.
    await asyncio.sleep(0.05)  # p5 is then older than the cutoff (by any clock's precision)
    assert await store.partitions_purgeable(older_than=0.001, statuses=("cancelled",),
                                            limit=10) == ["p5"]
    await store.partitions_purgeable_count(older_than=0.001, statuses=("cancelled",))
    assert (await store.partition_delete_batch(
        "p5", 10, statuses=("cancelled",), older_than=0.001)).done
    assert await store.leader_take("retention", "w1", 30)
    assert not await store.leader_take("retention", "w2", 30)
    assert await store.leader_release("retention", "w1")
    from watcher.store.fleet import handover_duty

    assert await store.leader_take(handover_duty("w3"), "w3", 30)
    assert await store.handover_askers() == ["w3"]
