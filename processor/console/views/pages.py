"""What the console's pages show, as plain values: per-gate progress, partition rows
(with their leases and parked items: :mod:`processor.console.views.leases_view`), the
throughput chart, result previews and notices.

Pure functions over the records (:class:`~watcher.records.PartitionInfo`,
:class:`~watcher.reports.Throughput`, per-gate counts); no I/O, no HTML. The
templates turn these values into markup, and Jinja2 escapes every text they hold.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from processor.console.views.leases_view import Lease, Parked, lease_of, parked_of
from processor.console.views.texts import age_text
from processor.views import error_after_context, retry_text, step_text
from watcher.models import Status
from watcher.records import ItemInfo, PartitionInfo
from watcher.reports import RetryReport, Throughput, WaitSummary

PARTITION_STATUS_NAMES = frozenset(status.value for status in Status)

# Gates up to this one are all shown (0, 1, 2, ...), passed ones included; a partition
# with a higher gate shows only the gates its items, its reduce gates and it are at.
DENSE_GATES = 16
# Gates a row of the partitions list shows; the partition page shows them all.
LIST_GATES = 8
# How much of a result the partition page shows (``processor result`` prints all).
RESULT_PREVIEW_CHARS = 20_000
# How much of an error a table cell shows before the rest folds away.
ERROR_SUMMARY_CHARS = 160

FINISHED = ("complete", "failed", "cancelled")


@dataclass(frozen=True, slots=True)
class GateProgress:
    """How far one gate of a partition has come.

    ``done`` items have passed the gate (they are at a later gate, or complete);
    ``waiting`` are available at it (ready for a processor); ``parked`` wait at it for
    a completion (status ``waiting``: no processor calls them until one comes or the
    wait's deadline passes); ``failed`` failed at it or at a gate before (they will not
    pass it); ``not_reached`` are still available or parked at an earlier gate.
    ``state`` is ``passed``, ``current`` or ``ahead`` (for the partition's gate:
    ``failed`` or ``cancelled`` when the partition stopped there, ``complete``
    when it ended there).
    """

    gate: int
    reduce: bool
    state: str
    done: int
    waiting: int
    failed: int
    not_reached: int
    parked: int = 0

    @property
    def total(self) -> int:
        """Every item of the partition: the five parts add up to it."""
        return self.done + self.waiting + self.parked + self.failed + self.not_reached

    def percent(self, part: str) -> float:
        """The share of ``part`` (``done``, ``waiting``, ``parked``, ``failed``,
        ``not_reached``) in percent, 0 for a partition without items."""
        total = self.total
        return 0.0 if total == 0 else round(100.0 * getattr(self, part) / total, 2)

    @property
    def segments(self) -> list[tuple[str, float, float]]:
        """The bar's coloured parts, ``(part, start, width)`` in percent, in the order
        done, failed, waiting, parked (the rest of the bar is what has not reached the
        gate)."""
        start = 0.0
        parts = []
        for part in ("done", "failed", "waiting", "parked"):
            width = self.percent(part)
            parts.append((part, round(start, 2), width))
            start += width
        return parts

    @property
    def summary(self) -> str:
        """``"34/36 done, 2 failed"``: the parts that are not zero."""
        text = f"{self.done}/{self.total} done"
        for part, label in (("waiting", "waiting"), ("parked", "parked"),
                            ("failed", "failed"), ("not_reached", "not reached")):
            if getattr(self, part):
                text += f", {getattr(self, part)} {label}"
        return text


def shown_gates(gate: int, reduce_gates: tuple[int, ...], counts: dict[int, dict[str, int]]
                ) -> list[int]:
    """The gates to show for a partition at ``gate``: every gate from 0 while they are
    few, otherwise those where an item is, the reduce gates and the partition's own."""
    known = {gate, *reduce_gates, *counts}
    highest = max(known)
    return list(range(highest + 1)) if highest < DENSE_GATES else sorted(known)


def gate_progress(info: PartitionInfo, counts: dict[int, dict[str, int]],
                  gates: Sequence[int] | None = None) -> list[GateProgress]:
    """The progress of each of ``gates`` of ``info`` (by default the shown ones:
    :func:`shown_gates`), from its items counted per gate and status (``counts``, as
    :meth:`AsyncClient.gate_counts` returns them).

    One pass over the counted gates in order, whatever the number of gates asked for:
    a partition with thousands of gates costs thousands of steps, not their square.
    """
    wanted = (shown_gates(info.gate, info.reduce_gates, counts) if gates is None
              else sorted(gates))
    counted = sorted(counts)
    complete = sum(by_status.get("complete", 0) for by_status in counts.values())
    # Items still open (available, parked or failed) at any gate: those beyond a gate
    # are "done" with it, as they passed it.
    still_open = sum(_open_here(by_status) for by_status in counts.values())
    reduce_gates = set(info.reduce_gates)
    rows: list[GateProgress] = []
    # Running sums over the counted gates below the one at hand.
    below = failed_below = unfinished_below = 0
    for gate in wanted:
        while below < len(counted) and counted[below] < gate:
            by_status = counts[counted[below]]
            failed_below += by_status.get("failed", 0)
            unfinished_below += by_status.get("available", 0) + by_status.get("waiting", 0)
            below += 1
        here = counts.get(gate, {})
        available, failed = here.get("available", 0), here.get("failed", 0)
        parked = here.get("waiting", 0)
        # Open items at this gate or below: the failed and unfinished ones below, and
        # this gate's own.
        later = still_open - failed_below - unfinished_below - available - failed - parked
        rows.append(GateProgress(
            gate=gate, reduce=gate in reduce_gates, state=_gate_state(info, gate),
            done=complete + later, waiting=available, failed=failed_below + failed,
            not_reached=unfinished_below, parked=parked))
    return rows


def _open_here(by_status: Mapping[str, int]) -> int:
    """The items of one gate's counts that are not finished: available, parked, failed."""
    return (by_status.get("available", 0) + by_status.get("waiting", 0)
            + by_status.get("failed", 0))


def _gate_state(info: PartitionInfo, gate: int) -> str:
    if gate < info.gate:
        return "passed"
    if gate > info.gate:
        return "ahead"
    return {"available": "current", "deleting": "current"}.get(info.status, info.status)


def item_counts(counts: dict[int, dict[str, int]]) -> dict[str, int]:
    """Per-gate counts added up per status."""
    totals: dict[str, int] = {}
    for by_status in counts.values():
        for status, count in by_status.items():
            totals[status] = totals.get(status, 0) + count
    return totals


def list_window(gates: list[int], current: int) -> tuple[list[int], int]:
    """Of the (sorted) ``gates``, those a row of the partitions list shows: at most
    ``LIST_GATES``, kept around the partition's ``current`` gate; and how many it leaves
    out."""
    if len(gates) <= LIST_GATES:
        return gates, 0
    position = bisect.bisect_left(gates, current)
    if position == len(gates):
        position = 0
    start = max(0, min(position - LIST_GATES // 2, len(gates) - LIST_GATES))
    return gates[start:start + LIST_GATES], len(gates) - LIST_GATES


def list_gates(progress: list[GateProgress], current: int) -> tuple[list[GateProgress], int]:
    """The gates a row of the partitions list shows (at most ``LIST_GATES``, kept around
    the partition's ``current`` gate), and how many it leaves out."""
    shown, more = list_window([row.gate for row in progress], current)
    if not more:
        return progress, 0
    start = progress.index(next(row for row in progress if row.gate == shown[0]))
    return progress[start:start + len(shown)], more


def step_of(info: PartitionInfo) -> str:
    """What the partition does at its gate (``items``, ``reduce fold page 3``), or its
    final status."""
    return step_text(info) if info.status == "available" else info.status


@dataclass(frozen=True, slots=True)
class MinuteBar:
    """One minute of the throughput chart: partitions finished per final status, and
    the bar heights in percent of the busiest minute."""

    label: str
    counts: dict[str, int]
    heights: dict[str, float]

    @property
    def total(self) -> int:
        """Partitions finished in this minute."""
        return sum(self.counts.values())

    @property
    def stack(self) -> list[tuple[str, float, float]]:
        """The bar's parts from the bottom, ``(status, top, height)`` in percent of the
        chart's height (0 at the top), complete first."""
        bottom = 100.0
        parts = []
        for status in FINISHED:
            height = self.heights.get(status, 0.0)
            bottom -= height
            parts.append((status, round(bottom, 2), height))
        return parts


def throughput_bars(throughput: Throughput) -> list[MinuteBar]:
    """The throughput chart, oldest minute first: labels count minutes back from now."""
    minutes = throughput.minutes
    totals = [sum(throughput.finished.get(status, (0,) * minutes)[minute]
                  for status in FINISHED) for minute in range(minutes)]
    busiest = max(totals, default=0) or 1
    bars = []
    for minute in range(minutes):
        counts = {status: throughput.finished.get(status, (0,) * minutes)[minute]
                  for status in FINISHED}
        back = minutes - minute - 1
        bars.append(MinuteBar(
            label="now" if back == 0 else f"-{back} min", counts=counts,
            heights={status: round(100.0 * count / busiest, 2)
                     for status, count in counts.items()}))
    return bars


@dataclass(frozen=True, slots=True)
class ResultPreview:
    """A partition result as the page shows it: ``text`` (JSON indented, or the bytes
    decoded with replacement characters), whether it is JSON, its size in bytes, and
    whether the text was cut."""

    text: str
    is_json: bool
    size: int
    truncated: bool


def result_preview(result: bytes, limit: int = RESULT_PREVIEW_CHARS) -> ResultPreview:
    """How the partition page shows ``result``."""
    try:
        text = json.dumps(json.loads(result), indent=2, ensure_ascii=False)
        is_json = True
    except ValueError:
        text = result.decode("utf-8", errors="replace")
        is_json = False
    return ResultPreview(text[:limit], is_json, len(result), len(text) > limit)


def item_error_summary(item: ItemInfo, limit: int = ERROR_SUMMARY_CHARS) -> tuple[str, bool]:
    """:func:`error_summary` of an item's error without the context its row shows (see
    :func:`processor.views.error_after_context`); there is more to show when the
    context was left out."""
    shown = error_after_context(item)
    first, more = error_summary(shown, limit)
    return first, more or shown != item.last_error


def error_summary(error: str | None, limit: int = ERROR_SUMMARY_CHARS) -> tuple[str, bool]:
    """An error's first line cut to ``limit`` characters, and whether there is more of it
    to show (more lines or more characters)."""
    if not error:
        return "", False
    lines = error.strip().splitlines() or [""]
    first = lines[0]
    return first[:limit], len(lines) > 1 or len(first) > limit


# After an action the browser is sent back with one of these codes; the page says what
# happened in these words (and only these: the codes come from the address bar).
NOTICES = {
    "cancelled": "Cancelled: no processor dispatches its items any more. Retry resumes it.",
    "not-cancelled": "Nothing to cancel: the partition is {status} already.",
    "deleted": "Deleted partition {id} and its {count} item(s).",
    "paused": "Paused: its holder starts no new call from its next poll, and no processor "
              "leases it until it is resumed.",
    "not-paused": "Nothing to pause: the partition is paused already.",
    "resumed": "Resumed: processors lease it again within a lease cycle.",
    "not-resumed": "Nothing to resume: the partition is not paused.",
    "rewound": "Rewound: {count} item(s) back at its gate, what they had spawned there or "
               "later removed; every reduce from that gate on runs again.",
}


def retry_notice_params(report: RetryReport) -> dict[str, Any]:
    """The numbers of a retry's report, for the address the console sends the browser
    to after it (the page shows :func:`retry_notice` from them)."""
    return {"was": report.status_before, "from": report.gate_before, "gate": report.gate,
            "status": report.status, "count": report.items_reset, "rerun": report.items_rerun,
            "left": report.items_left_failed, "reduce": int(report.reduce_rearmed)}


def retry_notice(partition_id: str, params: Mapping[str, str]) -> str | None:
    """The sentence saying what a retry did, from :func:`retry_notice_params` in an
    address (``None`` when they are not such numbers: a hand-edited address)."""
    try:
        numbers = {name: int(params.get(name, "")) for name in
                   ("from", "gate", "count", "rerun", "left", "reduce")}
    except ValueError:
        return None
    was, status = params.get("was", ""), params.get("status", "")
    if was not in PARTITION_STATUS_NAMES or status not in PARTITION_STATUS_NAMES or min(
            numbers.values()) < 0:
        return None
    return "Retried: " + retry_text(RetryReport(
        partition_id, was, numbers["from"], status, numbers["gate"],
        items_reset=numbers["count"], items_rerun=numbers["rerun"],
        items_left_failed=numbers["left"], reduce_rearmed=bool(numbers["reduce"]))) + "."


def notice_text(code: str | None, **values: Any) -> str | None:
    """The sentence for notice ``code`` with ``values`` filled in, or ``None`` for an
    unknown code (a hand-edited address shows nothing)."""
    template = NOTICES.get(code or "")
    if template is None:
        return None
    try:
        return template.format(**values)
    except (KeyError, IndexError):
        return None


@dataclass(frozen=True, slots=True)
class PartitionRow:
    """One partition as the console lists it: the record, its progress per gate (the
    shown ones, and how many more), its lease, item totals and ages."""

    info: PartitionInfo
    gates: list[GateProgress]
    more_gates: int
    lease: Lease
    counts: dict[str, int]
    total: int
    age: str
    updated: str
    step: str
    parked: Parked | None = None


def partition_row(info: PartitionInfo, counts: dict[int, dict[str, int]], now: datetime, *,
                  all_gates: bool = False, waits: WaitSummary | None = None) -> PartitionRow:
    """The row (or, with ``all_gates``, the page header) of ``info``, from its items
    counted per gate and status and the summary of its parked items' waits, at ``now``
    by the database clock."""
    # A row works out only the gates it shows: a partition with thousands of gates costs
    # the list a pass over its counts, not a progress bar per gate.
    gates = shown_gates(info.gate, info.reduce_gates, counts)
    gates, more = (gates, 0) if all_gates else list_window(gates, info.gate)
    totals = item_counts(counts)
    parked = parked_of(info, counts, waits, now)
    return PartitionRow(info=info, gates=gate_progress(info, counts, gates), more_gates=more,
                        lease=lease_of(info, now, parked), parked=parked,
                        counts=totals, total=sum(totals.values()),
                        age=age_text(info.created_at, now), updated=age_text(info.updated_at, now),
                        step="parked" if parked is not None and parked.whole else step_of(info))
