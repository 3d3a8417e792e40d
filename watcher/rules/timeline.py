"""A partition's timeline: when each gate began and ended, and items done per minute.

The lease holder keeps it in ``partitions.timeline`` (bounded JSON, times by the
database clock), written by statements it sends anyway: the gate moves and closes
(:meth:`~watcher.store.leases.LeasesStore.partition_transition`) and the lease
renewals (:meth:`~watcher.store.leases.LeasesStore.leases_renew`), from counts the
supervisor keeps in memory (:class:`DoneTally`). No item or batch costs a statement.

This module is the one place that reads and writes that JSON, and it holds the
estimates the console shows (items per second, an ETA). Pure functions, no I/O.

The stored shape (``v`` is its version; times are seconds since the epoch, UTC)::

    {"v": 1,
     "gates": [[gate, began or null, ended or null, items], ...],   # oldest first
     "minutes": [[minute, items], ...],                              # minute: epoch // 60
     "rewinds": [[at, from gate, to gate, items reset, items removed], ...]}  # optional

An item counts once, at the gate it leaves: when its result completes it, fails it
for good or moves it to another gate (a retry does not count).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

# The most gates a timeline keeps (the latest ones), and the minutes of items done.
MAX_GATES = 100
MAX_MINUTES = 60
# The most rewinds a timeline keeps (the latest ones).
MAX_REWINDS = 20
# How many recent minutes the rate behind an ETA counts.
RATE_MINUTES = 5
VERSION = 1
_EPOCH = datetime(1970, 1, 1)


@dataclass(frozen=True, slots=True)
class GateSpan:
    """One stay of the partition at ``gate``: when it began and ended (naive UTC by
    the database clock; ``None`` when not known, or, for ``ended``, not yet), and
    how many items left the gate meanwhile."""

    gate: int
    began: datetime | None
    ended: datetime | None
    items: int

    def seconds(self, now: datetime) -> float | None:
        """How long the stay lasted (up to ``now`` while it goes on); ``None`` unknown."""
        if self.began is None:
            return None
        return max(0.0, ((self.ended or now) - self.began).total_seconds())


@dataclass(frozen=True, slots=True)
class RewindMark:
    """An operator's rewind of the partition at ``at``: from ``from_gate`` back to
    ``to_gate``, with ``items`` sent back there and ``removed`` spawned items removed."""

    at: datetime
    from_gate: int
    to_gate: int
    items: int
    removed: int


@dataclass(frozen=True, slots=True)
class Timeline:
    """A decoded timeline: gate stays (oldest first), items done per minute
    (``(minute's start, items)``, oldest first) and rewinds (oldest first)."""

    gates: tuple[GateSpan, ...] = ()
    minutes: tuple[tuple[datetime, int], ...] = ()
    rewinds: tuple[RewindMark, ...] = ()


@dataclass(frozen=True, slots=True)
class Progress:
    """What a holder hands its store with a renewal: ``items`` that left ``gate``
    since the last write, the first of them ``age`` seconds before the write.
    ``items`` of 0 only asks for the stored timeline."""

    gate: int
    items: int
    age: float = 0.0


class DoneTally:
    """Items that left their gate since the holder last wrote the timeline, counted in
    memory as results are written (a few field updates per batch)."""

    __slots__ = ("first", "items")

    def __init__(self) -> None:
        self.items = 0
        self.first: float | None = None  # time.monotonic() of the first one counted

    def add(self, items: int, at: float) -> None:
        """Count ``items`` more, done at ``at`` (``time.monotonic()``)."""
        if items <= 0:
            return
        self.items += items
        self.first = at if self.first is None else min(self.first, at)

    def age(self, now: float) -> float:
        """Seconds from the first item counted to ``now`` (0 with none)."""
        return 0.0 if self.first is None else max(0.0, now - self.first)

    def written(self, items: int) -> None:
        """``items`` of those counted are in the stored timeline now."""
        self.items = max(0, self.items - items)
        if self.items == 0:
            self.first = None


# -- the stored JSON ------------------------------------------------------------------

def _seconds(moment: datetime | None) -> float | None:
    return None if moment is None else round((moment - _EPOCH).total_seconds(), 3)


def _moment(value: Any) -> datetime | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return _EPOCH + timedelta(seconds=value)


def decode_timeline(text: str | None) -> Timeline:
    """The timeline stored as ``text``; empty for ``None`` and for text it cannot read
    (a damaged or newer record is shown as unknown, never raised)."""
    if not text:
        return Timeline()
    try:
        record = json.loads(text)
        gates = tuple(GateSpan(int(gate), _moment(began), _moment(ended), int(items))
                      for gate, began, ended, items in record.get("gates", ()))
        minutes = tuple((_EPOCH + timedelta(minutes=int(minute)), int(items))
                        for minute, items in record.get("minutes", ()))
        rewinds = tuple(RewindMark(_EPOCH + timedelta(seconds=at), int(from_gate),
                                   int(to_gate), int(items), int(removed))
                        for at, from_gate, to_gate, items, removed
                        in record.get("rewinds", ()))
    except (ValueError, TypeError, AttributeError):
        return Timeline()
    return Timeline(gates, minutes, rewinds)


def encode_timeline(timeline: Timeline) -> str:
    """The JSON stored for ``timeline`` (compact: at most a few kilobytes)."""
    record = {
        "v": VERSION,
        "gates": [[span.gate, _seconds(span.began), _seconds(span.ended), span.items]
                  for span in timeline.gates],
        "minutes": [[int((minute - _EPOCH).total_seconds()) // 60, items]
                    for minute, items in timeline.minutes],
    }
    if timeline.rewinds:
        record["rewinds"] = [[_seconds(mark.at), mark.from_gate, mark.to_gate, mark.items,
                              mark.removed] for mark in timeline.rewinds]
    return json.dumps(record, separators=(",", ":"))


# -- writing --------------------------------------------------------------------------

def _minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def record_done(timeline: Timeline, now: datetime, progress: Progress) -> Timeline:
    """``timeline`` with ``progress`` added at ``now``: its items in ``now``'s minute and
    in the stay at its gate (begun ``progress.age`` seconds ago when none is open);
    older minutes than :data:`MAX_MINUTES` dropped."""
    minutes = list(timeline.minutes)
    if progress.items > 0:
        here = _minute(now)
        if minutes and minutes[-1][0] == here:
            minutes[-1] = (here, minutes[-1][1] + progress.items)
        else:
            minutes.append((here, progress.items))
    oldest = _minute(now) - timedelta(minutes=MAX_MINUTES - 1)
    minutes = [entry for entry in minutes if entry[0] >= oldest][-MAX_MINUTES:]
    gates = list(timeline.gates)
    if progress.items > 0:
        began = now - timedelta(seconds=max(0.0, progress.age))
        gates = _open(gates, progress.gate, began)
        gates[-1] = replace(gates[-1], items=gates[-1].items + progress.items)
    return Timeline(tuple(gates[-MAX_GATES:]), tuple(minutes), timeline.rewinds)


def record_handed_over(timeline: Timeline, now: datetime, progress: Progress) -> Timeline:
    """``timeline`` with ``progress`` that a former holder hands over after it lost the
    lease: its items in ``now``'s minute and in the latest stay at its gate, if the
    timeline has one. Unlike :func:`record_done` it never opens or ends a stay: the
    new holder may have moved the partition on meanwhile."""
    if progress.items <= 0:
        return timeline
    counted = record_done(Timeline((), timeline.minutes), now, progress)
    gates = list(timeline.gates)
    for n in range(len(gates) - 1, -1, -1):
        if gates[n].gate == progress.gate:
            gates[n] = replace(gates[n], items=gates[n].items + progress.items)
            break
    return Timeline(tuple(gates), counted.minutes, timeline.rewinds)


def _open(gates: list[GateSpan], gate: int, began: datetime) -> list[GateSpan]:
    """``gates`` ending with an open stay at ``gate``: the one open already, or a new
    one begun at ``began`` (any other open stay ends then: one gate at a time)."""
    if gates and gates[-1].gate == gate and gates[-1].ended is None:
        return gates
    closed = [replace(span, ended=began) if span.ended is None else span for span in gates]
    return [*closed, GateSpan(gate, began, None, 0)]


def record_move(timeline: Timeline, now: datetime, progress: Progress,
                to_gate: int | None) -> Timeline:
    """``timeline`` when the partition leaves ``progress.gate`` at ``now``, with
    ``progress`` counted first: that stay ends, and one at ``to_gate`` begins
    (``None``: the partition closed)."""
    recorded = record_done(timeline, now, progress)
    gates = list(recorded.gates)
    if not gates or gates[-1].gate != progress.gate or gates[-1].ended is not None:
        gates = _open(gates, progress.gate, now)
        gates[-1] = replace(gates[-1], began=None)  # it began before this holder saw it
    gates[-1] = replace(gates[-1], ended=now)
    if to_gate is not None:
        gates.append(GateSpan(to_gate, now, None, 0))
    return Timeline(tuple(gates[-MAX_GATES:]), recorded.minutes, timeline.rewinds)


def record_rewind(timeline: Timeline, now: datetime, mark: RewindMark) -> Timeline:
    """``timeline`` when an operator rewinds the partition at ``now`` (``mark.at``): any
    open stay ends, one at ``mark.to_gate`` begins, and the rewind is kept (the
    latest :data:`MAX_REWINDS`)."""
    gates = [replace(span, ended=now) if span.ended is None else span
             for span in timeline.gates]
    gates.append(GateSpan(mark.to_gate, now, None, 0))
    return Timeline(tuple(gates[-MAX_GATES:]), timeline.minutes,
                    (*timeline.rewinds, mark)[-MAX_REWINDS:])


# -- reading --------------------------------------------------------------------------

def items_per_second(timeline: Timeline, now: datetime, *,
                     minutes: int = RATE_MINUTES) -> float | None:
    """Items done per second over the last ``minutes`` minutes up to ``now`` (from the
    window's start, or from when the first stay began if that is later); ``None``
    when none were done in that window."""
    start = _minute(now) - timedelta(minutes=minutes - 1)
    done = sum(items for minute, items in timeline.minutes if minute >= start)
    if done == 0:
        return None
    counted = [minute for minute, items in timeline.minutes if minute >= start and items]
    since = max(start, min(counted))
    began = [span.began for span in timeline.gates if span.began is not None]
    if began:  # a partition younger than the window: count from when work began
        since = max(since, min(began))
    seconds = max((now - since).total_seconds(), 1.0)
    return done / seconds


def eta_seconds(remaining: int, rate: float | None) -> float | None:
    """Seconds until ``remaining`` items are done at ``rate`` items per second; ``None``
    when the rate is unknown or zero (0 with nothing remaining)."""
    if remaining <= 0:
        return 0.0
    if rate is None or rate <= 0:
        return None
    return remaining / rate
