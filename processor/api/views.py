"""What the API's answers hold: partitions, items, pages and reports as JSON objects, and
the query parameters its reads take. Pure: no I/O.

An item's ``data`` (and a partition's ``result``) is shown as the JSON value it
holds when it is JSON, and as ``data_b64`` (``result_b64``) when it is other bytes:
what went in as ``data`` comes back as ``data``.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping
from typing import Any

from processor.api.problems import bad_request
from processor.views import partition_row
from watcher.records import ItemInfo, PartitionInfo

FINISHED = ("complete", "failed", "cancelled")
DEFAULT_WAIT_SECONDS = 30.0
MAX_WAIT_SECONDS = 300.0
DEFAULT_ITEMS_LIMIT = 100
TRUE_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def partition_view(info: PartitionInfo) -> dict[str, Any]:
    """A partition: status, gate, counts per status, settings, result and timestamps;
    ``finished`` says it is complete, failed or cancelled."""
    row = partition_row(info)
    row["finished"] = info.status in FINISHED
    row["total"] = sum(info.counts.values())
    row["created_at"] = None if info.created_at is None else info.created_at.isoformat()
    row["updated_at"] = None if info.updated_at is None else info.updated_at.isoformat()
    row.pop("owner", None)
    return row


def item_view(info: ItemInfo, *, with_data: bool) -> dict[str, Any]:
    """An item: status, gate, attempts, last error, parent and (``with_data``) its data."""
    view: dict[str, Any] = {
        "id": info.id, "status": info.status, "gate": info.gate, "attempts": info.attempts,
        "last_error": info.last_error, "version": info.version,
        "retry_at": None if info.retry_at is None else info.retry_at.isoformat(),
        "parent": info.parent}
    if with_data:
        view.update(data_value(info.data))
    return view


def data_value(data: bytes) -> dict[str, Any]:
    """``{"data": value}`` when ``data`` is JSON, else ``{"data_b64": text}``."""
    try:
        return {"data": json.loads(data)}
    except ValueError:
        return {"data_b64": base64.b64encode(data).decode("ascii")}


def only(query: Mapping[str, str], allowed: frozenset[str]) -> None:
    """Refuse a query parameter the route does not take.

    Raises:
        ApiError: 400 naming the first unknown parameter.
    """
    unknown = sorted(set(query) - allowed)
    if unknown:
        takes = ", ".join(sorted(allowed)) or "no parameters"
        raise bad_request(f"unknown query parameter {unknown[0]!r}; this route takes {takes}",
                          field=unknown[0])


def whole_number(query: Mapping[str, str], name: str, default: int | None, *,
                 low: int, high: int) -> int | None:
    """A whole-number query parameter from ``low`` to ``high`` (``default`` if absent).

    Raises:
        ApiError: 400 naming the parameter when it is not such a number.
    """
    raw = query.get(name)
    if raw is None:
        return default
    if not raw.strip().isdigit() or not low <= int(raw) <= high:
        raise bad_request(f"{name} must be a whole number from {low} to {high}, got {raw!r}",
                          field=name)
    return int(raw)


def seconds(query: Mapping[str, str], name: str, default: float, *, high: float) -> float:
    """A number of seconds from 0 to ``high`` (``default`` if absent).

    Raises:
        ApiError: 400 naming the parameter when it is not such a number.
    """
    raw = query.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 <= value <= high:
        raise bad_request(f"{name} must be a number of seconds from 0 to {high:g}, got {raw!r}",
                          field=name)
    return value


def flag(query: Mapping[str, str], name: str, default: bool) -> bool:
    """A true/false query parameter (``true``, ``false``, ``1``, ``0``, ``yes``, ``no``).

    Raises:
        ApiError: 400 naming the parameter when it is another word.
    """
    raw = query.get(name)
    if raw is None:
        return default
    if raw.lower() not in TRUE_WORDS:
        raise bad_request(f"{name} must be true or false, got {raw!r}", field=name)
    return TRUE_WORDS[raw.lower()]
