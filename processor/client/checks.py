"""What the client checks before it writes or reads anything: ids, items, settings,
statuses, limits and cursors. Pure: each check returns the clean value or raises
:class:`~watcher.errors.InvalidInputError` naming what is wrong."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from processor.notify.targets import check_notify_url
from watcher.config import DEFAULT_MAX_ITEM_BYTES
from watcher.errors import (
    DuplicateItemError,
    InvalidInputError,
)
from watcher.models import MAX_GATE, ItemFailurePolicy, Status
from watcher.records import (
    DEFAULT_PIPELINE,
    NewItem,
    PartitionSettings,
)
from watcher.rules.delays import DelayError, checked_time
from watcher.rules.ids import id_problem, pipeline_name_problem
from watcher.rules.priority import DEFAULT_PRIORITY, priority_problem

WAIT_POLL_START = 0.02
WAIT_POLL_MAX = 0.5
# A partition in one of these is finished: wait() returns it.
FINISHED_STATUSES = (Status.COMPLETE.value, Status.FAILED.value, Status.CANCELLED.value)
# Rows per page of items() and partitions(), unless asked for another size; the most.
DEFAULT_PAGE = 1000
MAX_PAGE = 10_000
PARTITION_STATUSES = tuple(status.value for status in Status)
ITEM_STATUSES = (Status.AVAILABLE.value, Status.WAITING.value, Status.COMPLETE.value,
                 Status.FAILED.value, Status.SKIPPED.value)
# gate_counts() reads the items of the partitions it is given: one page of them at most.
MAX_GATE_COUNT_PARTITIONS = 1000
# Where the counts of backlog() and throughput() stop, unless asked otherwise; the most.
DEFAULT_COUNT_CAP = 100_000
MAX_COUNT_CAP = 1_000_000
DEFAULT_THROUGHPUT_MINUTES = 15
MAX_THROUGHPUT_MINUTES = 60


def check_status(status: str | None, allowed: tuple[str, ...], kind: str) -> str | None:
    if status is not None and status not in allowed:
        raise InvalidInputError(f"unknown status {status!r} for {kind}s; use one of "
                                f"{', '.join(allowed)}")
    return status


def check_limit(setting: str, value: object, maximum: int) -> int:
    if type(value) is not int or not 1 <= value <= maximum:
        raise InvalidInputError(f"{setting} must be a whole number from 1 to {maximum}, "
                                f"got {value!r}")
    return value


def check_cursor(after: object) -> str | None:
    if after is not None and (not isinstance(after, str) or not after):
        raise InvalidInputError(
            f"after must be the next_cursor of the page before (a non-empty string), "
            f"got {after!r}")
    return after


def check_seconds_value(setting: str, value: object) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 \
            or value == float("inf"):
        raise InvalidInputError(f"{setting} must be a number of seconds (or a timedelta) "
                                f"greater than 0, got {value!r}")
    return float(value)


def is_gate(value: object) -> bool:
    return type(value) is int and 0 <= value <= MAX_GATE


def check_id(kind: str, value: object) -> str:
    problem = id_problem(kind, value)
    if problem is not None:
        raise InvalidInputError(problem)
    assert isinstance(value, str)
    return value


def check_items(partition_id: str, items: Iterable[NewItem], *, allow_empty: bool,
                 max_item_bytes: int = DEFAULT_MAX_ITEM_BYTES) -> list[NewItem]:
    if isinstance(items, NewItem | bytes | str):
        raise InvalidInputError(
            f"items for partition {partition_id!r} must be a list of NewItem, not a single "
            f"{type(items).__name__}")
    checked = [check_item(partition_id, item, position, max_item_bytes)
               for position, item in enumerate(items)]
    if not checked and not allow_empty:
        raise InvalidInputError(f"no items given for partition {partition_id!r}")
    repeated = sorted(item_id for item_id, count in Counter(item.id for item in checked).items()
                      if count > 1)
    if repeated:
        raise DuplicateItemError(partition_id, repeated, stored=False)
    return checked


def check_item(partition_id: str, item: object, position: int,
               max_item_bytes: int = DEFAULT_MAX_ITEM_BYTES) -> NewItem:
    """One item the client (or the ingest API) inserts, as it is stored: its id checked,
    its gate set (``None`` is 0), its data bytes within ``max_item_bytes``.
    ``position`` (from 0) names it in the message when it is not a :class:`NewItem`.

    Raises:
        InvalidInputError: not a NewItem, a bad id, data that is not bytes, a gate that
            is not a whole number from 0, data over ``max_item_bytes``, or a
            ``not_before`` without a time zone or more than a year ahead.
    """
    if not isinstance(item, NewItem):
        raise InvalidInputError(
            f"item #{position} for partition {partition_id!r} is a {type(item).__name__}; "
            "pass NewItem(id, data: bytes, gate=0)")
    check_id("item", item.id)
    if item.gate is None:  # the client's default gate
        item = NewItem(item.id, item.data, 0, item.not_before)
    if isinstance(item.data, bytearray | memoryview):
        item = NewItem(item.id, bytes(item.data), item.gate, item.not_before)
    if not isinstance(item.data, bytes):
        hint = " (encode text first, e.g. text.encode())" if isinstance(item.data, str) else ""
        raise InvalidInputError(
            f"item {item.id!r} of partition {partition_id!r}: data must be bytes, got "
            f"{type(item.data).__name__}{hint}")
    if not is_gate(item.gate):
        raise InvalidInputError(
            f"item {item.id!r} of partition {partition_id!r}: gate must be a whole number "
            f"from 0 to {MAX_GATE}, got {item.gate!r}")
    if item.not_before is not None:
        try:
            not_before = checked_time(item.not_before, "not_before")
        except DelayError as error:
            raise InvalidInputError(f"item {item.id!r} of partition {partition_id!r}: "
                                    f"{error}") from None
        item = NewItem(item.id, item.data, item.gate, not_before)
    if len(item.data) > max_item_bytes:
        raise InvalidInputError(
            f"item {item.id!r} of partition {partition_id!r} is {len(item.data)} bytes; "
            f"the limit is {max_item_bytes} bytes (max_item_bytes): store large content "
            "elsewhere and put a reference in the item")
    return item


MAX_REDUCE_GATES = 64
# A gate in a list of text has at most this many digits (int() refuses over 4300; over
# 10 is out of range anyway, which check_settings says).
MAX_GATE_DIGITS = 20


def parse_gate_list(raw: str, name: str) -> list[int]:
    """The gates of a comma-separated list such as ``1,3`` (spaces around each allowed;
    blank: none), as ``--reduce-gates`` and the console's add form take them. Only the
    shape is checked here: ranges and repeats are :func:`check_settings`' to name.

    Raises:
        InvalidInputError: not whole numbers separated by commas; the message names
            ``name`` (the option or field) and what was given.
    """
    parts = [part.strip() for part in raw.split(",")] if raw.strip() else []
    # ASCII digits only: int() would also take "1_0", "+1" and other scripts' digits.
    if not all(part.isascii() and part.isdigit() and len(part) <= MAX_GATE_DIGITS
               for part in parts):
        raise InvalidInputError(f"{name} must be gates separated by commas, such as 1,3; "
                                f"got {raw!r}")
    return [int(part) for part in parts]
ITEM_FAILURE_POLICIES = tuple(policy.value for policy in ItemFailurePolicy)


def check_settings(partition_id: str, reduce_gates: Iterable[int],
                    on_item_failure: str, priority: object = DEFAULT_PRIORITY,
                    key: object = None, quorum: object = None,
                    notify: object = None, pipeline: object = None,
                    pipeline_version: object = None) -> PartitionSettings:
    """A partition's settings, checked; ``pipeline`` ``None`` is ``default``.

    Raises:
        InvalidInputError: reduce gates that are not a list of distinct gates (or too
            many), an unknown failure policy, a priority out of range, a key that
            is not a valid id, a quorum that is not ``{gate: k}`` with whole
            numbers (:func:`check_quorum`), or a ``notify`` that is not an http(s) URL
            (:func:`~processor.notify.targets.check_notify_url`), or a ``pipeline`` or
            ``pipeline_version`` that is not a name (:func:`check_pipeline`).
    """
    if isinstance(reduce_gates, str | bytes | int) or not isinstance(reduce_gates, Iterable):
        raise InvalidInputError(
            f"reduce_gates for partition {partition_id!r} must be a list of gates such as "
            f"[1], got {reduce_gates!r}")
    gates = list(reduce_gates)
    for gate in gates:
        if not is_gate(gate):
            raise InvalidInputError(
                f"reduce gate {gate!r} of partition {partition_id!r} must be a whole number "
                f"from 0 to {MAX_GATE}")
    repeated = sorted({gate for gate in gates if gates.count(gate) > 1})
    if repeated:
        raise InvalidInputError(
            f"reduce gates {repeated} of partition {partition_id!r} are given twice; name "
            "each gate once")
    if len(gates) > MAX_REDUCE_GATES:
        raise InvalidInputError(
            f"partition {partition_id!r} names {len(gates)} reduce gates; the limit is "
            f"{MAX_REDUCE_GATES}")
    if on_item_failure not in ITEM_FAILURE_POLICIES:
        raise InvalidInputError(
            f"on_item_failure for partition {partition_id!r} must be one of "
            f"{', '.join(map(repr, ITEM_FAILURE_POLICIES))}, got {on_item_failure!r}")
    problem = priority_problem(priority)
    if problem is not None:
        raise InvalidInputError(f"partition {partition_id!r}: {problem}")
    assert isinstance(priority, int)
    return PartitionSettings(frozenset(gates),
                             on_item_failure == ItemFailurePolicy.CONTINUE.value,
                             priority=priority, key=checked_key(key),
                             quorum=check_quorum(partition_id, quorum),
                             notify=check_notify_url(partition_id, notify),
                             pipeline=check_pipeline(partition_id, "pipeline", pipeline),
                             pipeline_version=None if pipeline_version is None else
                             check_pipeline(partition_id, "pipeline_version", pipeline_version))


def check_pipeline(partition_id: str | None, field: str, value: object) -> str:
    """A ``pipeline`` (``None``: ``default``) or ``pipeline_version`` name, checked
    (:func:`~watcher.rules.ids.pipeline_name_problem`).

    Raises:
        InvalidInputError: not such a name; the message names ``field``.
    """
    if value is None and field == "pipeline":
        return DEFAULT_PIPELINE
    problem = pipeline_name_problem(field, value)
    if problem is not None:
        where = "" if partition_id is None else f"partition {partition_id!r}: "
        raise InvalidInputError(where + problem)
    assert isinstance(value, str)
    return value


def check_quorum(partition_id: str, quorum: object) -> tuple[tuple[int, int], ...]:
    """A partition's ``quorum`` (``{gate: k}``: the gate passes once ``k`` of its
    items are complete) as (gate, k) pairs in gate order; ``None`` or ``{}`` for none.
    Gates may be given as whole numbers or their decimal strings (JSON's keys).

    Raises:
        InvalidInputError: not a mapping, a gate that is not a whole number from 0
            to the largest gate, or a ``k`` that is not a whole number of at least 1,
            or more gates than the limit.
    """
    if quorum is None:
        return ()
    if not isinstance(quorum, Mapping):
        raise InvalidInputError(
            f"quorum of partition {partition_id!r} must be a mapping of gate to k such "
            f"as {{1: 2}} (gate 1 passes once 2 of its items are complete), got {quorum!r}")
    if len(quorum) > MAX_REDUCE_GATES:
        raise InvalidInputError(
            f"quorum of partition {partition_id!r} names {len(quorum)} gates; the limit "
            f"is {MAX_REDUCE_GATES}")
    pairs: dict[int, int] = {}
    for raw_gate, k in quorum.items():
        gate = raw_gate
        if isinstance(raw_gate, str) and raw_gate.isdigit() and raw_gate.isascii():
            gate = int(raw_gate)
        if not is_gate(gate):
            raise InvalidInputError(
                f"quorum gate {raw_gate!r} of partition {partition_id!r} must be a whole "
                f"number from 0 to {MAX_GATE}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InvalidInputError(
                f"quorum k {k!r} at gate {gate} of partition {partition_id!r} must be a "
                "whole number of at least 1 (how many items pass the gate)")
        if gate in pairs:
            raise InvalidInputError(
                f"quorum gate {gate} of partition {partition_id!r} is given twice")
        pairs[gate] = k
    return tuple(sorted(pairs.items()))


def checked_key(key: object) -> str:
    """A concurrency key as stored: ``None`` is ``''`` (no key).

    Raises:
        InvalidInputError: not a string, or not a valid id (empty, too long, ...).
    """
    if key is None:
        return ""
    if not isinstance(key, str):
        raise InvalidInputError(f"key must be a string (a tenant or customer id), got "
                                f"{type(key).__name__}")
    problem = id_problem("key", key)
    if problem is not None:
        raise InvalidInputError(problem)
    return key



def check_start_at(partition_id: str, start_at: object) -> datetime | None:
    """A partition's ``start_at`` in UTC, or ``None`` when it has none.

    Raises:
        InvalidInputError: not an aware datetime, or more than a year ahead.
    """
    if start_at is None:
        return None
    try:
        return checked_time(start_at, "start_at")
    except DelayError as error:
        raise InvalidInputError(f"partition {partition_id!r}: {error}") from None
