"""The quorum's pure decisions: when a gate passes on the first k of its items, what the
gate's usual decision then reads, and which writes count towards it."""

from __future__ import annotations

import pytest

from processor.cli.data import items_cell
from processor.client.checks import ITEM_STATUSES, check_quorum
from watcher.errors import InvalidInputError
from watcher.records import GateSummary, ItemWrite, PartitionSettings
from watcher.rules.completions import (
    QuorumMove,
    decide_quorum,
    quorum_keep,
    quorum_look_due,
    settles_at,
    summary_under_quorum,
)
from watcher.rules.decisions import GateMove, decide_gate


def summary(pending: int = 0, failed: int = 0, waiting: int = 0,
            next_gate: int | None = None) -> GateSummary:
    return GateSummary(pending=pending, failed=failed, next_gate=next_gate, waiting=waiting,
                       seconds_to_deadline=60.0 if waiting else None)


@pytest.mark.parametrize(("gate", "k", "complete", "move"), [
    (summary(pending=2), 1, 1, QuorumMove.SKIP),  # first answer in, two in flight
    (summary(waiting=1), 2, 2, QuorumMove.SKIP),  # two of three reviewers
    (summary(failed=1), 2, 2, QuorumMove.PASS),  # met; a failure does not matter
    (summary(), 3, 3, QuorumMove.PASS),  # all of them
    (summary(pending=1, waiting=1), 2, 1, QuorumMove.AS_USUAL),  # still reachable
    (summary(failed=2, waiting=1), 2, 0, QuorumMove.UNREACHABLE),  # two rejected of three
    (summary(failed=1), 1, 0, QuorumMove.UNREACHABLE),
    (summary(failed=1, waiting=1), 1, 0, QuorumMove.AS_USUAL),  # the waiting one may do
])
def test_the_quorum_decides_before_the_gate(gate, k, complete, move) -> None:
    assert decide_quorum(gate, k, complete) is move


def test_what_the_gate_decides_under_each_move() -> None:
    def gate_move(state: GateSummary, move: QuorumMove, *, continue_on_failure: bool = False
                  ) -> GateMove:
        return decide_gate(summary_under_quorum(state, move), auto_close=True,
                           manual_checkpoint=False,
                           continue_on_failure=continue_on_failure).move

    met = summary(pending=2, failed=1, next_gate=1)
    assert gate_move(met, QuorumMove.SKIP) is GateMove.ADVANCE
    assert gate_move(summary(failed=1), QuorumMove.PASS) is GateMove.CLOSE
    # While reachable a failure waits for the others instead of failing the gate.
    assert gate_move(summary(failed=1, waiting=1), QuorumMove.AS_USUAL) is GateMove.WAIT
    unreachable = summary(failed=2, waiting=1)
    assert gate_move(unreachable, QuorumMove.UNREACHABLE) is GateMove.FAIL
    assert gate_move(unreachable, QuorumMove.UNREACHABLE,
                     continue_on_failure=True) is GateMove.WAIT


@pytest.mark.parametrize(("status", "gate", "counts"), [
    ("complete", None, True), ("available", 2, True), ("available", 1, False),
    ("available", None, False), ("waiting", None, False), ("failed", None, False)])
def test_which_writes_count_towards_the_quorum_of_gate_one(status, gate, counts) -> None:
    write = ItemWrite("p", "a", 1, status, gate, 1)
    assert settles_at(write, 1) is counts


def test_the_settings_name_k_per_gate() -> None:
    settings = PartitionSettings(quorum=((0, 1), (2, 3)))
    assert [settings.quorum_at(gate) for gate in range(4)] == [1, 0, 3, 0]
    assert check_quorum("p", {"2": 3, 0: 1}) == ((0, 1), (2, 3))
    assert check_quorum("p", None) == () and check_quorum("p", {}) == ()
    with pytest.raises(InvalidInputError, match="at least 1"):
        check_quorum("p", {1: 0})


def test_skipped_is_an_item_status_everywhere_one_is_shown_or_filtered() -> None:
    assert "skipped" in ITEM_STATUSES and "waiting" in ITEM_STATUSES
    assert items_cell({"complete": 1, "skipped": 2, "waiting": 1, "failed": 0}) == (
        "1 waiting, 1 complete, 2 skipped")
    assert items_cell({}) == "none"


@pytest.mark.parametrize(("written", "in_flight", "since", "due"), [
    (True, False, 0.0, True),  # an answer that may have met it was written
    (False, True, 1.0, True),  # calls in flight: a completion by token may have met it
    (False, True, 0.5, False),  # looked less than a poll interval ago
    (False, False, 9.0, False),  # nothing in flight: the gate's move counts it
])
def test_when_a_processor_counts_its_gates_quorum(written, in_flight, since, due) -> None:
    assert quorum_look_due(written, in_flight=in_flight, since_last_look=since,
                           poll_interval=1.0) is due


def _answer(item: str, status: str = "complete", gate: int | None = None,
            partition: str = "p", quorum: tuple[int, int] | None = (0, 1)) -> ItemWrite:
    return ItemWrite(partition, item, 1, status, gate, 1, quorum=quorum)


@pytest.mark.parametrize(("writes", "room", "keep"), [
    # Eight answers in one batch, a quorum of one: the first only.
    ([_answer(f"i{n}", "available", 1) for n in range(8)], {("p", 0): 1},
     [True] + [False] * 7),
    # Room for two, three answers: the first two in the batch's order.
    ([_answer("a"), _answer("b"), _answer("c")], {("p", 0): 2}, [True, True, False]),
    # The quorum met already (a racing completion): none passes.
    ([_answer("a"), _answer("b")], {("p", 0): 0}, [False, False]),
    # A failure, a retry and a park do not settle their items: always written.
    ([_answer("a", "failed"), _answer("b", "available", None),
      _answer("c", "waiting"), _answer("d")], {("p", 0): 0}, [True, True, True, False]),
    # Writes without a quorum are always written; each partition has its own room.
    ([_answer("a", quorum=None), _answer("b"), _answer("c", partition="q"),
      _answer("d", partition="q")], {("p", 0): 1, ("q", 0): 1}, [True, True, True, False]),
])
def test_a_batch_passes_only_as_many_items_as_the_quorum_has_room_for(
        writes, room, keep) -> None:
    assert quorum_keep(writes, room) == keep
