"""Priority with aging: where a partition stands in the lease queue.

A partition's place is a time, ``rank_at``: when it may start (its creation, or its
``start_at``) less its priority times :data:`AGING_STEP`. Free partitions are leased
in ``rank_at`` order, so each step of priority counts as having waited
:data:`AGING_STEP` longer. That is aging with a static key: nothing is rewritten as
time passes, the order is an index walk, and the bound is plain arithmetic.

**The starvation bound.** A partition of priority ``p`` that becomes free at time
``t`` is leased before any partition that becomes free after
``t + (q - p) * AGING_STEP`` with a priority ``q`` above it. So under a continuous
stream of priority-10 work, a priority-0 partition waits at most
``10 * AGING_STEP`` (5 minutes) plus the time the work ranked ahead of it takes
to lease, and at the default priority of 0 both orders are plain first come,
first served.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

MIN_PRIORITY = -10
MAX_PRIORITY = 10
DEFAULT_PRIORITY = 0
# What one step of priority is worth in waiting time.
AGING_STEP = timedelta(seconds=30)
# Turns at a processor's freed slots go by lease-queue place in steps this long, and
# to the partition that has waited longest within a step: partitions created together
# take turns as they always did (each finds its items ready, so reads stay full), while
# a higher priority (30 s a step) still goes first. (Keys share turns before this
# order applies: watcher.flow.slots.SlotPool.)
TURN_STEP_SECONDS = 10.0


def priority_problem(priority: object) -> str | None:
    """Why ``priority`` is not a partition priority, or ``None`` when it is: a whole
    number from :data:`MIN_PRIORITY` to :data:`MAX_PRIORITY`."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        return (f"priority must be a whole number from {MIN_PRIORITY} to {MAX_PRIORITY}, "
                f"got {priority!r}")
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        return (f"priority must be from {MIN_PRIORITY} (last) to {MAX_PRIORITY} (first), "
                f"got {priority}")
    return None


def head_start(priority: int) -> timedelta:
    """How much earlier than its start a partition of ``priority`` ranks."""
    return AGING_STEP * priority


def rank_at(start: datetime, priority: int) -> datetime:
    """The lease-queue place of a partition of ``priority`` that may start at ``start``."""
    return start - head_start(priority)


def starvation_bound(low: int, high: int) -> timedelta:
    """The longest a partition of priority ``low`` is passed over by partitions of
    priority ``high`` that keep arriving (beyond the leasing of what ranked ahead)."""
    return AGING_STEP * max(high - low, 0)


def turn_order(rank: datetime) -> float:
    """A partition's place in the turns at freed slots: its lease-queue place (aware),
    in steps of :data:`TURN_STEP_SECONDS` (ties go to the longest waiting)."""
    return math.floor(rank.timestamp() / TURN_STEP_SECONDS) * TURN_STEP_SECONDS
