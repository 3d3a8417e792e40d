"""Pure decisions of a reduce gate: which call comes next, and what its answer writes.

A reduce gate is reduced in one call when its items fit one page (``"all"``),
and otherwise in two passes over pages in item id order: the *fold* pass sends
each page with the accumulator the previous page returned, the *apply* pass
sends each page again with the final accumulator and gets per-item answers.
The progress (pass, pages done, last item id done, accumulator) is stored on
the partition with every step, so a failover resumes where the work stopped.

Nothing here does I/O; :mod:`watcher.reducer` reads, calls and writes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from watcher.decisions import result_problem
from watcher.models import ReducePass, Status
from watcher.protocol import ReduceCall, ReduceItem, ReduceResult, Result
from watcher.records import ItemWrite, ReduceEntry, ReduceState

ALL = "all"
FOLD = ReducePass.FOLD.value
APPLY = ReducePass.APPLY.value
AVAILABLE = Status.AVAILABLE.value
COMPLETE = Status.COMPLETE.value
_COMPLETE_RESULT = Result(done=True)


@dataclass(frozen=True, slots=True)
class PageLimits:
    """How much one reduce page may hold: items, and bytes of item data."""

    items: int
    data_bytes: int


@dataclass(frozen=True, slots=True)
class ReducePlan:
    """The next reduce call: its pass, page position, items and accumulator."""

    pass_: str
    page: int
    last: bool
    entries: tuple[ReduceEntry, ...]
    accumulator: bytes | None


@dataclass(frozen=True, slots=True)
class ReduceStep:
    """What one answered reduce call writes, in one transaction.

    ``pass_``/``page``/``after``/``accumulator`` are the stored progress after
    this step (``pass_`` ``None``: the reduce of this gate is finished).
    ``result`` of ``None`` keeps the stored partition result.
    """

    pass_: str | None
    page: int
    after: str | None
    accumulator: bytes | None
    result: bytes | None
    writes: tuple[ItemWrite, ...]


class ReduceAnswerError(ValueError):
    """The reducer's answer breaks the reduce contract; the message says how."""


def cut_page(entries: Sequence[ReduceEntry], limits: PageLimits
             ) -> tuple[tuple[ReduceEntry, ...], bool]:
    """The first page of ``entries`` (read in id order, one more than a page) and
    whether more entries follow it.

    A page holds at most ``limits.items`` entries and stops before the entry
    that would take its data past ``limits.data_bytes``; it always holds at
    least one entry, so one large item still makes progress.
    """
    page: list[ReduceEntry] = []
    size = 0
    for entry in entries:
        if len(page) >= limits.items or (page and size + len(entry.data) > limits.data_bytes):
            return tuple(page), True
        page.append(entry)
        size += len(entry.data)
    return tuple(page), False


def plan_reduce(state: ReduceState, entries: Sequence[ReduceEntry], limits: PageLimits
                ) -> ReducePlan:
    """The next call for a reduce gate whose items (or stored progress) remain.

    ``entries`` are read after ``state.after`` in id order, at most one more
    than ``limits.items``. With no stored pass, a gate that fits one page is
    reduced in one call, and a larger one starts the fold pass.
    """
    page, more = cut_page(entries, limits)
    if state.pass_ is None:
        if not more:
            return ReducePlan(ALL, 0, True, page, None)
        return ReducePlan(FOLD, 0, False, page, None)
    return ReducePlan(state.pass_, state.page, not more, page, state.accumulator)


def reduce_key(partition_id: str, gate: int, pass_: str, page: int,
               entries: Sequence[ReduceEntry] = ()) -> str:
    """An idempotency key stable for one page of one pass of one partition's gate.

    The page's items and their versions go in too: they stay the same for every
    retry of the call (a failed call writes no item), and change when
    ``retry_failed`` puts items back for a finished reduce to run again, whose
    calls are new calls, not repeats a handler may answer from its cache.
    """
    digest = hashlib.sha256(f"{len(partition_id)}:{partition_id}:reduce:{gate}:{pass_}:"
                            f"{page}".encode())
    for entry in entries:
        digest.update(f":{len(entry.id)}:{entry.id}:{entry.version}".encode())
    return digest.hexdigest()[:32]


def reduce_call(partition_id: str, gate: int, plan: ReducePlan, attempt: int) -> ReduceCall:
    """The :class:`ReduceCall` a plan makes (``attempt`` is 1-based)."""
    items = tuple(ReduceItem(e.id, e.status, e.gate, e.data, e.last_error)
                  for e in plan.entries)
    return ReduceCall(partition_id, gate, attempt, plan.pass_, plan.page, plan.last, items,
                      plan.accumulator,
                      reduce_key(partition_id, gate, plan.pass_, plan.page, plan.entries))


def reduce_step(partition_id: str, gate: int, plan: ReducePlan, answer: object,
                max_data_bytes: int | None = None) -> ReduceStep:
    """What ``answer`` to the call of ``plan`` writes.

    Raises:
        ReduceAnswerError: the answer is not a :class:`ReduceResult`, a fold
            answer carries item answers, an answer names an item that is not
            available in this page, or an item answer is invalid or would
            leave the item at the reduce gate (or move it below).
    """
    if not isinstance(answer, ReduceResult):
        raise ReduceAnswerError(
            f"the reducer returned {type(answer).__name__}, expected a ReduceResult")
    _check_bytes("result", answer.result, max_data_bytes)
    _check_bytes("accumulator", answer.accumulator, max_data_bytes)
    after = plan.entries[-1].id if plan.entries else None
    if plan.pass_ == FOLD:
        if answer.items or answer.default is not None:
            raise ReduceAnswerError(
                "a fold answer carries only the accumulator (and, on any page, the "
                "partition result); item answers belong to the apply pass")
        if plan.last:
            return ReduceStep(APPLY, 0, None, answer.accumulator, answer.result, ())
        return ReduceStep(FOLD, plan.page + 1, after, answer.accumulator, answer.result, ())
    writes = item_writes(partition_id, gate, plan.entries, answer.items, answer.default,
                         max_data_bytes)
    if plan.last:
        return ReduceStep(None, 0, None, None, answer.result, writes)
    return ReduceStep(APPLY, plan.page + 1, after, plan.accumulator, answer.result, writes)


def item_writes(partition_id: str, gate: int, entries: Sequence[ReduceEntry],
                answers: Mapping[str, Result], default: Result | None,
                max_data_bytes: int | None = None) -> tuple[ItemWrite, ...]:
    """The guarded item writes of a reduce answer: one per available entry.

    Items the answer does not name take ``default`` (``None``: complete them).

    Raises:
        ReduceAnswerError: as :func:`reduce_step` says.
    """
    if not isinstance(answers, Mapping):
        raise ReduceAnswerError(
            f"the reduce answer's items must map item ids to results, got "
            f"{type(answers).__name__}")
    available = {entry.id: entry for entry in entries if entry.status == AVAILABLE}
    for item_id in answers:
        if item_id not in available:
            where = ("failed at an earlier gate: a reduce does not change failed items"
                     if any(entry.id == item_id for entry in entries)
                     else f"not an item of this request at gate {gate}")
            raise ReduceAnswerError(
                f"the reduce answer names item {_shown(item_id)}, which is {where}")
    fallback = _COMPLETE_RESULT if default is None else default
    if default is not None:
        _check_result("the default answer", fallback, gate, max_data_bytes)
    writes: list[ItemWrite] = []
    for item_id, entry in available.items():
        result = answers.get(item_id)
        if result is None:
            result = fallback
        else:
            _check_result(f"the answer for item {_shown(item_id)}", result, gate, max_data_bytes)
        target = gate if result.gate is None else result.gate
        status = COMPLETE if result.done else AVAILABLE
        writes.append(ItemWrite(partition_id, item_id, entry.version, status, target,
                                attempts=0, data=result.data, last_error=None))
    return tuple(writes)


def _check_result(what: str, result: object, gate: int, max_data_bytes: int | None) -> None:
    problem = result_problem(result, max_data_bytes)
    if problem is not None:
        raise ReduceAnswerError(f"{what}: {problem}")
    assert isinstance(result, Result)
    target = gate if result.gate is None else result.gate
    if target < gate:
        raise ReduceAnswerError(
            f"{what} moves the item to gate {target}, below the reduce gate {gate}")
    if target == gate and not result.done:
        raise ReduceAnswerError(
            f"{what} leaves the item at the reduce gate {gate}: complete it (done) or "
            "move it to a later gate")


def _check_bytes(what: str, value: object, max_bytes: int | None) -> None:
    if value is not None and not isinstance(value, bytes):
        raise ReduceAnswerError(
            f"the reduce answer's {what} must be bytes, got {type(value).__name__}")
    if max_bytes is not None and value is not None and len(value) > max_bytes:
        raise ReduceAnswerError(
            f"the reduce answer's {what} is {len(value)} bytes, over the item size limit of "
            f"{max_bytes} bytes (max_item_bytes)")


def _shown(item_id: str) -> str:
    return repr(item_id if len(item_id) <= 80 else item_id[:80] + "...")
