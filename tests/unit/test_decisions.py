"""Table-driven tests of the pure decisions: balancing, read pacing, gates and item
outcomes."""

from __future__ import annotations

import dataclasses
import hashlib
import random

import pytest

from processor import NewItem
from watcher.config import WatcherConfig
from watcher.protocol import NonRetryableError, Result, RetryableError, WorkItem, step_key
from watcher.records import GateSummary, ItemWrite, LeaseStats, PartitionSettings, ReadyItem
from watcher.rules.balance import (
    Backlog,
    BalancePlan,
    backlog_room,
    fair_share,
    goes_ahead,
    plan_balance,
)
from watcher.rules.decisions import (
    GateAction,
    GateMove,
    ReadChoice,
    RetryPolicy,
    completed_in_place,
    decide_gate,
    decide_read,
    idempotency_step,
    outcome_name,
    reduces_to_run_again,
    result_problem,
    storable_text,
    unstorable_write,
    write_for_error,
    write_for_outcome,
    write_for_result,
)
from watcher.rules.spawn import SpawnLimits


@pytest.mark.parametrize(
    ("active", "owners", "expected"),
    [(0, 1, 0), (20, 2, 10), (21, 2, 11), (30, 4, 8), (1, 3, 1), (5, 0, 0)],
)
def test_fair_share(active: int, owners: int, expected: int) -> None:
    assert fair_share(active, owners) == expected


BALANCE_CASES = [
    # (description, stats, free, max_take, max_steal, expected plan)
    ("alone with free partitions takes up to max_take",
     LeaseStats(20, {}), 20, 16, 2, BalancePlan(20, take_free=16)),
    ("takes only what is free",
     LeaseStats(20, {"me": 17}), 3, 16, 2, BalancePlan(20, take_free=3)),
    ("counts itself as live: two owners share 20",
     LeaseStats(20, {"a": 0}), 20, 16, 2, BalancePlan(10, take_free=10)),
    ("at target takes nothing",
     LeaseStats(20, {"me": 10, "a": 10}), 0, 16, 2, BalancePlan(10)),
    ("below target, none free: steals from the most loaded, bounded",
     LeaseStats(20, {"a": 20}), 0, 16, 2, BalancePlan(10, steal_from="a", steal=2)),
    ("never steals the victim below target",
     LeaseStats(20, {"me": 9, "a": 11}), 0, 16, 5, BalancePlan(10, steal_from="a", steal=1)),
    ("never steals from an owner at target",
     LeaseStats(21, {"me": 10, "a": 11}), 0, 16, 2, BalancePlan(11)),
    ("picks the most loaded of several",
     LeaseStats(30, {"a": 8, "b": 14, "c": 8}), 0, 16, 4,
     BalancePlan(8, steal_from="b", steal=4)),
    ("ties broken by name so every watcher agrees",
     LeaseStats(30, {"b": 15, "a": 15}), 0, 16, 4, BalancePlan(10, steal_from="a", steal=4)),
    ("free partitions come before stealing",
     LeaseStats(30, {"a": 25}), 1, 16, 4, BalancePlan(15, take_free=1)),
    ("nothing active, nothing to do",
     LeaseStats(0, {}), 0, 16, 2, BalancePlan(0)),
    # The count of free partitions stopped at its cap: 1,000 counted of more.
    ("above the counted share, with more free than counted, still takes max_take",
     LeaseStats(1_600, {"me": 900, "a": 0}, free_at_cap=True), 64, 16, 2,
     BalancePlan(916, take_free=16)),
    ("more free than counted: takes only what was seen free",
     LeaseStats(1_000, {}, free_at_cap=True), 5, 16, 2, BalancePlan(1_000, take_free=5)),
    ("more free than counted, none seen free: no steal",
     LeaseStats(1_100, {"me": 0, "a": 100}, free_at_cap=True), 0, 16, 2, BalancePlan(550)),
]


@pytest.mark.parametrize(("stats", "free", "max_take", "max_steal", "expected"),
                         [case[1:] for case in BALANCE_CASES],
                         ids=[case[0] for case in BALANCE_CASES])
def test_plan_balance(stats, free, max_take, max_steal, expected) -> None:
    assert plan_balance("me", stats, free, max_take=max_take, max_steal=max_steal) == expected


def test_balance_converges_for_two_watchers() -> None:
    """Simulated rounds of stealing bring two owners to 10 each."""
    held = {"a": 20, "b": 0}
    for _ in range(10):
        for me in ("a", "b"):
            plan = plan_balance(me, LeaseStats(20, dict(held)), 0, max_take=16, max_steal=2)
            if plan.steal_from:
                held[plan.steal_from] -= plan.steal
                held[me] += plan.steal
    assert held == {"a": 10, "b": 10}


def test_backlog_room_fills_two_lease_batches_of_waiting_partitions() -> None:
    assert backlog_room(Backlog(0), lease_batch=16) == 32
    assert backlog_room(Backlog(20), lease_batch=16) == 12
    assert backlog_room(Backlog(32), lease_batch=16) == 0
    assert backlog_room(Backlog(50), lease_batch=16) == 0, "never below none"
    assert backlog_room(Backlog(1), lease_batch=1) == 1


@pytest.mark.parametrize(("settings", "backlog", "ahead"), [
    (PartitionSettings(queue_order=90.0), Backlog(32, 100.0), True),
    (PartitionSettings(queue_order=100.0), Backlog(32, 100.0), False),
    (PartitionSettings(queue_order=110.0), Backlog(32, 100.0), False),
    (PartitionSettings(queue_order=0.0), Backlog(0, None), False),
    (PartitionSettings(key="b", queue_order=110.0),
     Backlog(32, 100.0, frozenset({"a"})), True),
    (PartitionSettings(key="a", queue_order=110.0),
     Backlog(32, 100.0, frozenset({"a"})), False),
], ids=["a better place in the queue", "the same turn step", "a later place",
        "nothing waits", "a key none of its partitions has", "a key it holds already"])
def test_a_free_partition_goes_ahead_of_a_backlog(settings, backlog, ahead) -> None:
    assert goes_ahead(settings, backlog) is ahead


GATE_CASES = [
    ("items still pending wait", GateSummary(3, 1, 5), False, True, GateAction(GateMove.WAIT)),
    ("a failed item fails the partition", GateSummary(0, 1, 5), False, True,
     GateAction(GateMove.FAIL)),
    ("jumps to the lowest later gate", GateSummary(0, 0, 10), False, True,
     GateAction(GateMove.ADVANCE, 10)),
    ("manual checkpoint never moves the gate", GateSummary(0, 0, 10), True, True,
     GateAction(GateMove.IDLE)),
    ("everything done closes", GateSummary(0, 0, None), False, True,
     GateAction(GateMove.CLOSE)),
    ("auto-close off idles", GateSummary(0, 0, None), False, False, GateAction(GateMove.IDLE)),
    ("manual mode still closes when all is done", GateSummary(0, 0, None), True, True,
     GateAction(GateMove.CLOSE)),
    ("manual mode still fails on a failed item", GateSummary(0, 2, None), True, True,
     GateAction(GateMove.FAIL)),
]


@pytest.mark.parametrize(("summary", "manual", "auto_close", "expected"),
                         [case[1:] for case in GATE_CASES], ids=[case[0] for case in GATE_CASES])
def test_decide_gate(summary, manual, auto_close, expected) -> None:
    assert decide_gate(summary, auto_close=auto_close, manual_checkpoint=manual) == expected


# Slots: 32 in all, refill at 8. "looked empty" is the last read's finding; "since"
# is the seconds since that read, against a poll interval of 1 s.
READ_CASES = [
    # name, free slots, in use, in flight here, notified, looked empty, since, expected
    ("idle with every slot free reads", 32, 0, 0, False, False, 0.0, ReadChoice.READ),
    ("idle after an empty read steps the gate: its summary says if it moves", 32, 0, 0,
     False, True, 0.0, ReadChoice.MOVE_GATE),
    ("calls in flight and too few slots free wait for a turn", 7, 25, 3, False, False,
     5.0, ReadChoice.WAIT_FOR_SLOTS),
    ("other partitions' calls hold the slots: wait for a turn", 4, 28, 0, False, False,
     5.0, ReadChoice.WAIT_FOR_SLOTS),
    ("idle after an empty read steps the gate even when slots are short", 4, 28, 0, False,
     True, 0.0, ReadChoice.MOVE_GATE),
    ("idle after an empty read, then a client write: read", 20, 12, 0, True, True, 0.0,
     ReadChoice.READ),
    ("idle after a full read reads", 20, 12, 0, False, False, 0.0, ReadChoice.READ),
    ("a notification does not jump the slot queue", 4, 28, 2, True, False, 0.0,
     ReadChoice.WAIT_FOR_SLOTS),
    ("refill reached with calls in flight reads", 8, 24, 3, False, False, 0.0,
     ReadChoice.READ),
    ("in flight after an empty read waits for the poll", 20, 12, 3, False, True, 0.5,
     ReadChoice.WAIT_FOR_POLL),
    ("in flight after an empty read reads once the poll is due", 20, 12, 3, False, True,
     1.0, ReadChoice.READ),
    ("a client write is read at once", 20, 12, 3, True, True, 0.1, ReadChoice.READ),
    ("in flight and the last read was full: read again", 20, 12, 3, False, False, 0.0,
     ReadChoice.READ),
]

# The same, with rows read ahead (held to start as slots free): name, free slots, in
# use, in flight here, rows held, looked empty, since, expected.
READ_AHEAD_CASES = [
    ("rows held after an empty read start at once, not at the next poll", 20, 12, 3, 5,
     True, 0.1, ReadChoice.READ),
    ("rows held and nothing in flight: the gate is not drained yet", 32, 0, 0, 5, True,
     0.0, ReadChoice.READ),
    ("rows held but too few slots free: wait for a turn", 4, 28, 3, 5, True, 0.1,
     ReadChoice.WAIT_FOR_SLOTS),
    ("rows held, nothing in flight, too few slots free: wait, do not step", 4, 28, 0, 5,
     True, 0.1, ReadChoice.WAIT_FOR_SLOTS),
    ("none held and nothing in flight after an empty read: step the gate", 32, 0, 0, 0,
     True, 0.0, ReadChoice.MOVE_GATE),
]


@pytest.mark.parametrize(
    ("free", "in_use", "in_flight", "notified", "looked_empty", "since", "expected"),
    [case[1:] for case in READ_CASES], ids=[case[0] for case in READ_CASES])
def test_decide_read(free, in_use, in_flight, notified, looked_empty, since, expected) -> None:
    assert decide_read(free_slots=free, refill_at=8, slots_in_use=in_use,
                       in_flight=in_flight, notified=notified, gate_looked_empty=looked_empty,
                       since_last_read=since, poll_interval=1.0) is expected


@pytest.mark.parametrize(
    ("free", "in_use", "in_flight", "held", "looked_empty", "since", "expected"),
    [case[1:] for case in READ_AHEAD_CASES], ids=[case[0] for case in READ_AHEAD_CASES])
def test_decide_read_with_rows_read_ahead(free, in_use, in_flight, held, looked_empty, since,
                                          expected) -> None:
    assert decide_read(free_slots=free, refill_at=8, slots_in_use=in_use,
                       in_flight=in_flight, notified=False, gate_looked_empty=looked_empty,
                       since_last_read=since, poll_interval=1.0, read_ahead=held) is expected


ITEM = ReadyItem(id="i1", version=7, gate=2, data=b"old", attempts=1)
POLICY = RetryPolicy(max_retries=3, backoff=1.0, backoff_max=10.0, jitter=0.0)


def test_result_done_completes_and_resets_attempts() -> None:
    write = write_for_result("p", ITEM, Result(done=True), 2, POLICY)
    assert (write.status, write.gate, write.attempts, write.data, write.seen_version) == (
        "complete", 2, 0, None, 7)
    assert outcome_name(ITEM, write) == "complete"


def test_result_moves_gate_and_replaces_data() -> None:
    write = write_for_result("p", ITEM, Result(gate=5, data=b"new"), 2, POLICY)
    assert (write.status, write.gate, write.data) == ("available", 5, b"new")
    assert outcome_name(ITEM, write) == "advanced"


def test_result_loop_at_same_gate_is_progress() -> None:
    write = write_for_result("p", ITEM, Result(), 2, POLICY)
    assert (write.status, write.gate, write.attempts, write.last_error) == (
        "available", 2, 0, None)
    assert outcome_name(ITEM, write) == "looped"


def test_result_below_partition_gate_is_rejected_without_retry() -> None:
    write = write_for_result("p", ITEM, Result(gate=1), 2, POLICY)
    assert write.status == "failed"
    assert "gate 1" in write.last_error and "at gate 2" in write.last_error


@pytest.mark.parametrize(("attempts_before", "expected_status", "expected_delay"), [
    (0, "available", 1.0), (1, "available", 2.0), (2, "available", 4.0), (3, "failed", None),
])
def test_errors_back_off_then_fail(attempts_before, expected_status, expected_delay) -> None:
    item = ReadyItem("i", 1, 0, b"", attempts_before)
    write = write_for_error("p", item, RetryableError("boom"), POLICY)
    assert (write.status, write.retry_delay, write.attempts) == (
        expected_status, expected_delay, attempts_before + 1)
    assert write.last_error == "boom"


def test_non_retryable_error_fails_at_once() -> None:
    write = write_for_error("p", ITEM, NonRetryableError("bad input"), POLICY)
    assert (write.status, write.last_error) == ("failed", "bad input")


def test_retry_after_is_a_minimum_delay() -> None:
    write = write_for_error("p", ITEM, RetryableError("slow down", retry_after=30), POLICY)
    assert write.retry_delay == 30


def test_unknown_exceptions_are_retryable_and_described() -> None:
    write = write_for_error("p", ITEM, KeyError("x"), POLICY)
    assert write.status == "available" and write.last_error == "KeyError: 'x'"


def test_backoff_is_capped_and_jittered() -> None:
    policy = RetryPolicy(max_retries=50, backoff=1.0, backoff_max=10.0, jitter=0.5)
    delays = [policy.delay(n, random.Random(n)) for n in range(1, 30)]
    assert all(0 < d <= 10.0 for d in delays)
    assert len(set(delays)) > 1


def test_idempotency_step_survives_errors_but_not_progress() -> None:
    first = ReadyItem("i", version=3, gate=0, data=b"", attempts=0)
    after_error = ReadyItem("i", version=4, gate=0, data=b"", attempts=1)
    after_success = ReadyItem("i", version=5, gate=1, data=b"", attempts=0)
    assert idempotency_step(first) == idempotency_step(after_error)
    assert idempotency_step(after_success) != idempotency_step(first)


@pytest.mark.parametrize(("result", "problem"), [
    (Result(), None),
    ("nope", "returned str"),
    (Result(gate=True), "gate must be a whole number"),
    (Result(gate=-1), "gate must be a whole number"),
    (Result(gate=2**31 - 1), None),
    (Result(gate=2**31), "from 0 to 2147483647"),
    (Result(done="yes"), "done must be true or false"),  # type: ignore[arg-type]
    (Result(data="text"), "data must be bytes"),  # type: ignore[arg-type]
])
def test_result_problem(result, problem) -> None:
    found = result_problem(result)
    assert (found is None) if problem is None else (problem in found)


@pytest.mark.parametrize(("text", "stored"), [
    ("plain \u2603", "plain \u2603"),
    ("nul \x00 byte", "nul \\x00 byte"),
    ("lone \ud800 surrogate", "lone \\ud800 surrogate"),
])
def test_error_text_is_made_storable(text: str, stored: str) -> None:
    assert storable_text(text) == stored
    item = ReadyItem("i", version=1, gate=0, data=b"", attempts=0)
    write = write_for_error("p", item, RetryableError(text), RetryPolicy(max_retries=3))
    assert write.last_error == stored


def test_an_unstorable_write_becomes_a_failure_in_place() -> None:
    write = ItemWrite("p", "i", 7, "available", 2**40, attempts=0, data=b"x")
    failure = unstorable_write(write, OverflowError("value out of int32 range"))
    assert (failure.status, failure.gate, failure.data, failure.seen_version) == (
        "failed", None, None, 7)
    assert "could not be stored" in failure.last_error
    assert "int32" in failure.last_error and str(2**40) in failure.last_error


@pytest.mark.parametrize(("gates", "status", "reopen_at", "stopped_at", "expected"), [
    # A complete "continue" partition retried below its reduce gates: all of them again.
    ({1, 3}, "complete", 0, 3, [1, 3]),
    ({1, 3, 5}, "complete", 2, 3, [3]),  # gate 1 was before the failure; 5 never reached
    ({1}, "complete", 1, 1, [1]),  # failed at the reduce gate it completed: reduce again
    ({1}, "complete", 2, 2, []),  # the failure after the reduce: it stands
    ({0}, "failed", 0, 0, []),  # a failed reduce resumes from its stored page
    ({0}, "cancelled", 0, 0, []),
    ({0, 2}, "cancelled", 0, 2, [0, 2]),  # moved back: the one under way starts over
    (set(), "complete", 0, 4, []),
])
def test_which_reduces_a_retry_runs_again(gates: set[int], status: str, reopen_at: int,
                                          stopped_at: int, expected: list[int]) -> None:
    assert reduces_to_run_again(frozenset(gates), status, reopen_at=reopen_at,
                                stopped_at=stopped_at) == expected


def test_a_work_items_key_is_worked_out_when_read_and_stable_across_retries() -> None:
    """The engine leaves the key out; read, it is the hash of the step (the same
    format as before, so a retry across an upgrade keeps its key)."""
    first = WorkItem("part", "item", 0, 1, b"", 7)
    expected = hashlib.sha256(b"4:partitem:7").hexdigest()[:32]
    assert first.idempotency_key == expected == step_key("part", "item", 7)
    retry = WorkItem("part", "item", 0, 2, b"", 8)  # an error bumped version and attempt
    assert retry.idempotency_key == expected
    progressed = WorkItem("part", "item", 1, 1, b"", 8)
    assert progressed.idempotency_key != expected
    given = WorkItem("part", "item", 0, 1, b"", 7, "mine")
    assert given.idempotency_key == "mine"
    assert given == first, "the key is not compared: it follows from the rest"
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.data = b"changed"  # type: ignore[misc]
    assert "_key" not in repr(first)
    moved = dataclasses.replace(retry, gate=1, attempt=1)
    assert moved.idempotency_key == progressed.idempotency_key, "worked out afresh"


def _write_for(outcome: object) -> ItemWrite:
    return write_for_outcome("p", ITEM, outcome, 2, POLICY,  # type: ignore[arg-type]
                             max_data_bytes=8, max_snooze=60.0,
                             spawn_limits=SpawnLimits.of(WatcherConfig(owner_id="w")))


def test_write_for_outcome_takes_the_result_or_the_error_and_refuses_unusable_results(
        ) -> None:
    done = _write_for(Result(done=True))
    assert done.status == "complete" and done.last_error is None
    error = _write_for(RetryableError("flaky"))
    assert error.status == "available" and "flaky" in (error.last_error or "")
    assert error.attempts == ITEM.attempts + 1
    for unusable, words in [("not a result", "expected a Result"),
                            (Result(data=b"too many bytes"), "over the item size limit"),
                            (Result(snooze=5.0, done=True), "cannot come with")]:
        write = _write_for(unusable)
        assert write.status == "failed", unusable
        assert words in (write.last_error or ""), write.last_error


# -- a drained gate's close before its summary -------------------------------------------

def _write(status: str, gate: int | None = None, *, spawn: bool = False) -> ItemWrite:
    return ItemWrite("p", "i", 1, status, gate, 1,
                     spawn=(NewItem("c", b""),) if spawn else ())


@pytest.mark.parametrize(("writes", "outcomes", "expected"), [
    ([_write("complete"), _write("complete", 3)], [True, True], True),
    ([_write("complete")], [False], False),  # fenced off: the item is still there
    ([_write("complete")], [RuntimeError("refused")], False),
    ([_write("complete", 4)], [True], False),  # completed at another gate
    ([_write("available", 4)], [True], False),  # moved on
    ([_write("available")], [True], False),  # a retry
    ([_write("failed")], [True], False),
    ([_write("complete", spawn=True)], [True], False),  # its children wait
    ([], [], True),
])
def test_a_batch_completed_in_place_only_when_every_write_completed_its_item_there(
        writes: list[ItemWrite], outcomes: list[bool | BaseException], expected: bool) -> None:
    assert completed_in_place(writes, outcomes, 3) is expected
