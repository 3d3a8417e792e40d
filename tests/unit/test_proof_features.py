"""The proof checker's guarantees of reduce gates, notifications, schedules, outages,
routes reloads, hand-overs and rewinds (tests/proof/features.py and the epoch rule of
tests/proof/checker.py) on hand-made histories: one that keeps each, one that breaks it."""

from __future__ import annotations

from typing import Any

from tests.proof.checker import GRACE, check
from tests.proof.history import Event
from tests.unit.test_proof_checker import call, create, history, item, names


def reduce(seq: int, items: list[str], *, gate: int = 1, key: str = "rk", started: float = 1.0,
           outcome: str = "ok") -> Event:
    return {"kind": "reduce", "seq": seq, "service": "alpha", "caller": "p0g1",
            "partition": "p", "gate": gate, "attempt": 1, "key": key, "pass_": "all",
            "page": 0, "last": True, "items": items, "started": started,
            "finished": started + 0.1, "status": 200, "outcome": outcome}


def reduced_history(reducer: int, named: list[str], *, result: Any = None,
                    extra: tuple[Event, ...] = ()) -> Any:
    events = [create(reduce_gates=[1]), call(0, answer={"gate": 1}),
              call(1, item="i1", answer={"gate": 1}), reduce(0, ["i0", "i1"]),
              reduce(1, named, started=1.5), *extra]
    items = {"p": [item("i0", ["0:n@0", f"1:r@{reducer}"], gate=1, last=1),
                   item("i1", ["0:n@1", f"1:r@{reducer}"], gate=1, last=1)]}
    h = history(*events, items=items)
    h.of("final")[0]["partitions"]["p"]["result"] = result or {"reduce": 0,
                                                             "items": ["i0", "i1"]}
    return h


def test_one_reduce_over_exactly_the_gate_with_its_result_keeps_reduce_once() -> None:
    assert check(reduced_history(0, ["i0", "i1"]), only=["reduce-once", "exactly-once"]) == []


def test_a_reduce_over_other_items_or_another_result_breaks_reduce_once() -> None:
    short = reduced_history(1, ["i0"], result={"reduce": 1, "items": ["i0"]})
    assert "reduce-once" in names(check(short, only=["reduce-once"]))
    assert "exactly-once" in names(check(short, only=["exactly-once"]))  # i1 not named
    other = reduced_history(0, ["i0", "i1"], result={"reduce": 1, "items": ["i0", "i1"]})
    assert names(check(other, only=["reduce-once"])) == ["reduce-once"]
    keys = reduced_history(0, ["i0", "i1"], extra=(reduce(2, ["i0", "i1"], key="other"),))
    assert names(check(keys, only=["reduce-once"])) == ["reduce-once"]


def test_two_reduces_writing_one_gate_break_reduce_once() -> None:
    h = reduced_history(0, ["i0", "i1"])
    h.of("final")[0]["items"]["p"][1]["data"]["t"][1] = "1:r@1"
    assert names(check(h, only=["reduce-once"])) == ["reduce-once"]


def notice(event_id: str, *, pid: str = "p", kind: str = "partition.complete",
           at: float = 5.0, status: int = 200, signed: bool = True,
           body_id: str | None = None) -> Event:
    return {"kind": "notice", "id": event_id, "body_id": body_id or event_id, "type": kind,
            "partition": pid, "at": at, "signed": signed, "status": status}


def _notified(*notices: Event, url: bool = True) -> Any:
    events = [create(notify=url), call(0), *notices]
    return history(*events, items={"p": [item("i0", ["0:n@0"])]})


def test_one_event_delivered_again_under_its_id_keeps_notify() -> None:
    kept = _notified(notice("e1", status=500), notice("e1", at=6.0))
    assert check(kept, only=["notify"]) == []


def test_an_event_lost_doubled_changed_or_unasked_breaks_notify() -> None:
    assert names(check(_notified(), only=["notify"])) == ["notify"]  # none delivered
    assert names(check(_notified(notice("e1"), notice("e2")), only=["notify"])) == ["notify"]
    changed = _notified(notice("e1", status=500, kind="partition.failed"), notice("e1"))
    assert names(check(changed, only=["notify"])) == ["notify"]
    assert names(check(_notified(notice("e1", signed=False)), only=["notify"])) == ["notify"]
    assert names(check(_notified(notice("e1"), url=False), only=["notify"])) == ["notify"]


def _scheduled(*ticks: str, faults: tuple[Event, ...] = ()) -> Any:
    schedule = {"kind": "schedule", "name": "s", "every": 2, "started": 0.0,
                "finished": 0.1, "error": None, "db_added": "2026-01-01T00:00:00.500000",
                "first_tick": "2026-01-01T00:00:02", "db_deleted": "2026-01-01T00:00:12.2"}
    h = history(schedule, *faults)
    final = h.of("final")[0]
    for tick in ticks:
        final["partitions"][f"s/2026-01-01T00:00:{tick}Z"] = {"status": "complete",
                                                              "gate": 0, "counts": {}}
    return h


def test_one_partition_per_tick_keeps_the_schedule() -> None:
    assert check(_scheduled("02", "04", "06", "08", "10", "12"), only=["schedule"]) == []
    # a tick passed over for the next (skip), a ticker's second late
    assert check(_scheduled("02", "06", "08", "10"), only=["schedule"]) == []


def test_a_tick_off_its_grid_after_its_delete_or_lost_breaks_the_schedule() -> None:
    assert names(check(_scheduled("02", "03", "04"), only=["schedule"])) == ["schedule"]
    assert names(check(_scheduled("02", "04", "14"), only=["schedule"])) == ["schedule"]
    lost = _scheduled("02", "10", "12")
    assert names(check(lost, only=["schedule"])) == ["schedule"]
    kill = {"kind": "fault", "name": "kill", "args": {}, "target": "p0g1", "started": 3.0,
            "finished": 9.0}
    assert check(_scheduled("02", "10", "12", faults=(kill,)), only=["schedule"]) == []


def test_an_attempt_spent_with_no_call_breaks_outage_unpaid() -> None:
    first = call(0, status=500, outcome="fault", finished=0.1)
    second = {**call(1, started=3.0, finished=3.1), "attempt": 2}
    assert check(history(create(), first, second, items={"p": [item("i0", ["0:n@1"])]}),
                 only=["outage-unpaid"]) == []
    charged = {**second, "attempt": 3}
    found = check(history(create(), first, charged, items={"p": [item("i0", ["0:n@1"])]}),
                  only=["outage-unpaid"])
    assert names(found) == ["outage-unpaid"]
    kill = {"kind": "fault", "name": "kill", "args": {}, "target": "p0g2", "started": 1.0,
            "finished": 1.5}
    assert check(history(create(), kill, first, charged, items={"p": [item("i0", ["0:n@1"])]}),
                 only=["outage-unpaid"]) == []


def test_a_call_with_the_old_routes_after_a_sighup_breaks_routes_reload() -> None:
    hup = {"kind": "fault", "name": "sighup", "args": {}, "target": "", "started": 1.0,
           "finished": 1.0, "generation": 1, "owners": ["p0g1"]}
    old = {**call(0, started=1.5 + GRACE, finished=1.6 + GRACE), "routes": "0"}
    items = {"p": [item("i0", ["0:n@0"])]}
    assert names(check(history(create(), hup, old, items=items),
                       only=["routes-reload"])) == ["routes-reload"]
    new = {**old, "routes": "1"}
    assert check(history(create(), hup, new, items=items), only=["routes-reload"]) == []


def test_a_sigterm_that_cuts_calls_or_exits_non_zero_breaks_the_handover() -> None:
    term = {"kind": "fault", "name": "sigterm", "args": {}, "target": "p0g1", "started": 1.0,
            "finished": 2.0, "exit": 0, "ready": True}
    answered = call(0, started=0.5, finished=1.2)
    items = {"p": [item("i0", ["0:n@0"])]}
    assert check(history(create(), term, answered, items=items), only=["handover"]) == []
    cut = call(0, started=0.5, finished=1.2, outcome="abandoned", status=None)
    assert names(check(history(create(), term, cut, items=items),
                       only=["handover"])) == ["handover"]
    failed = {**term, "exit": -15}
    assert names(check(history(create(), failed, answered, items=items),
                       only=["handover"])) == ["handover"]
    assert check(history(create(), {**failed, "ready": False}, answered, items=items),
                 only=["handover"]) == []
    # An exit status asyncio lost (255) counts as the processor's log tells: a clean
    # stop is a hand-over, anything else is not.
    lost = {**term, "exit": 255, "stopped_cleanly": True}
    assert check(history(create(), lost, answered, items=items), only=["handover"]) == []
    assert names(check(history(create(), {**lost, "stopped_cleanly": False}, answered,
                               items=items), only=["handover"])) == ["handover"]


def test_a_gate_left_again_after_a_rewind_keeps_exactly_once() -> None:
    events = [create(), call(0, finished=0.1),
              {"kind": "verb", "name": "rewind", "args": {"partition": "p", "gate": 0},
               "started": 1.0, "finished": 1.1, "answer": "RewindReport()"},
              call(1, started=2.0, finished=2.1, trail=1)]
    again = history(*events, items={"p": [item("i0", ["0:n@0", "0:n@1"])]})
    assert check(again, only=["exactly-once", "nothing-lost", "gate-order"]) == []
    events[2] = {**events[2], "error": "GateError: ..."}
    refused = history(*events, items={"p": [item("i0", ["0:n@0", "0:n@1"])]})
    assert "exactly-once" in names(check(refused, only=["exactly-once"]))


def test_a_step_sent_with_a_new_key_after_a_rewind_keeps_exactly_once() -> None:
    # Seed 977760328 (PostgreSQL): p00/i1's call at gate 0 met a 429, the partition was
    # rewound to gate 0, and the step's next call carried the new epoch's key.
    rewind = {"kind": "verb", "name": "rewind", "args": {"partition": "p", "gate": 0},
              "started": 0.5, "finished": 0.6, "answer": "RewindReport(items_reset=1)"}
    held = call(0, key="old", status=429, retry_after="4", outcome="fault",
                answer={"error": "slow down"})
    events = [create(), held, rewind, call(1, key="new", started=2.0, finished=2.1)]
    items = {"p": [item("i0", ["0:n@1"])]}
    assert check(history(*events, items=items), only=["exactly-once"]) == []
    for broken in ({**rewind, "error": "PartitionNotFoundError: ..."},  # it did nothing
                   {**rewind, "args": {"partition": "p", "gate": 1}},   # above the step
                   {**rewind, "args": {"partition": "q", "gate": 0}},   # another partition
                   {**rewind, "started": 2.5, "finished": 2.6}):        # after both calls
        (violation,) = check(history(*events[:2], broken, *events[3:], items=items),
                             only=["exactly-once"])
        assert "2 Idempotency-Keys" in violation.message
    third = call(2, key="newer", started=3.0, finished=3.1)  # a second key in one epoch
    (violation,) = check(history(*events, third, items=items), only=["exactly-once"])
    assert "3 Idempotency-Keys" in violation.message


def test_a_step_sent_with_a_new_key_after_a_retry_of_its_failed_item_keeps_exactly_once(
        ) -> None:
    # Seed 1610764530 (SQLite): p03/i2 failed at gate 1, a retry reset it, and its call
    # there carried a new key (the handler's stored failure is not answered again).
    retry = {"kind": "verb", "name": "retry", "args": {"partition": "p"}, "started": 0.5,
             "finished": 0.6, "answer": "RetryReport(partition_id='p', items_reset=1, "
                                       "items_rerun=0)"}
    failed = call(0, key="old", answer={"error": {"message": "no", "no_retry": True}})
    events = [create(), failed, retry, call(1, key="new", started=2.0, finished=2.1)]
    items = {"p": [item("i0", ["0:n@1"])]}
    assert check(history(*events, items=items), only=["exactly-once"]) == []
    nothing = {**retry, "answer": "RetryReport(partition_id='p', items_reset=0, "
                                  "items_rerun=0)"}
    (violation,) = check(history(*events[:2], nothing, *events[3:], items=items),
                         only=["exactly-once"])
    assert "2 Idempotency-Keys" in violation.message


def test_a_call_before_not_before_after_a_rewind_keeps_not_before() -> None:
    # Seed 133664399 (SQLite): p01 was rewound to gate 0 before i2's not_before, which
    # sends its items back ready at once.
    rewind = {"kind": "verb", "name": "rewind", "args": {"partition": "p", "gate": 0},
              "started": 0.5, "finished": 0.6, "answer": "RewindReport(items_reset=1)"}
    events = [create(not_before={"i0": 2.0}), rewind, call(0, started=1.0, finished=1.1)]
    items = {"p": [item("i0", ["0:n@0"])]}
    assert check(history(*events, items=items), only=["not-before"]) == []
    for broken in ({**rewind, "error": "PartitionChangedError: ..."},
                   {**rewind, "started": 1.5, "finished": 1.6},      # after the call
                   {**rewind, "args": {"partition": "p", "gate": 1}}):  # above its gate
        assert names(check(history(events[0], broken, events[2], items=items),
                           only=["not-before"])) == ["not-before"]
