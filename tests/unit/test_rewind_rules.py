"""The pure decisions of a rewind (watcher.rules.operator.rewind) and its timeline record."""

from __future__ import annotations

from datetime import datetime, timedelta

from watcher.rules.operator.rewind import (
    ItemPlace,
    RewindChoice,
    chosen_removed,
    named_problem,
    nothing_problem,
    partition_problem,
    rearmed_gates,
    reduces_again,
    removed_items,
)
from watcher.rules.timeline import (
    MAX_REWINDS,
    GateSpan,
    Progress,
    RewindMark,
    Timeline,
    decode_timeline,
    encode_timeline,
    record_move,
    record_rewind,
)

TREE = [
    ItemPlace("root", 3, "complete"),            # a client's item
    ItemPlace("kid", 2, "complete", "root"),     # spawned at gate 2 or later: removed
    ItemPlace("grandkid", 0, "complete", "kid"),  # below a removed item: removed, any gate
    ItemPlace("early", 0, "complete", "root"),   # spawned before gate 1: kept
    ItemPlace("other", 0, "complete"),
    ItemPlace("its", 4, "complete", "other"),    # parent before the gate is not chosen
]


def test_children_of_chosen_items_at_the_gate_or_later_go_with_their_descendants() -> None:
    assert removed_items(TREE, RewindChoice(1)) == {"kid", "grandkid"}
    # Only failed items chosen: root is complete, so nothing it spawned goes.
    assert removed_items(TREE, RewindChoice(1, failed_only=True)) == set()
    assert removed_items(TREE, RewindChoice(1, named=frozenset({"kid"}))) == set()
    assert removed_items(TREE, RewindChoice(3, named=frozenset({"root"}))) == set()
    assert removed_items(TREE, RewindChoice(2, named=frozenset({"root"}))) == {
        "kid", "grandkid"}


def test_a_spawn_cycle_ends() -> None:
    loop = [ItemPlace("a", 1, "failed", "b"), ItemPlace("b", 1, "failed", "a")]
    assert removed_items(loop, RewindChoice(0)) == {"a", "b"}


# Reduces at gates 1 and 3: the one at 1 spawned s and t, s spawned s.k, the one at 3
# spawned z; "old" is one a reduce spawned before the reduce was recorded.
REDUCED = [
    ItemPlace("a", 1, "complete"),
    ItemPlace("s", 3, "complete", spawned_by_reduce=1),
    ItemPlace("t", 3, "complete", spawned_by_reduce=1),
    ItemPlace("s.k", 3, "complete", "s"),
    ItemPlace("z", 4, "failed", spawned_by_reduce=3),
    ItemPlace("old", 4, "complete"),
]


def test_what_a_reduce_that_runs_again_spawned_goes_with_its_descendants() -> None:
    assert removed_items(REDUCED, RewindChoice(1), [1, 3]) == {"s", "t", "s.k", "z"}
    assert removed_items(REDUCED, RewindChoice(2), [3]) == {"z", "s.k"}
    assert removed_items(REDUCED, RewindChoice(4), []) == set()
    # Whatever the choice: the reduce runs again all the same.
    assert removed_items(REDUCED, RewindChoice(1, failed_only=True), [1, 3]) == {
        "s", "t", "s.k", "z"}
    assert removed_items(REDUCED, RewindChoice(3, named=frozenset({"a"})), [3]) == {"z"}
    # Without the reduces that run again, only what chosen items spawned.
    assert removed_items(REDUCED, RewindChoice(1)) == {"s.k"}


def test_chosen_items_that_are_removed_are_told_apart() -> None:
    removed = removed_items(REDUCED, RewindChoice(3, failed_only=True), [3])
    assert chosen_removed(REDUCED, removed, RewindChoice(3, failed_only=True)) == ["z"]
    named = RewindChoice(1, named=frozenset({"s", "a"}))
    assert chosen_removed(REDUCED, removed_items(REDUCED, named, [1, 3]), named) == ["s"]
    assert chosen_removed(REDUCED, removed_items(REDUCED, RewindChoice(4), []),
                          RewindChoice(4)) == []
    assert chosen_removed(TREE, removed_items(TREE, RewindChoice(1)), RewindChoice(1)) == [
        "kid"]


def test_refusals_say_what_is_wrong() -> None:
    assert partition_problem("p", 1, current_gate=1) is None
    assert "only goes back (to gate 1 or below)" in (partition_problem("p", 2, current_gate=1)
                                                      or "")
    assert "a gate is 0 or more" in (partition_problem("p", -1, current_gate=1) or "")
    found = {place.id: place for place in TREE}
    assert named_problem("p", RewindChoice(1, named=frozenset({"root"})), found) is None
    assert "no items 'x', 'y'" in (named_problem(
        "p", RewindChoice(1, named=frozenset({"x", "y", "root"})), found) or "")
    assert "at gate 0, before it" in (named_problem(
        "p", RewindChoice(1, named=frozenset({"early"})), found) or "")
    assert "complete, not failed" in (named_problem(
        "p", RewindChoice(1, failed_only=True, named=frozenset({"root"})), found) or "")
    assert "no failed item at gate 2" in nothing_problem("p", RewindChoice(2, True))


def test_reduces_after_the_gate_run_again_and_narrowed_rewinds_rearm_them() -> None:
    assert reduces_again({1, 3, 5}, 3) == [3, 5]
    assert rearmed_gates({1, 3, 5}, RewindChoice(2), current_gate=5) == []
    assert rearmed_gates({1, 3, 5}, RewindChoice(2, True), current_gate=4) == [3]


def test_the_timeline_records_rewinds_and_keeps_them_through_moves() -> None:
    now = datetime(2026, 11, 28, 10, 0, 0)
    timeline = Timeline((GateSpan(0, now - timedelta(minutes=5), now - timedelta(minutes=2),
                                  4), GateSpan(2, now - timedelta(minutes=2), None, 3)))
    rewound = record_rewind(timeline, now, RewindMark(now, 2, 1, 7, 2))
    assert rewound.gates[-2].ended == now and rewound.gates[-1] == GateSpan(1, now, None, 0)
    assert rewound.rewinds == (RewindMark(now, 2, 1, 7, 2),)
    assert decode_timeline(encode_timeline(rewound)) == rewound
    moved = record_move(rewound, now + timedelta(seconds=30), Progress(1, 7), 2)
    assert moved.rewinds == rewound.rewinds
    # An old record without rewinds reads as none; the list keeps the latest ones.
    assert decode_timeline(encode_timeline(timeline)).rewinds == ()
    many = rewound
    for n in range(MAX_REWINDS + 3):
        many = record_rewind(many, now, RewindMark(now, 1, 0, n, 0))
    assert len(many.rewinds) == MAX_REWINDS and many.rewinds[-1].items == MAX_REWINDS + 2
