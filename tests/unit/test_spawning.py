"""The pure checks on what an answer spawns, and how a result with a spawn becomes a write."""

from __future__ import annotations

import pytest

from watcher.models import MAX_GATE
from watcher.protocol import ReduceResult, Result
from watcher.records import ItemWrite, NewItem, ReadyItem, ReduceEntry, ReduceState
from watcher.rules.decisions import RetryPolicy, unstorable_write, write_for_result
from watcher.rules.reduce import PageLimits, ReduceAnswerError, ReducePlan, plan_reduce, reduce_step
from watcher.rules.spawn import SpawnConflictError, SpawnLimits, resolve_spawn, spawn_problem

LIMITS = SpawnLimits(max_spawn=3, max_item_bytes=10)


def problem(spawn: object, floor: int = 2) -> str | None:
    return spawn_problem(spawn, floor=floor, limits=LIMITS)


def test_a_good_spawn_has_no_problem_and_resolves_its_gates() -> None:
    spawn = [NewItem("a", b"1"), NewItem("b", bytearray(b"2"), gate=5)]  # type: ignore[arg-type]
    assert problem(spawn) is None
    assert resolve_spawn(spawn, 2) == (NewItem("a", b"1", 2), NewItem("b", b"2", 5))
    assert problem([]) is None and problem(()) is None


@pytest.mark.parametrize(("spawn", "expected"), [
    (NewItem("a", b""), "must be a list of NewItem"),
    ("abc", "must be a list of NewItem"),
    ({"a": 1}, "must be a list of NewItem"),
    ([{"id": "a"}], "spawn[0] is a dict"),
    ([NewItem("", b"")], "spawn[0]: item id must be a non-empty string"),
    ([NewItem("x" * 300, b"")], "the limit is 255"),
    ([NewItem("a\x00b", b"")], "NUL"),
    ([NewItem("\ud800", b"")], "unpaired surrogate"),
    ([NewItem(7, b"")], "non-empty string"),
    ([NewItem("a", "text")], "data must be bytes, got str (encode text first"),
    ([NewItem("a", None)], "data must be bytes, got NoneType"),
    ([NewItem("a", b"x" * 11)], "11 bytes, over the item size limit of 10"),
    ([NewItem("a", b"", gate=1)], "has gate 1, below gate 2"),
    ([NewItem("a", b"", gate=-1)], "gate must be a whole number"),
    ([NewItem("a", b"", gate=True)], "gate must be a whole number"),
    ([NewItem("a", b"", gate=MAX_GATE + 1)], "gate must be a whole number"),
    ([NewItem("a", b"", gate="3")], "gate must be a whole number"),
    ([NewItem("a", b""), NewItem("b", b""), NewItem("a", b"")], "'a' more than once"),
    ([NewItem(f"i{n}", b"") for n in range(4)], "spawns 4 items, over the limit of 3"),
])
def test_every_malformed_spawn_says_what_is_wrong(spawn: object, expected: str) -> None:
    found = problem(spawn)
    assert found is not None and expected in found, found


def test_the_limit_message_says_how_to_page() -> None:
    found = problem([NewItem(f"i{n}", b"") for n in range(4)]) or ""
    assert "--max-spawn" in found and "cursor" in found and "same gate" in found


def test_a_spawn_at_the_floor_is_allowed_and_one_below_is_not() -> None:
    assert problem([NewItem("a", b"", gate=2)]) is None
    assert problem([NewItem("a", b"", gate=2)], floor=3) is not None


ITEM = ReadyItem("parent", version=4, gate=2, data=b"", attempts=0)


def test_a_result_with_a_spawn_carries_its_children_with_gates_resolved() -> None:
    write = write_for_result("p", ITEM, Result(gate=3, spawn=[NewItem("c", b"x")]), 2,
                             RetryPolicy(), spawn_limits=LIMITS)
    assert write.status == "available" and write.gate == 3
    assert write.spawn == (NewItem("c", b"x", 2),), "a child's gate defaults to the parent's"


def test_a_bad_spawn_fails_the_item_at_once_and_carries_nothing() -> None:
    write = write_for_result("p", ITEM, Result(done=True, spawn=[NewItem("c", b"x" * 99)]), 2,
                             RetryPolicy(max_retries=5), spawn_limits=LIMITS)
    assert write.status == "failed" and write.spawn == ()
    assert write.last_error is not None and "'c'" in write.last_error
    assert "'parent'" not in write.last_error and "'p'" not in write.last_error


def test_a_conflict_fails_the_item_with_the_ids_and_what_to_do() -> None:
    error = SpawnConflictError("p", "parent", [f"c{n}" for n in range(7)])
    assert "'c0', 'c1', 'c2', 'c3', 'c4' and 2 more" in str(error)
    assert "not retried" in str(error) and "id of its own" in str(error)
    original = ItemWrite("p", "parent", 4, "complete", None, 0,
                         spawn=(NewItem("c0", b"", 2),))
    failed = unstorable_write(original, error)
    assert failed.status == "failed" and failed.spawn == ()
    assert failed.seen_version == 4, "the failure is written against the version read"
    assert failed.last_error == str(error)
    reduce_error = SpawnConflictError("p", None, ["x"])
    assert str(reduce_error).startswith("the reduce of partition 'p' spawned id 'x'")


# -- a reduce's spawn ------------------------------------------------------------


def _reduce_plan(pass_: str | None) -> ReducePlan:
    entries = [ReduceEntry("a", 3, 1, "available", b"", None)]
    return plan_reduce(ReduceState(7, 1, pass_, 0, None, None, 0), entries,
                       PageLimits(10, 10**6))


def test_a_reduce_spawns_at_the_next_gate_by_default() -> None:
    step = reduce_step("p", 1, _reduce_plan(None), ReduceResult(
        spawn=[NewItem("n1", b""), NewItem("n2", b"", gate=4)]), spawn_limits=LIMITS)
    assert step.spawn == (NewItem("n1", b"", 2), NewItem("n2", b"", 4))
    assert step.gate == 1, "what a reduce spawns is recorded as the reduce's at its gate"


@pytest.mark.parametrize(("pass_", "answer", "expected"), [
    ("fold", {"spawn": [NewItem("n", b"")], "accumulator": b"1"}, "a fold page may not spawn"),
    (None, {"spawn": [NewItem("n", b"", gate=1)]}, "below gate 2"),
    (None, {"spawn": [NewItem("n", b""), NewItem("n", b"")]}, "more than once"),
    (None, {"items": {"a": Result(done=True, spawn=[NewItem("n", b"")])}},
     "spawn from the reduce answer itself"),
    (None, {"default": Result(done=True, spawn=[NewItem("n", b"")])},
     "spawn from the reduce answer itself"),
])
def test_a_reduce_spawn_that_cannot_be_written_is_a_malformed_answer(
        pass_: str | None, answer: dict, expected: str) -> None:
    with pytest.raises(ReduceAnswerError, match=expected):
        reduce_step("p", 1, _reduce_plan(pass_), ReduceResult(**answer), spawn_limits=LIMITS)
