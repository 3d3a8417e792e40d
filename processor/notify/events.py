"""An event's JSON body: what the receiver is told about a partition that ended.

Built once, at the event's first attempt, from the outbox row (the status and gate it
ended with, when) and the partition as it is then (its item counts, result, last
error); stored, so every retry sends the same bytes. A result over
:data:`RESULT_INLINE_BYTES`, or one that is not JSON, is left out: ``result_size``
says how large it is, and the API or client reads it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from processor.observe.redact import redact_url
from watcher.records import OutboxEvent, PartitionInfo

RESULT_INLINE_BYTES = 64 * 1024
TYPES = {"complete": "partition.complete", "failed": "partition.failed",
         "cancelled": "partition.cancelled"}


def rfc3339(moment: datetime | None) -> str | None:
    """A stored time (naive UTC) as RFC 3339 in UTC."""
    if moment is None:
        return None
    aware = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return aware.isoformat().replace("+00:00", "Z")


def event_row(event: OutboxEvent) -> dict[str, object]:
    """An outbox event as ``processor notifications list --json`` prints it and
    ``GET /v1/notifications`` answers it: the URL with its password and query values
    masked, and no body (the signing secret is never read here)."""
    return {"seq": event.seq, "id": event.event_id, "partition_id": event.partition_id,
            "status": event.status, "state": event.state, "attempts": event.attempts,
            "target": redact_url(event.target), "ended_at": rfc3339(event.created_at),
            "next_at": rfc3339(event.next_at) if event.state == "pending" else None,
            "updated_at": rfc3339(event.updated_at), "last_error": event.last_error}


def _result(info: PartitionInfo) -> tuple[Any, int | None, bool]:
    """The result to inline (or ``None``), its size, and whether it is inlined."""
    if info.result is None:
        return None, None, False
    size = len(info.result)
    if size > RESULT_INLINE_BYTES:
        return None, size, False
    try:
        return info.result_json(), size, True
    except ValueError:
        return None, size, False


def event_body(event: OutboxEvent, info: PartitionInfo | None) -> bytes:
    """The JSON body of ``event``; ``info`` is its partition as read now (``None``
    once deleted: then only what the outbox row holds is sent)."""
    result, size, inlined = _result(info) if info is not None else (None, None, False)
    document: dict[str, Any] = {
        "id": event.event_id,
        "type": TYPES.get(event.status, f"partition.{event.status}"),
        "partition_id": event.partition_id,
        "status": event.status,
        "gate": event.gate,
        "ended_at": rfc3339(event.created_at),
        "counts": None if info is None else dict(sorted(info.counts.items())),
        "result": result,
        "result_included": inlined,
        "result_size": size,
        "last_error": None if info is None else info.last_error,
        "created_at": None if info is None else rfc3339(info.created_at),
        "key": None if info is None else info.key,
        "partition_found": info is not None,
    }
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()
