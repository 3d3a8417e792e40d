"""What the API's answers hold: partitions, items, pages and reports as JSON objects, and
the query parameters its reads take. Pure: no I/O.

An item's ``data`` (and a partition's ``result``) is shown as the JSON value it
holds when it is UTF-8 JSON an answer can carry, and as ``data_b64``
(``result_b64``) when it is other bytes: what went in as ``data`` comes back as
``data``. Times are RFC 3339, in UTC. Numbers in a query are ASCII digits:
``int()`` and ``float()`` take more (``"1_0"``, other scripts' digits), and
``str.isdigit()`` takes ``"²"``, which ``int()`` then refuses.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from processor.api.problems import bad_request
from processor.views import partition_row, wait_deadline, waiting_row
from processor.wire.values import data_value
from watcher.records import ItemInfo, PartitionInfo
from watcher.reports import WaitSummary

FINISHED = ("complete", "failed", "cancelled")
DEFAULT_WAIT_SECONDS = 30.0
MAX_WAIT_SECONDS = 300.0
DEFAULT_ITEMS_LIMIT = 100
TRUE_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
# A whole number, and a decimal number with an optional exponent: ASCII only, and short
# enough that neither int()'s digit limit nor a float's range is reached unchecked.
WHOLE_NUMBER = re.compile(r"[0-9]{1,20}")
DECIMAL_NUMBER = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?")
MAX_NUMBER_CHARS = 40


def partition_view(info: PartitionInfo, waiting: WaitSummary | None = None) -> dict[str, Any]:
    """A partition: status, gate, counts per status, settings (its key, priority and
    pause too), result and timestamps; ``finished`` says it is complete, failed or
    cancelled; ``waiting`` its parked items (per gate, the oldest's age, the earliest
    deadline), ``null`` when none."""
    row = partition_row(info)
    row["waiting"] = waiting_row(waiting)
    row.pop("owner", None)
    row.pop("result", None)
    row.pop("result_b64", None)
    row.update({"result": None} if info.result is None else data_value(info.result, "result"))
    row["finished"] = info.status in FINISHED
    row["total"] = sum(info.counts.values())
    row["paused_at"] = timestamp(info.paused_at)
    row["created_at"] = timestamp(info.created_at)
    row["updated_at"] = timestamp(info.updated_at)
    return row


def item_view(info: ItemInfo, *, with_data: bool) -> dict[str, Any]:
    """An item: status, gate, attempts, last error, parent and (``with_data``) its data."""
    view: dict[str, Any] = {
        "id": info.id, "status": info.status, "gate": info.gate, "attempts": info.attempts,
        "last_error": info.last_error, "version": info.version,
        "retry_at": timestamp(info.retry_at), "deadline": wait_deadline(info),
        "parent": info.parent}
    if with_data:
        view.update(data_value(info.data))
    return view


def timestamp(value: datetime | None) -> str | None:
    """A stored time (naive UTC, or aware) as RFC 3339 in UTC; ``None`` stays ``None``."""
    if value is None:
        return None
    return (value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
            ).isoformat()


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
    """A whole-number query parameter (ASCII digits) from ``low`` to ``high`` (``default``
    if absent).

    Raises:
        ApiError: 400 naming the parameter when it is not such a number.
    """
    raw = query.get(name)
    if raw is None:
        return default
    if not WHOLE_NUMBER.fullmatch(raw) or not low <= int(raw) <= high:
        raise bad_request(f"{name} must be a whole number from {low} to {high}, got {raw!r}",
                          field=name)
    return int(raw)


def page_limit(query: Mapping[str, str], high: int = 10_000) -> int:
    """A page's ``limit`` query parameter: from 1 to ``high``, 100 when absent.

    Raises:
        ApiError: 400 naming it when it is not such a number.
    """
    return whole_number(query, "limit", DEFAULT_ITEMS_LIMIT, low=1, high=high) \
        or DEFAULT_ITEMS_LIMIT


def seconds(query: Mapping[str, str], name: str, default: float, *, high: float) -> float:
    """A number of seconds from 0 to ``high`` (``default`` if absent): digits with an
    optional fraction and exponent (``0.5``, ``30``, ``1e-05``).

    Raises:
        ApiError: 400 naming the parameter when it is not such a number.
    """
    raw = query.get(name)
    if raw is None:
        return default
    value = float(raw) if len(raw) <= MAX_NUMBER_CHARS and DECIMAL_NUMBER.fullmatch(raw) \
        else math.nan
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
