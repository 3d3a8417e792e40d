"""Pure checks over a recording handler's call log and the items a run left behind.

Each returns a list of problems (empty when the guarantee held), so a test can
print every violation at once.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from processor import ItemInfo
from tests.acceptance.harness.handler import Call, ReduceRequest, expected_trail, item_number


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


# --------------------------------------------------------------------------- reduce gates


def expected_reduce_trail(gates: int, passes: int, reduce_gate: int) -> list[str]:
    """The steps of a pass-counter item whose partition reduces ``reduce_gate``: the
    per-item passes of every other gate, and one ``"<gate>:R"`` (the reduce's answer)."""
    return [step for gate in range(gates)
            for step in ([f"{gate}:R"] if gate == reduce_gate
                         else [f"{gate}:{made}" for made in range(1, passes + 1)])]


def _source(entry: str, calls: Sequence[Call], reduces: Sequence[ReduceRequest]
            ) -> Call | ReduceRequest | None:
    """The call or reduce request a trail entry names (``None``: no such one)."""
    step, seq = entry.split("@")
    found: Sequence[Call | ReduceRequest] = reduces if step.endswith(":R") else calls
    index = int(seq)
    return found[index] if 0 <= index < len(found) else None


def reduce_item_problems(items: Sequence[ItemInfo], calls: Sequence[Call],
                         reduces: Sequence[ReduceRequest], *, gates: int, passes: int,
                         reduce_gate: int) -> list[str]:
    """Why the final items are not exactly what pass counter and reduce counter produce.

    Every item must be complete at the last gate with exactly the expected steps
    (one reduce answer, counted once in ``reduced``); each per-item step written
    from a successful call for it, and the reduce step from a successful
    ``all`` or ``apply`` request of its partition's reduce gate that held the
    item. When the reduce is the last step, the item holds exactly the data that
    request answered for it.
    """
    want = expected_reduce_trail(gates, passes, reduce_gate)
    problems: list[str] = []
    for item in items:
        name = f"{item.partition_id}/{item.id}"
        if item.status != "complete" or item.gate != gates - 1:
            problems.append(f"{name}: {item.status} at gate {item.gate}, "
                            f"last_error={item.last_error!r}")
            continue
        data = json.loads(item.data)
        steps = [entry.split("@")[0] for entry in data["trail"]]
        if steps != want:
            problems.append(f"{name}: trail {steps} != {want}")
            continue
        if data.get("reduced") != 1:
            problems.append(f"{name}: reduced {data.get('reduced')!r} times, not once")
        for entry in data["trail"]:
            step = entry.split("@")[0]
            source = _source(entry, calls, reduces)
            if isinstance(source, ReduceRequest):
                if (not source.ok or source.partition_id != item.partition_id
                        or source.gate != reduce_gate or source.pass_ not in ("all", "apply")
                        or item.id not in source.item_ids):
                    problems.append(f"{name}: step {step} was written from reduce request "
                                    f"{entry} ({source!r:.200}), which was not a successful "
                                    "answer for it")
                elif entry == data["trail"][-1]:
                    answered = source.answer["items"][item.id]["data"]
                    if data != answered:
                        problems.append(f"{name}: holds {data}, not what its reduce answered: "
                                        f"{answered}")
                continue
            gate, made = (int(part) for part in step.split(":"))
            if (source is None or not source.ok or source.partition_id != item.partition_id
                    or source.item_id != item.id or source.step != (gate, made - 1)):
                problems.append(f"{name}: step {step} was written from call {entry} "
                                f"({source!r:.200}), which was not a successful call for it")
    return problems


def reduce_result_problems(results: dict[str, Any], item_ids: dict[str, list[str]],
                           items: Sequence[ItemInfo], reduces: Sequence[ReduceRequest], *,
                           reduce_gate: int) -> list[str]:
    """Why a partition's stored result is not the reduce counter over all its items,
    folded once each, in id order, by a chain of successful requests.

    ``results`` maps partition ids to their decoded results. A one-call reduce's
    result must come from the very request whose answers the items hold (one
    transaction); a paged reduce's from fold pages 0, 1, ... in turn, each sent
    the accumulator the page before answered, and the items' answers from apply
    requests that were sent the final accumulator.
    """
    problems: list[str] = []
    for partition_id, ids in item_ids.items():
        result = results.get(partition_id)
        expected = {"count": len(ids), "total": sum(item_number(i) for i in ids)}
        if not isinstance(result, dict) or {key: result.get(key) for key in expected} != expected:
            problems.append(f"{partition_id}: result {result!r:.200} != {expected} (+ chain)")
            continue
        chain = [reduces[seq] if 0 <= seq < len(reduces) else None for seq in result["chain"]]
        if not chain or any(request is None for request in chain):
            problems.append(f"{partition_id}: result chain {result['chain']} names unknown "
                            "requests")
            continue
        folded = [item_id for request in chain if request is not None
                  for item_id in request.item_ids]
        if folded != sorted(ids):
            problems.append(f"{partition_id}: the result folded {folded}, not each item once in "
                            "id order")
        one_call = len(chain) == 1 and chain[0] is not None and chain[0].pass_ == "all"
        for page, request in enumerate(chain):
            assert request is not None
            before = None if page == 0 else chain[page - 1]
            sent_before = None if before is None else before.answer["accumulator"]
            if (not request.ok or request.partition_id != partition_id
                    or request.gate != reduce_gate or request.page != page
                    or request.pass_ != ("all" if one_call else "fold")
                    or request.last != (page == len(chain) - 1)
                    or request.accumulator != sent_before):
                problems.append(f"{partition_id}: result chain link {page} is {request!r:.300}"
                                f", not a successful fold of page {page} sent "
                                f"{sent_before!r:.80}")
        for item in items:
            if item.partition_id != partition_id:
                continue
            entries = [entry for entry in json.loads(item.data)["trail"] if ":R@" in entry]
            for entry in entries:
                source = reduces[int(entry.split("@")[1])]
                if one_call and source is not chain[0]:
                    problems.append(f"{partition_id}/{item.id}: answered by reduce "
                                    f"{source.seq}, the result by reduce {chain[0].seq}")
                if not one_call and (source.pass_ != "apply" or source.accumulator != result):
                    problems.append(f"{partition_id}/{item.id}: answered by {source!r:.200}, "
                                    "which was not an apply sent the final accumulator")
    return problems


def reduce_key_problems(reduces: Sequence[ReduceRequest]) -> list[str]:
    """One Idempotency-Key per partition, gate, pass and page (header and body alike);
    other pages, other keys."""
    keys_of_page: dict[tuple[str, int, str, int], set[str]] = defaultdict(set)
    pages_of_key: dict[str, set[tuple[str, int, str, int]]] = defaultdict(set)
    problems: list[str] = []
    for request in reduces:
        if request.key != request.body_key:
            problems.append(f"reduce {request.seq}: header key {request.key} but body key "
                            f"{request.body_key}")
        page = (request.partition_id, request.gate, request.pass_, request.page)
        keys_of_page[page].add(request.key)
        pages_of_key[request.key].add(page)
    problems += [f"reduce page {page} was sent with {len(keys)} keys: {sorted(keys)}"
                 for page, keys in keys_of_page.items() if len(keys) != 1]
    problems += [f"key {key} was sent for {len(pages)} reduce pages: {sorted(pages)}"
                 for key, pages in pages_of_key.items() if len(pages) != 1]
    return problems


def reduce_order_problems(calls: Sequence[Call], reduces: Sequence[ReduceRequest],
                          item_ids: dict[str, list[str]], *, passes: int,
                          reduce_gate: int) -> list[str]:
    """Requests that started before the barrier in front of their gate had closed.

    A reduce request starts only after every item of its partition settled the
    gate before (its last pass answered); a per-item call at the gate after the
    reduce only after every item's reduce answer; any other per-item call as in
    :func:`gate_order_problems`. A late duplicate from a processor that lost its
    lease is allowed (the earliest answer counts).
    """
    settled_at: dict[tuple[str, str, int], float] = {}

    def settled(key: tuple[str, str, int], at: float | None) -> None:
        assert at is not None
        settled_at[key] = min(settled_at.get(key, at), at)

    for call in calls:
        if call.ok and call.step is not None and call.step[1] == passes - 1:
            settled((call.partition_id, call.item_id, call.gate), call.finished)
    for request in reduces:
        if request.ok and request.pass_ in ("all", "apply"):
            for item_id in request.item_ids:
                settled((request.partition_id, item_id, request.gate), request.finished)
    problems: list[str] = []
    for what, partition_id, gate, started in (
            [(f"call {c.seq} ({c.partition_id}/{c.item_id} gate {c.gate} by {c.caller})",
              c.partition_id, c.gate, c.started) for c in calls]
            + [(f"reduce {r.seq} ({r.partition_id} {r.pass_} page {r.page} by {r.caller})",
                r.partition_id, r.gate, r.started) for r in reduces]):
        if gate <= 0 or partition_id not in item_ids:
            continue
        for item_id in item_ids[partition_id]:
            done = settled_at.get((partition_id, item_id, gate - 1))
            if done is None or done >= started:
                problems.append(f"{what} started at {started:.3f} but item {item_id} settled "
                                f"gate {gate - 1} at {done if done is None else round(done, 3)}")
    return problems


def reduce_causality_problems(calls: Sequence[Call], reduces: Sequence[ReduceRequest]
                              ) -> list[str]:
    """Every call's and every reduce request's input must come from answers already given:
    each item's data from the call or reduce request its trail last names, and a fold
    page's accumulator from the fold request its chain last names."""
    problems: list[str] = []

    def check(what: str, started: float, entry: str) -> None:
        source = _source(entry, calls, reduces)
        if source is None or source.finished is None or source.finished >= started:
            problems.append(f"{what} got data written from {entry}, which had not been "
                            "answered when it started")

    for call in calls:
        state = call.state()
        if state and state["trail"]:
            check(f"call {call.seq}", call.started, state["trail"][-1])
    for request in reduces:
        for item_id, data in request.items:
            trail = json.loads(data).get("trail") or []
            if trail:
                check(f"reduce {request.seq} item {item_id}", request.started, trail[-1])
        if isinstance(request.accumulator, dict) and request.accumulator["chain"]:
            check(f"reduce {request.seq} accumulator", request.started,
                  f"{request.gate}:R@{request.accumulator['chain'][-1]}")
    return problems


# --------------------------------------------------------------------------- operator actions


def stopped_item_problems(then: Sequence[ItemInfo], now: Sequence[ItemInfo],
                          calls: Sequence[Call], *, stopped_at: float) -> list[str]:
    """Why a stopped (cancelled) partition's items show a write made after the stop.

    ``then`` are its items as read right after the stop committed, ``now`` as
    read later: they must be identical (status, gate, data, attempts, error,
    version, retry time), and no trail step may come from a call answered after
    ``stopped_at`` (when the stop had committed, by the handler's clock), since
    its result could only have been written after that.
    """
    problems: list[str] = []
    before = {item.id: item for item in then}
    after = {item.id: item for item in now}
    for item_id in sorted(before.keys() | after.keys()):
        old, new = before.get(item_id), after.get(item_id)
        if old != new:
            source = old or new
            assert source is not None
            problems.append(f"{source.partition_id}/{item_id}: changed after the stop: "
                            f"{old!r:.300} -> {new!r:.300}")
    for item in now:
        for step, seq in trail_of(item):
            call = calls[seq] if seq < len(calls) else None
            if call is None or call.finished is None or call.finished > stopped_at:
                problems.append(f"{item.partition_id}/{item.id}: step {step} was written from "
                                f"call {seq} ({call!r:.200}), answered after the stop")
    return problems


def late_call_problems(calls: Sequence[Call], partition_id: str, *, after: float,
                       before: float = float("inf")) -> list[str]:
    """Calls for ``partition_id`` that started between ``after`` and ``before`` (by the
    handler's clock): none may, once every processor must have dropped it."""
    return [f"call {call.seq} ({call.partition_id}/{call.item_id} gate {call.gate} by "
            f"{call.caller}) started at {call.started:.3f}, after the partition was stopped "
            f"(every processor must have dropped it by {after:.3f})"
            for call in calls
            if call.partition_id == partition_id and after < call.started < before]
