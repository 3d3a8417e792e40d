"""Where a partition stands, as the test kit judges it between polls: pure functions
over a snapshot (the partition and its items, read without their data) and the kit's
clock.

A partition is *idle* when nothing can happen to it until the clock moves or a
completion comes: every open item at its gate waits for a completion (its deadline
ahead) or for a delay to end (a retry's backoff, a snooze, a ``not_before``: its
``retry_at`` ahead), or the partition itself is not to start yet. Then the kit stops
driving it, or moves the clock to the end of the earliest delay when no wait's
deadline comes first (waits are the test's to time out: :meth:`HandlerKit.advance`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from watcher.records import ItemInfo, PartitionInfo

ENDED = frozenset({"complete", "failed", "cancelled"})
OPEN = frozenset({"available", "waiting"})


@dataclass(frozen=True)
class Snapshot:
    """A partition and its items (``data`` left unread), read at one poll."""

    partition: PartitionInfo
    items: tuple[ItemInfo, ...]

    @property
    def ended(self) -> bool:
        return self.partition.status in ENDED

    def at_gate(self) -> list[ItemInfo]:
        """The open items (available or waiting) at the partition's gate."""
        return [item for item in self.items
                if item.gate == self.partition.gate and item.status in OPEN]


@dataclass(frozen=True)
class Idle:
    """Nothing happens to the partition until the clock moves or a completion comes.

    ``waiting``: its parked items; ``next_due``: when the earliest delay ends (an item's
    backoff, snooze or ``not_before``, or the partition's start), ``None`` when none
    does; ``skippable``: that delay ends before any wait's deadline, so moving the
    clock there times no wait out."""

    waiting: tuple[ItemInfo, ...]
    next_due: datetime | None
    skippable: bool


def idle(snapshot: Snapshot, now: datetime) -> Idle | None:
    """Whether ``snapshot`` is idle at ``now`` (the kit's clock), and until when; ``None``
    when the engine has something to do (an item due, a deadline passed, a gate to
    step, a reduce), or the partition has ended."""
    partition = snapshot.partition
    if snapshot.ended:
        return None
    if partition.paused_at is not None:
        return Idle((), None, skippable=False)
    open_items = snapshot.at_gate()
    waiting = tuple(item for item in open_items if item.status == "waiting")
    delayed = [item.retry_at for item in open_items
               if item.status == "available" and item.retry_at is not None
               and item.retry_at > now]
    due = len(open_items) - len(waiting) - len(delayed)
    if any(item.retry_at is None or item.retry_at <= now for item in waiting):
        return None  # a deadline has passed: the engine times the wait out
    if due or not open_items:
        # Due work, or a gate to step; unless the partition is not to start yet
        # (``start_at``: an unleased partition's ``until``, when nothing waits).
        if partition.owner == "" and partition.until > now and not waiting:
            return Idle((), partition.until, skippable=True)
        return None
    next_due = min(delayed) if delayed else None
    deadlines = [item.retry_at for item in waiting if item.retry_at is not None]
    skippable = next_due is not None and (not deadlines or next_due < min(deadlines))
    return Idle(waiting, next_due, skippable)


def _when(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "no time"
    seconds = (moment - now).total_seconds()
    ahead = (f"in {seconds / 86400:g} days" if abs(seconds) >= 86400
             else f"in {seconds:g} s")
    return f"{moment.isoformat(sep=' ')} ({ahead})"


def describe(snapshot: Snapshot, now: datetime) -> str:
    """Where the partition stopped, for an error: status, gate, counts, the items that
    hold the gate (waiting, delayed, due) and the last errors."""
    partition = snapshot.partition
    counts = ", ".join(f"{count} {status}" for status, count in sorted(
        partition.counts.items()) if count)
    parts = [f"partition {partition.id!r} is {partition.status} at gate {partition.gate} "
             f"({counts or 'no items'}; clock {now.isoformat(sep=' ')})"]
    if partition.paused_at is not None:
        parts.append("it is paused")
    for item in snapshot.at_gate():
        if item.status == "waiting":
            parts.append(f"item {item.id!r} waits for a completion, deadline "
                         f"{_when(item.retry_at, now)}")
        elif item.retry_at is not None and item.retry_at > now:
            parts.append(f"item {item.id!r} is delayed until {_when(item.retry_at, now)}")
        else:
            parts.append(f"item {item.id!r} is due (attempts {item.attempts})")
    if partition.last_error:
        parts.append(f"last reduce error: {partition.last_error}")
    for item in snapshot.items:
        if item.last_error:
            parts.append(f"item {item.id!r} last error: {item.last_error}")
    return "; ".join(parts)
