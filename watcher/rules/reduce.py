"""Pure decisions of a reduce gate: which call comes next, and what its answer writes.

A reduce gate is reduced in one call when its items fit one page (``"all"``),
and otherwise in two passes over pages in item id order: the *fold* pass sends
each page with the accumulator the previous page returned, the *apply* pass
sends each page again with the final accumulator and gets per-item answers.
The progress (pass, pages done, last item id done, accumulator) is stored on
the partition with every step, so a failover resumes where the work stopped.

Nothing here does I/O; :mod:`watcher.dispatch.reducer` reads, calls and writes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from watcher.models import AVAILABLE, COMPLETE, FAILED, ReducePass
from watcher.protocol import ReduceCall, ReduceItem, ReduceResult, Result
from watcher.records import DEFAULT_PIPELINE, ItemWrite, NewItem, ReduceEntry, ReduceState
from watcher.rules.decisions import result_problem
from watcher.rules.spawn import DEFAULT_SPAWN_LIMITS, SpawnLimits, resolve_spawn, spawn_problem

ALL = "all"
FOLD = ReducePass.FOLD.value
APPLY = ReducePass.APPLY.value
_COMPLETE_RESULT = Result(done=True)
# The largest accumulator a fold answer may carry. With an item at the default size
# limit (8 MiB, 4/3 of it as base64) and the envelope, one page still fits the
# handler SDK's 16 MiB request limit.
MAX_ACCUMULATOR_BYTES = 4 * 1024 * 1024

# How a reduce request is encoded on the HTTP wire (processor.wire.reduce.encode_reduce):
# compact JSON, ASCII-escaped, the stored accumulator's JSON text spliced in as it
# is, item data as padded base64. The sizes below are exact for it, so that the
# page cut and the handler's request limit agree to the byte.
_WIRE = json.JSONEncoder(separators=(",", ":"))
# A number larger than any gate, attempt or page: the envelope's size before its
# call is known is an upper bound.
_LARGEST_NUMBER = 10**15
_KEY_LENGTH = 32


@dataclass(frozen=True, slots=True)
class PageLimits:
    """How much one reduce page may hold: items, and bytes of its request as encoded
    (:func:`reduce_request_bytes`)."""

    items: int
    request_bytes: int


@dataclass(frozen=True, slots=True)
class ReducePlan:
    """The next reduce call: its pass, page position, items and accumulator."""

    pass_: str
    page: int
    last: bool
    entries: tuple[ReduceEntry, ...]
    accumulator: bytes | None


@dataclass(frozen=True, slots=True)
class ReduceWrite:
    """What one answered reduce call writes, in one transaction.

    ``pass_``/``page``/``after``/``accumulator`` are the stored progress after
    this step (``pass_`` ``None``: the reduce of this gate is finished).
    ``result`` of ``None`` keeps the stored partition result. ``spawn`` holds new
    items at later gates, with no parent item; they are recorded as spawned by the
    reduce at ``gate`` (``None``: by no reduce, as a client's items are).
    """

    pass_: str | None
    page: int
    after: str | None
    accumulator: bytes | None
    result: bytes | None
    writes: tuple[ItemWrite, ...]
    spawn: tuple[NewItem, ...] = ()
    gate: int | None = None


class ReduceAnswerError(ValueError):
    """The reducer's answer breaks the reduce contract; the message says how."""


class ReduceSpawnError(ReduceAnswerError):
    """The reducer's answer spawns what cannot be written. Asking again cannot help (the
    same step answers the same), so, as an item's bad spawn does, it fails at once."""


def envelope_bytes(partition_id: str, gate: int, attempt: int, pass_: str, page: int,
                   last: bool, idempotency_key: str, accumulator: bytes | None) -> int:
    """The bytes of a reduce request without its items (``"items":[]``)."""
    head = _WIRE.encode({"partition_id": partition_id, "gate": gate, "attempt": attempt,
                         "pass": pass_, "page": page, "last": last,
                         "idempotency_key": idempotency_key, "accumulator": None,
                         "items": []})
    return len(head) - len("null") + (len("null") if accumulator is None else len(accumulator))


def item_bytes(item_id: str, status: str, gate: int, last_error: str | None,
               data_length: int) -> int:
    """The bytes one item takes in a reduce request's ``items`` array (no separator)."""
    entry = _WIRE.encode({"item_id": item_id, "status": status, "gate": gate,
                          "last_error": last_error, "data_b64": ""})
    return len(entry) + 4 * ((data_length + 2) // 3)


def reduce_request_bytes(call: ReduceCall) -> int:
    """The exact size of ``call``'s HTTP request body (``processor.wire.reduce.encode_reduce``)."""
    items = call.items
    return (envelope_bytes(call.partition_id, call.gate, call.attempt, call.pass_, call.page,
                           call.last, call.idempotency_key, call.accumulator)
            + sum(item_bytes(item.id, item.status, item.gate, item.last_error,
                             len(item.data)) for item in items)
            + max(len(items) - 1, 0))


def largest_envelope(partition_id: str, accumulator: bytes | None) -> int:
    """An upper bound of :func:`envelope_bytes` for any call of this partition."""
    return envelope_bytes(partition_id, _LARGEST_NUMBER, _LARGEST_NUMBER, "apply",
                          _LARGEST_NUMBER, False, "k" * _KEY_LENGTH, accumulator)


# An entry of a reduce request's ``items`` without its strings' characters and its data:
# the keys, separators, quotes, ``null`` for no error and the largest gate. Each
# character of an id or an error takes at most 12 once encoded (a surrogate pair,
# escaped); a status is one of a few ASCII words.
_ENTRY_FIXED = len(_WIRE.encode({"item_id": "", "status": "", "gate": _LARGEST_NUMBER,
                                 "last_error": None, "data_b64": ""}))
_CHARACTER_MOST = 12


def _entry_bound(entry: ReduceEntry | ReduceItem) -> int:
    """At least the bytes :func:`item_bytes` counts for ``entry``, without encoding it."""
    error = entry.last_error  # in place of the null counted: its quotes and characters
    characters = len(entry.id) + (len(error) if error else 0)
    return (_ENTRY_FIXED + len(entry.status) + _CHARACTER_MOST * characters
            + 4 * ((len(entry.data) + 2) // 3))


def cut_page(entries: Sequence[ReduceEntry], limits: PageLimits, envelope: int = 0
             ) -> tuple[tuple[ReduceEntry, ...], bool]:
    """The first page of ``entries`` (read in id order, one more than a page) and
    whether more entries follow it.

    A page holds at most ``limits.items`` entries and stops before the entry
    that would take its request (``envelope`` bytes, then each item as
    :func:`item_bytes` counts it) past ``limits.request_bytes``; it always
    holds at least one entry, so one large item still makes progress (the
    caller checks that its request fits: :func:`page_problem`). A page whose
    entries' bounds (:func:`_entry_bound`) fit is cut without encoding any of them.
    """
    count = min(len(entries), limits.items)
    if envelope + sum(map(_entry_bound, entries[:count])) + count <= limits.request_bytes:
        return tuple(entries[:count]), len(entries) > count  # the usual page: well inside
    page: list[ReduceEntry] = []
    size = envelope
    for entry in entries:
        cost = item_bytes(entry.id, entry.status, entry.gate, entry.last_error,
                          len(entry.data)) + (1 if page else 0)
        if len(page) >= limits.items or (page and size + cost > limits.request_bytes):
            return tuple(page), True
        page.append(entry)
        size += cost
    return tuple(page), False


def without_oversize_data(entries: Sequence[ReduceEntry], max_data_bytes: int | None
                          ) -> list[ReduceEntry]:
    """``entries`` with the data of failed items over ``max_data_bytes`` left out (empty):
    they failed for their size (their ``last_error`` says so), and carrying them would
    make a request no handler takes."""
    if max_data_bytes is None:
        return list(entries)
    return [replace(entry, data=b"")
            if entry.status == FAILED and len(entry.data) > max_data_bytes else entry
            for entry in entries]


def plan_reduce(state: ReduceState, entries: Sequence[ReduceEntry], limits: PageLimits,
                partition_id: str = "", max_data_bytes: int | None = None) -> ReducePlan:
    """The next call for a reduce gate whose items (or stored progress) remain.

    ``entries`` are read after ``state.after`` in id order, at most one more
    than ``limits.items``. With no stored pass, a gate that fits one page is
    reduced in one call, and a larger one starts the fold pass. Failed items
    over ``max_data_bytes`` go without their data (:func:`without_oversize_data`).
    """
    entries = without_oversize_data(entries, max_data_bytes)
    envelope = largest_envelope(partition_id, state.accumulator)
    page, more = cut_page(entries, limits, envelope)
    if state.pass_ is None:
        if not more:
            return ReducePlan(ALL, 0, True, page, None)
        return ReducePlan(FOLD, 0, False, page, None)
    return ReducePlan(state.pass_, state.page, not more, page, state.accumulator)


def page_problem(call: ReduceCall, limits: PageLimits) -> str | None:
    """Why ``call`` cannot be sent (its request is over ``limits.request_bytes`` although
    it holds a single item), or ``None``."""
    items = call.items
    bound = (largest_envelope(call.partition_id, call.accumulator)
             + sum(map(_entry_bound, items)) + len(items))
    if bound <= limits.request_bytes:
        return None  # well inside: nothing to encode
    size = reduce_request_bytes(call)
    if size <= limits.request_bytes:
        return None
    largest = max(call.items, key=lambda item: len(item.data), default=None)
    shown = "no item" if largest is None else (
        f"item {_shown(largest.id)} ({len(largest.data)} bytes of data, "
        f"{4 * ((len(largest.data) + 2) // 3)} as base64)")
    return (f"a reduce request with {shown} and the accumulator "
            f"({len(call.accumulator or b'')} bytes) is {size} bytes, over the reduce request "
            f"limit of {limits.request_bytes} bytes (reduce_page_bytes, or the handler's "
            "smaller max_body_bytes): lower max_item_bytes to what a request carries, or "
            "raise both limits")


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


def reduce_call(partition_id: str, gate: int, plan: ReducePlan, attempt: int,
                pipeline: tuple[str, str | None] = (DEFAULT_PIPELINE, None)) -> ReduceCall:
    """The :class:`ReduceCall` a plan makes (``attempt`` is 1-based) for a partition of
    ``pipeline`` (its name and version)."""
    items = tuple(ReduceItem(e.id, e.status, e.gate, e.data, e.last_error)
                  for e in plan.entries)
    return ReduceCall(partition_id, gate, attempt, plan.pass_, plan.page, plan.last, items,
                      plan.accumulator,
                      reduce_key(partition_id, gate, plan.pass_, plan.page, plan.entries),
                      *pipeline)


def reduce_step(partition_id: str, gate: int, plan: ReducePlan, answer: object,
                max_data_bytes: int | None = None, *,
                spawn_limits: SpawnLimits = DEFAULT_SPAWN_LIMITS) -> ReduceWrite:
    """What ``answer`` to the call of ``plan`` writes.

    Raises:
        ReduceAnswerError: the answer is not a :class:`ReduceResult`, a fold
            answer carries item answers, an answer names an item that is not
            available in this page, or an item answer is invalid or would
            leave the item at the reduce gate (or move it below), or the answer's
            spawn cannot be written (a fold page spawns, or
            :func:`~watcher.rules.spawn.spawn_problem`: :class:`ReduceSpawnError`).
    """
    if not isinstance(answer, ReduceResult):
        raise ReduceAnswerError(
            f"the reducer returned {type(answer).__name__}, expected a ReduceResult")
    spawn = _checked_spawn(answer, gate, plan.pass_, spawn_limits)
    _check_bytes("result", answer.result, max_data_bytes)
    _check_bytes("accumulator", answer.accumulator, MAX_ACCUMULATOR_BYTES
                 if max_data_bytes is None else min(max_data_bytes, MAX_ACCUMULATOR_BYTES),
                 "the accumulator limit")
    after = plan.entries[-1].id if plan.entries else None
    if plan.pass_ == FOLD:
        if answer.items or answer.default is not None:
            raise ReduceAnswerError(
                "a fold answer carries only the accumulator (and, on any page, the "
                "partition result); item answers belong to the apply pass")
        if plan.last:
            return ReduceWrite(APPLY, 0, None, answer.accumulator, answer.result, ())
        return ReduceWrite(FOLD, plan.page + 1, after, answer.accumulator, answer.result, ())
    writes = item_writes(partition_id, gate, plan.entries, answer.items, answer.default,
                         max_data_bytes)
    if plan.last:
        return ReduceWrite(None, 0, None, None, answer.result, writes, spawn, gate)
    return ReduceWrite(APPLY, plan.page + 1, after, plan.accumulator, answer.result, writes,
                      spawn, gate)


def _checked_spawn(answer: ReduceResult, gate: int, pass_: str, limits: SpawnLimits
                   ) -> tuple[NewItem, ...]:
    """The items a reduce answer spawns, each at a gate after the reduce gate (``None``:
    the next gate). Raises :class:`ReduceAnswerError` as :func:`reduce_step` says."""
    if not answer.spawn:
        return ()
    if pass_ == FOLD:
        raise ReduceSpawnError(
            "a fold page may not spawn items; spawn from the apply pass or from a reduce "
            "that answers the whole gate at once")
    problem = spawn_problem(answer.spawn, floor=gate + 1, limits=limits)
    if problem is not None:
        raise ReduceSpawnError(problem)
    return resolve_spawn(answer.spawn, gate + 1)


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
    if result.spawn:
        raise ReduceAnswerError(
            f"{what} spawns items; in a reduce, spawn from the reduce answer itself "
            "(ReduceResult.spawn, or the answer's top-level 'spawn')")
    if result.snooze is not None:
        raise ReduceAnswerError(
            f"{what} snoozes; a reduce answers for the whole gate at once, so its items "
            "cannot wait one by one")
    target = gate if result.gate is None else result.gate
    if target < gate:
        raise ReduceAnswerError(
            f"{what} moves the item to gate {target}, below the reduce gate {gate}")
    if target == gate and not result.done:
        raise ReduceAnswerError(
            f"{what} leaves the item at the reduce gate {gate}: complete it (done) or "
            "move it to a later gate")


def _check_bytes(what: str, value: object, max_bytes: int | None,
                 limit: str = "the item size limit") -> None:
    if value is not None and not isinstance(value, bytes):
        raise ReduceAnswerError(
            f"the reduce answer's {what} must be bytes, got {type(value).__name__}")
    if max_bytes is not None and value is not None and len(value) > max_bytes:
        name = "max_item_bytes" if limit == "the item size limit" else (
            "a fold accumulator is sent back with every page: keep it small")
        raise ReduceAnswerError(
            f"the reduce answer's {what} is {len(value)} bytes, over {limit} of "
            f"{max_bytes} bytes ({name})")


def _shown(item_id: str) -> str:
    return repr(item_id if len(item_id) <= 80 else item_id[:80] + "...")
