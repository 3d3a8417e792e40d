"""Fair queuing across concurrency keys: where a keyed partition enters the lease queue.

The lease queue is ordered by ``rank_at`` (:mod:`watcher.rules.priority`). An unkeyed
partition starts at its creation time. A keyed one starts at its key's *virtual
clock*: the later of the key's clock and now; each partition of the key then moves
the clock on by :data:`FAIR_SPACING`. So a key that creates 10,000 partitions at
once spreads them over 10,000 spacings of virtual time, and a key that creates
one a moment later starts at about "now": it is interleaved near the front,
behind only the burst partitions whose virtual start is earlier, and is leased in
the next lease scan rather than after the whole burst. This is start-time fair
queuing with a static tag per partition: nothing is rewritten as time passes, and
the scan stays one walk of an index.

A scheduled partition (``start_at``) starts at its time and leaves its key's
clock alone: it takes no share before it may run.
"""

from __future__ import annotations

from datetime import datetime, timedelta

# Virtual time one partition of a key takes: the gap between consecutive
# partitions of one key in the lease queue. Fleets lease many partitions a
# second, so a new key's first partition, started at "now", ranks ahead of a busy
# key's backlog.
FAIR_SPACING = timedelta(seconds=1)


def started_at(next_start: datetime) -> datetime:
    """The virtual start of the partition that moved its key's clock to ``next_start``
    (the clock moves one :data:`FAIR_SPACING` past the start it hands out: to the
    later of its old value and now, plus the spacing)."""
    return next_start - FAIR_SPACING
