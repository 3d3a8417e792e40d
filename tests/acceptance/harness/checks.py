"""Pure checks over a recording handler's call log and the items a run left behind.

Each returns a list of problems (empty when the guarantee held), so a test can
print every violation at once.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence

from processor import ItemInfo
from tests.acceptance.harness.handler import Call, expected_trail


def trail_of(item: ItemInfo) -> list[tuple[str, int]]:
    """The persisted trail of a pass-counter item: (step, call that produced it)."""
    entries = json.loads(item.data)["trail"]
    return [(entry.split("@")[0], int(entry.split("@")[1])) for entry in entries]


def item_problems(items: Sequence[ItemInfo], calls: Sequence[Call], *, gates: int,
                  passes: int) -> list[str]:
    """Why the final items are not exactly what the pass counter must produce.

    Every item must be complete at the last gate with exactly the expected steps in
    its trail (a lost update skips a step, a double-applied or stale result
    repeats one), and every step must have been written from a successful call
    made for that very step.
    """
    want = expected_trail(gates, passes)
    problems: list[str] = []
    for item in items:
        name = f"{item.partition_id}/{item.id}"
        if item.status != "complete" or item.gate != gates - 1:
            problems.append(f"{name}: {item.status} at gate {item.gate}, "
                            f"last_error={item.last_error!r}")
            continue
        trail = trail_of(item)
        steps = [step for step, _ in trail]
        if steps != want:
            problems.append(f"{name}: trail {steps} != {want}")
            continue
        for step, seq in trail:
            gate, made = (int(part) for part in step.split(":"))
            call = calls[seq] if seq < len(calls) else None
            if (call is None or not call.ok or call.partition_id != item.partition_id
                    or call.item_id != item.id or call.step != (gate, made - 1)):
                problems.append(f"{name}: step {step} was written from call {seq} "
                                f"({call!r:.200}), which was not a successful call for it")
    return problems


def key_problems(calls: Sequence[Call]) -> list[str]:
    """Repeated calls for one step must carry one Idempotency-Key; other steps, other keys."""
    keys_of_step: dict[tuple[str, str, tuple[int, int]], set[str]] = defaultdict(set)
    step_of_key: dict[str, set[tuple[str, str, tuple[int, int]]]] = defaultdict(set)
    for call in calls:
        if call.step is None:
            continue
        step = (call.partition_id, call.item_id, call.step)
        keys_of_step[step].add(call.key)
        step_of_key[call.key].add(step)
    problems = [f"step {step} was sent with {len(keys)} keys: {sorted(keys)}"
                for step, keys in keys_of_step.items() if len(keys) != 1]
    problems += [f"key {key} was sent for {len(steps)} steps: {sorted(steps)}"
                 for key, steps in step_of_key.items() if len(steps) != 1]
    return problems


def gate_order_problems(calls: Sequence[Call], item_ids: dict[str, list[str]], *,
                        passes: int) -> list[str]:
    """Calls at gate g+1 that started before every item's gate g had been settled.

    The guarantee is about *dispatch*: a partition dispatches gate g+1 only after
    every item at gate g is settled in the database. An item's gate g settles
    through the call for its last pass there, so for every call at gate g+1 each
    item of the partition must already have had such a call answered with
    success (its ``finished`` before the gate-g+1 call's ``started``). A late
    duplicate at gate g from a processor that lost its lease is allowed.
    """
    settled_at: dict[tuple[str, str, int], float] = {}
    for call in calls:
        if call.ok and call.step is not None and call.step[1] == passes - 1:
            key = (call.partition_id, call.item_id, call.gate)
            assert call.finished is not None
            settled_at[key] = min(settled_at.get(key, call.finished), call.finished)
    problems: list[str] = []
    for call in calls:
        if call.gate <= 0 or call.partition_id not in item_ids:
            continue
        for item_id in item_ids[call.partition_id]:
            done = settled_at.get((call.partition_id, item_id, call.gate - 1))
            if done is None or done >= call.started:
                problems.append(
                    f"call {call.seq} ({call.partition_id}/{call.item_id} gate {call.gate} by "
                    f"{call.caller}) started at {call.started:.3f} but item {item_id} settled "
                    f"gate {call.gate - 1} at {done if done is None else round(done, 3)}")
    return problems


def causality_problems(calls: Sequence[Call]) -> list[str]:
    """Every call's input must come from a result the handler had already answered."""
    problems: list[str] = []
    for call in calls:
        state = call.state()
        if not state or not state["trail"]:
            continue
        source = int(state["trail"][-1].split("@")[1])
        earlier = calls[source] if source < call.seq else None
        if earlier is None or earlier.finished is None or earlier.finished >= call.started:
            problems.append(f"call {call.seq} got data written from call {source}, which had "
                            "not been answered when it started")
    return problems


def duplicate_calls(calls: Sequence[Call]) -> int:
    """Successful calls beyond one per step: the cost of at-least-once delivery."""
    ok = [call for call in calls if call.ok and call.step is not None]
    return len(ok) - len({(c.partition_id, c.item_id, c.step) for c in ok})
