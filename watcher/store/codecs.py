"""Values the store's parts share: statuses, chunk sizes, cursors, the stored form of a
partition's settings, and rows turned into records.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, TypeVar

from watcher.errors import (
    InvalidInputError,
)
from watcher.models import AVAILABLE, ItemFailurePolicy
from watcher.records import (
    ItemInfo,
    LeaseRow,
    NewItem,
    PartitionInfo,
    PartitionSettings,
    ReduceProgress,
)
from watcher.rules.error_history import decode_history
from watcher.rules.priority import turn_order
from watcher.store.sql.leases import LEASE_COLUMNS

T = TypeVar("T")

INSERT_CHUNK = 500
IN_CHUNK = 500
# Rows per lease statement that names each row (a take, a one-statement renewal): its
# guards and timeline cases grow with the rows, and SQLite limits an expression's depth.
LEASE_CHUNK = 128

NO_SETTINGS = PartitionSettings()



# The escape character of the LIKE patterns the store builds, and the characters it
# escapes: the wildcards, itself, and "[" (a character class on SQL Server).
LIKE_ESCAPE = "/"


def like_prefix(prefix: str) -> str:
    """A LIKE pattern matching the texts that start with ``prefix`` (and, on databases
    whose LIKE ignores case, those that do so but for case)."""
    escaped = "".join(LIKE_ESCAPE + char if char in "%_[/" else char for char in prefix)
    return escaped + "%"


def chunks(values: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


def sized_chunks(values: Sequence[T], size: int, most_bytes: int,
                 bytes_of: Callable[[T], int]) -> Iterable[Sequence[T]]:
    """``values`` in order, in chunks of at most ``size`` values whose ``bytes_of`` add
    up to at most ``most_bytes``; a value larger than that alone makes a chunk."""
    start, held = 0, 0
    for end, value in enumerate(values):
        weight = bytes_of(value)
        if end > start and (end - start >= size or held + weight > most_bytes):
            yield values[start:end]
            start, held = end, 0
        held += weight
    if start < len(values):
        yield values[start:]


def encode_partition_cursor(info: PartitionInfo | Any) -> str:
    """The cursor of a partitions page that ends with ``info`` (a partition or its row):
    its creation time and id, in an opaque URL-safe text."""
    assert info.created_at is not None
    raw = json.dumps([info.created_at.isoformat(), info.id], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode("ascii").rstrip("=")


def decode_partition_cursor(cursor: str) -> tuple[datetime, str]:
    """The creation time and id that :func:`encode_partition_cursor` put in ``cursor``.

    Raises:
        InvalidInputError: ``cursor`` is not such a cursor.
    """
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, partition_id = json.loads(raw)
        if not isinstance(partition_id, str):
            raise TypeError(partition_id)
        return datetime.fromisoformat(created), partition_id
    except (binascii.Error, ValueError, TypeError):
        raise InvalidInputError(
            f"{cursor[:60]!r} is not a cursor of the partitions listing; pass the "
            "next_cursor of the page before") from None


def encode_reduce_gates(gates: Collection[int]) -> str | None:
    """The ``reduce_gates`` column for ``gates``: a sorted JSON list, or NULL for none."""
    return json.dumps(sorted(gates), separators=(",", ":")) if gates else None


def settings_of(reduce_gates: str | None, on_item_failure: str | None,
                trace_context: str | None = None, quorum: str | None = None
                ) -> PartitionSettings:
    """A partition's settings from its ``reduce_gates``, ``on_item_failure``,
    ``trace_context`` and ``quorum`` columns."""
    gates = frozenset(json.loads(reduce_gates)) if reduce_gates else frozenset()
    return PartitionSettings(gates, on_item_failure == ItemFailurePolicy.CONTINUE.value,
                             trace_context, quorum=decode_quorum(quorum))


def decode_quorum(stored: str | None) -> tuple[tuple[int, int], ...]:
    """A ``quorum`` column (JSON ``{"gate": k}``) as (gate, k) pairs in gate order."""
    if not stored:
        return ()
    return tuple(sorted((int(gate), int(k)) for gate, k in json.loads(stored).items()))


def encode_quorum(quorum: tuple[tuple[int, int], ...]) -> str | None:
    """(gate, k) pairs as the ``quorum`` column stores them; ``None`` for none."""
    return json.dumps({str(gate): k for gate, k in quorum}) if quorum else None


def client_items(items: Sequence[NewItem]) -> list[NewItem]:
    """``items`` with a gate of ``None`` (the default) set to 0: where a client's items
    start."""
    return [item if item.gate is not None else NewItem(item.id, item.data, 0)
            for item in items]


def colliding_ids(items: Sequence[NewItem]) -> list[str]:
    """The ids of ``items`` that equal another's but for trailing spaces (all of them
    when none does): what a PAD SPACE collation takes for duplicates."""
    groups: dict[str, list[str]] = {}
    for item in items:
        groups.setdefault(item.id.rstrip(" "), []).append(item.id)
    colliding = sorted(one for group in groups.values() if len(group) > 1 for one in group)
    return colliding or sorted(item.id for item in items)


class NothingToDo(Exception):
    """A client write found nothing to change: roll its transaction (the lock it took
    by touching the partition row) back, and return ``value``."""

    def __init__(self, value: object) -> None:
        super().__init__()
        self.value = value


class GuardLost(Exception):
    """An item of a reduce step moved since it was read: roll the step back."""


def to_lease_row(row: Sequence[Any]) -> LeaseRow:
    """A lease read's row, its columns in the order of
    :data:`watcher.store.sql.leases.LEASE_COLUMNS` (any after them left), as a
    :class:`LeaseRow`."""
    (pid, version, gate, owner, reduce_gates, on_item_failure, trace_context, priority,
     key, rank_at, timeline, quorum, notify, pipeline,
     pipeline_version) = row[:len(LEASE_COLUMNS)]
    settings = settings_of(reduce_gates, on_item_failure, trace_context, quorum)
    order = 0.0 if rank_at is None else turn_order(rank_at.replace(tzinfo=UTC))
    return LeaseRow(pid, version, gate, owner,
                    replace(settings, priority=priority, key=key, queue_order=order,
                            notify=notify, pipeline=pipeline,
                            pipeline_version=pipeline_version),
                    timeline=timeline, timeline_read=True)


def to_partition_info(row: Any, counts: dict[str, int]) -> PartitionInfo:
    settings = settings_of(row.reduce_gates, row.on_item_failure)
    reducing = row.status == AVAILABLE and row.gate in settings.reduce_gates
    progress = (ReduceProgress(row.reduce_pass, row.reduce_page, row.reduce_attempts)
                if reducing or row.reduce_pass is not None else None)
    return PartitionInfo(
        id=row.id, status=row.status, gate=row.gate, owner=row.owner, until=row.until,
        version=row.version, counts=counts, created_at=row.created_at,
        updated_at=row.updated_at, reduce_gates=tuple(sorted(settings.reduce_gates)),
        on_item_failure=row.on_item_failure,
        result=None if row.result is None else bytes(row.result),
        last_error=row.last_error, reduce=progress, spawned=row.spawned,
        priority=row.priority, paused_at=row.paused_at, key=row.flow_key or None,
        pipeline=row.pipeline, pipeline_version=row.pipeline_version,
    )


def to_item_info(row: Any, *, with_data: bool = True) -> ItemInfo:
    """An item row as the client sees it; its error history decoded here, in one place.
    Without ``with_data`` the row holds no data (``data`` is ``b""``); a row without an
    ``error_history`` column (a read that left it out) has none."""
    return ItemInfo(
        partition_id=row.partition_id, id=row.id, status=row.status, gate=row.gate,
        data=bytes(row.data) if with_data else b"", attempts=row.attempts,
        last_error=row.last_error, version=row.version, retry_at=row.retry_at,
        parent=row.parent,
        error_history=decode_history(getattr(row, "error_history", None)),
    )
