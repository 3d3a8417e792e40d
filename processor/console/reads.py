"""What the console's pages read: each page's data from the client, with the page's query
parameters checked first. No rendering, no HTTP: the routes in :mod:`processor.console.app`
render what these return."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from processor.client.async_client import AsyncClient
from processor.client.checks import MAX_PAGE
from processor.console.views import leases_view, pages, texts, timeline_view
from watcher.models import PARTITION_STATUSES as PARTITION_STATUS_ENUM

LIST_PAGE = 50
ITEMS_PAGE = 50
OPEN_ON_OVERVIEW = 10
FAILED_PREVIEW = 10
THROUGHPUT_MINUTES = 15
# Where the overview's counts stop (shown as "100,000+"): each is a bounded index read.
COUNT_CAP = 100_000
ITEM_STATUSES = ("available", "waiting", "complete", "failed", "skipped")
# The statuses a partition takes (never an item's own "waiting" or "skipped").
PARTITION_STATUSES = tuple(status.value for status in PARTITION_STATUS_ENUM)
# Parked items the partition page lists (its "waiting" filter lists them all).
WAITING_PREVIEW = 10


class BadRequest(Exception):
    """A query parameter or form field the console cannot use; the message says which."""


async def overview_data(client: AsyncClient) -> dict[str, Any]:
    """What the overview shows: the places where open partitions wait that no live
    processor serves, partitions by status, waiting items, lease holders, the last
    minutes' finished partitions and the open partitions' gates."""
    unserved = await client.unserved_places()
    backlog = await client.backlog(COUNT_CAP)
    holders = await client.lease_holders()
    throughput = await client.throughput(THROUGHPUT_MINUTES, COUNT_CAP)
    open_page = await client.partitions("available", OPEN_ON_OVERVIEW, with_counts=False)
    counts = await client.gate_counts([info.id for info in open_page])
    waits = await client.waits_summary([info.id for info in open_page])
    now = await client.now()
    busiest = max(holders.values(), default=0) or 1
    return {
        "unserved": unserved,
        "lease_note": leases_view.lease_note(backlog.partitions.get("available", 0),
                                       backlog.items_waiting, backlog.items_parked),
        "items_parked": texts.count_text(backlog.items_parked, COUNT_CAP),
        "statuses": [(status, backlog.partitions.get(status, 0)) for status in
                     PARTITION_STATUSES],
        "count_text": lambda count: texts.count_text(count, COUNT_CAP),
        "items_waiting": texts.count_text(backlog.items_waiting, COUNT_CAP),
        "holders": [(owner, held, round(100.0 * held / busiest, 2))
                    for owner, held in holders.items()],
        "leases_held": sum(holders.values()),
        "bars": pages.throughput_bars(throughput),
        "peak": max((bar.total for bar in pages.throughput_bars(throughput)), default=0),
        "finished_total": sum(sum(counts_) for counts_ in throughput.finished.values()),
        "minutes": THROUGHPUT_MINUTES,
        "rows": [pages.partition_row(info, counts.get(info.id, {}), now,
                                     waits=waits.get(info.id)) for info in open_page],
        "more_open": open_page.next_cursor is not None,
    }

async def list_data(client: AsyncClient, query: Mapping[str, str]) -> dict[str, Any]:
    """One page of the partitions list, filtered by the query's status and id prefix.

    Raises:
        BadRequest: an unknown status, or a limit that is not a whole number in range.
    """
    status = query.get("status") or None
    if status is not None and status not in PARTITION_STATUSES:
        raise BadRequest(f"unknown status {status!r}; use one of "
                         f"{', '.join(PARTITION_STATUSES)}")
    prefix = query.get("prefix") or None
    after = query.get("after") or None
    limit = whole_number(query.get("limit"), "limit", LIST_PAGE, 1, MAX_PAGE // 10)
    page = await client.partitions(status, limit, after=after, id_prefix=prefix,
                                        with_counts=False)
    counts = await client.gate_counts([info.id for info in page])
    waits = await client.waits_summary([info.id for info in page])
    now = await client.now()
    return {
        "rows": [pages.partition_row(info, counts.get(info.id, {}), now,
                                     waits=waits.get(info.id)) for info in page],
        "status": status or "", "prefix": prefix or "", "after": after or "",
        "limit": limit if limit != LIST_PAGE else "",
        "next_cursor": page.next_cursor, "statuses": PARTITION_STATUSES,
    }

async def partition_data(client: AsyncClient, query: Mapping[str, str]) -> dict[str, Any]:
    """One partition's page: its summary, gates, failed items and a page of its items.

    Raises:
        BadRequest: no id, an unknown item status, or a bad gate.
        PartitionNotFoundError: no partition has this id.
    """
    partition_id = query.get("id") or ""
    if not partition_id:
        raise BadRequest("name a partition: /partition?id=...")
    item_status = query.get("status") or None
    if item_status is not None and item_status not in ITEM_STATUSES:
        raise BadRequest(f"unknown item status {item_status!r}; use one of "
                         f"{', '.join(ITEM_STATUSES)}")
    gate = query.get("gate")
    gate_number = None if gate in (None, "") else whole_number(gate, "gate", 0, 0, 2**31 - 1)
    after = query.get("after") or None
    info = await client.partition(partition_id)
    counts = (await client.gate_counts([partition_id])).get(partition_id, {})
    timeline = await client.partition_timeline(partition_id)
    items = await client.items(partition_id, status=item_status, gate=gate_number,
                               limit=ITEMS_PAGE, after=after, with_data=False)
    failed: list[Any] = []
    waiting: list[Any] = []
    waits = (await client.waits_summary([partition_id])).get(partition_id)
    now = await client.now()
    row = pages.partition_row(info, counts, now, all_gates=True, waits=waits)
    if row.counts.get("failed") and item_status is None and gate_number is None:
        failed = list(await client.items(partition_id, status="failed",
                                         limit=FAILED_PREVIEW, with_data=False))
    if row.counts.get("waiting") and item_status is None and gate_number is None:
        waiting = [leases_view.waiting_row(item, now) for item in await client.items(
            partition_id, status="waiting", limit=WAITING_PREVIEW, with_data=False)]
    return {
        "row": row, "info": info, "items": items, "failed": failed, "waiting": waiting,
        "chart": timeline_view.throughput_chart(timeline, now),
        "gate_times": timeline_view.gate_times(timeline, now),
        "rewinds": timeline_view.rewinds(timeline, now),
        "eta": timeline_view.eta_of(info, counts, timeline, now, row.parked),
        "item_status": item_status or "", "gate": "" if gate_number is None else gate_number,
        "after": after or "", "next_cursor": items.next_cursor,
        "item_statuses": ITEM_STATUSES,
        "known_gates": sorted({*counts, info.gate, *info.reduce_gates}),
        "result": None if info.result is None else pages.result_preview(info.result),
        "error_summary": pages.error_summary,
        "item_error_summary": pages.item_error_summary,
        # retry_failed re-opens a stopped partition (at its lowest failed gate), or
        # re-runs a running one's failed items at or after its gate (those before it
        # stay: its gate does not move back under its holder).
        "can_retry": info.status in ("failed", "cancelled") or any(
            by_status.get("failed") for at, by_status in counts.items()
            if info.status == "complete" or at >= info.gate),
        "can_cancel": info.status in ("available", "failed"),
        "paused_for": texts.age_text(info.paused_at, now),
    }


def whole_number(text: str | None, name: str, default: int, low: int, high: int) -> int:
    """``text`` as a whole number from ``low`` to ``high`` (``default`` when empty).

    Raises:
        BadRequest: it is not one.
    """
    if text in (None, ""):
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadRequest(f"{name} must be a whole number, got {text!r:.40}") from None
    if not low <= value <= high:
        raise BadRequest(f"{name} must be from {low} to {high}, got {value}")
    return value
