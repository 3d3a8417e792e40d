"""What the partition page shows of a partition's timeline (:mod:`watcher.rules.timeline`):
items done per minute as a chart, the time spent at each gate, and an ETA.

Pure functions over the decoded timeline, the partition and its item counts per gate,
at ``now`` by the database clock; no I/O, no HTML.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from watcher.records import PartitionInfo
from watcher.rules.timeline import (
    MAX_MINUTES,
    RATE_MINUTES,
    Timeline,
    eta_seconds,
    items_per_second,
)

if TYPE_CHECKING:
    from processor.console.views.leases_view import Parked

UNKNOWN = "—"


def duration_text(seconds: float | None) -> str:
    """``"0.4 s"``, ``"42 s"``, ``"4 min 10 s"``, ``"2 h 5 min"``, ``"3 d 4 h"``; ``"—"``
    when unknown."""
    if seconds is None:
        return UNKNOWN
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    for size, unit, smaller, small_unit in ((86400, "d", 3600, "h"), (3600, "h", 60, "min"),
                                             (60, "min", 1, "s")):
        if whole >= size:
            rest = (whole % size) // smaller
            return f"{whole // size} {unit}" + (f" {rest} {small_unit}" if rest else "")
    return f"{whole} s"


def rate_text(rate: float | None) -> str:
    """Items per second as the page prints it: ``"12.5/s"``, ``"0.04/s"``; ``"—"``."""
    if rate is None:
        return UNKNOWN
    return f"{rate:,.1f}/s" if rate >= 1 else f"{rate:.2g}/s"


@dataclass(frozen=True, slots=True)
class MinuteColumn:
    """One minute of the chart: its label, the items done in it, and its bar's height
    in percent of the busiest minute."""

    label: str
    items: int
    height: float


@dataclass(frozen=True, slots=True)
class ThroughputChart:
    """Items done per minute over the last ``len(columns)`` minutes, oldest first."""

    columns: list[MinuteColumn]
    peak: int
    total: int


def throughput_chart(timeline: Timeline, now: datetime,
                     minutes: int = MAX_MINUTES) -> ThroughputChart:
    """The chart of the last ``minutes`` minutes up to ``now``'s (a minute without
    items done is a column of height 0)."""
    this_minute = now.replace(second=0, microsecond=0)
    counts = dict(timeline.minutes)
    values = [counts.get(this_minute - timedelta(minutes=back), 0)
              for back in range(minutes - 1, -1, -1)]
    peak = max(values, default=0)
    columns = [MinuteColumn("now" if back == 0 else f"-{back} min", value,
                            round(100.0 * value / (peak or 1), 2))
               for back, value in zip(range(minutes - 1, -1, -1), values, strict=True)]
    return ThroughputChart(columns, peak, sum(values))


@dataclass(frozen=True, slots=True)
class GateTime:
    """One stay at a gate as the table shows it."""

    gate: int
    began: str
    took: str
    items: int
    rate: str
    current: bool


def gate_times(timeline: Timeline, now: datetime) -> list[GateTime]:
    """The gate stays, the latest first: when each began (how long ago), how long it
    took (so far, for the current one), its items and their rate over the stay."""
    rows = []
    for span in reversed(timeline.gates):
        seconds = span.seconds(now)
        rate = None if not seconds or not span.items else span.items / seconds
        began = UNKNOWN if span.began is None else \
            f"{duration_text((now - span.began).total_seconds())} ago"
        took = duration_text(seconds) + (" so far" if span.ended is None and seconds is not None
                                         else "")
        rows.append(GateTime(span.gate, began, took, span.items, rate_text(rate),
                             span.ended is None))
    return rows


@dataclass(frozen=True, slots=True)
class Eta:
    """The ETA as the page shows it: the time left (``"—"`` when unknown), what it
    covers, and the rate it was worked out from."""

    text: str
    covers: str
    rate: str


def eta_of(info: PartitionInfo, counts: dict[int, dict[str, int]], timeline: Timeline,
           now: datetime, parked: Parked | None = None) -> Eta:
    """The ETA of ``info``: the items ready at its gate over the items done per second
    in the last few minutes (:func:`watcher.rules.timeline.items_per_second`).

    It covers the current gate; the whole partition when no item waits at a later gate
    and no reduce gate lies ahead (items could still move on to a later gate). A
    partition whose unfinished items are all ``parked``
    (:func:`processor.console.views.leases_view.parked_of`) has no ETA: it goes on when its
    completions come, which no rate foretells; parked items beside ready ones are said
    to be left out.
    """
    if info.status != "available":
        return Eta(UNKNOWN, f"nothing: the partition is {info.status}", UNKNOWN)
    rate = items_per_second(timeline, now)
    rate_line = (f"{rate_text(rate)} over the last {RATE_MINUTES} min" if rate is not None
                 else f"no items done in the last {RATE_MINUTES} min")
    if parked is not None and parked.whole:
        return Eta("none while parked",
                   f"no ETA: it goes on as completions come; {parked.waiting_text}",
                   rate_line)
    gate = info.gate
    if gate in info.reduce_gates:
        return Eta(UNKNOWN, f"gate {gate} is a reduce gate: it has no per-item rate", UNKNOWN)
    remaining = counts.get(gate, {}).get("available", 0)
    later = any(at > gate and by_status.get("available", 0) for at, by_status in counts.items())
    covers = (f"the {remaining:,} item(s) waiting at gate {gate}" if later or any(
        reduce > gate for reduce in info.reduce_gates) else
        f"the whole partition: gate {gate} is its last gate with waiting items "
        f"({remaining:,})")
    if parked is not None:
        covers += f"; left out (no rate foretells a completion): {parked.waiting_text}"
    return Eta(duration_text(eta_seconds(remaining, rate)), covers, rate_line)


@dataclass(frozen=True, slots=True)
class RewindRow:
    """One rewind as the page lists it: how long ago, from which gate to which, the
    items sent back and the spawned items removed."""

    when: str
    from_gate: int
    to_gate: int
    items: int
    removed: int


def rewinds(timeline: Timeline, now: datetime) -> list[RewindRow]:
    """The rewinds the timeline keeps, the latest first."""
    return [RewindRow(f"{duration_text((now - mark.at).total_seconds())} ago",
                      mark.from_gate, mark.to_gate, mark.items, mark.removed)
            for mark in reversed(timeline.rewinds)]
