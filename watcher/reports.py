"""What operator verbs and gauges report: deletions, purges, retries, the backlog,
throughput, flow controls, pipelines, and the live processors with the places they
serve. Plain values, no behaviour beyond a summary."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from watcher.pipelines import ServedRoute


@dataclass(frozen=True, slots=True)
class DeleteBatch:
    """One batch of a partition's deletion, written in one transaction.

    ``items`` were deleted; ``done`` says the partition row went with them (the
    partition is gone); ``skipped`` says the partition no longer qualified (gone
    already, re-opened, or not being deleted) and nothing was written.
    """

    items: int
    done: bool
    skipped: bool = False


@dataclass(frozen=True, slots=True)
class PurgeReport:
    """What a purge removed (or, for a dry run, would remove).

    ``stopped`` says it ended early because it was asked to (it lost the
    retention lease, or is shutting down); what remains goes in the next run.
    """

    partitions: int = 0
    items: int = 0
    stopped: bool = False
    # Complete items deleted from open partitions (item retention); ``items``
    # counts those of the partitions removed whole.
    finished_items: int = 0


@dataclass(frozen=True, slots=True)
class RetryReport:
    """What ``retry_failed`` did to one partition.

    ``items_reset`` failed items went back to available (attempts reset);
    ``items_rerun`` items a finished reduce had completed went back to available at
    their reduce gate, so that reduce runs again over them and the retried ones;
    ``items_left_failed`` failed items below the gate of a running partition were
    left as they are (nothing dispatches below its gate; retry again once it
    has stopped). ``reduce_rearmed`` says a failed reduce's count and error were
    cleared (it runs again, from its stored page when the gate did not move).
    The partition went from ``status_before`` at ``gate_before`` to ``status``
    at ``gate``. A report is true (``bool``) when the retry changed anything.
    """

    partition_id: str
    status_before: str
    gate_before: int
    status: str
    gate: int
    items_reset: int = 0
    items_rerun: int = 0
    items_left_failed: int = 0
    reduce_rearmed: bool = False

    @property
    def reopened(self) -> bool:
        """Whether the retry re-opened a complete, failed or cancelled partition."""
        return self.status_before != self.status

    def __bool__(self) -> bool:
        return bool(self.reopened or self.items_reset or self.items_rerun
                    or self.reduce_rearmed)


@dataclass(frozen=True, slots=True)
class RewindReport:
    """What ``rewind`` did to one partition: it went from ``status_before`` at
    ``gate_before`` (version ``version_before``) to ``available`` at ``gate``.

    ``items_reset`` items went back to the gate (available, attempts reset);
    ``items_removed`` items they had spawned at the gate or later, or a reduce at the
    gate or later had spawned, were removed, with their descendants; ``items_rerun``
    items a reduce had completed at its gate went back to available there, so that
    reduce runs again over its whole gate (only when some items were chosen, not
    all); ``reduces_again`` are the reduce gates that run again (the result was
    cleared when there is one).
    """

    partition_id: str
    status_before: str
    gate_before: int
    version_before: int
    gate: int
    items_reset: int = 0
    items_removed: int = 0
    items_rerun: int = 0
    reduces_again: tuple[int, ...] = ()
    result_cleared: bool = False

    @property
    def reopened(self) -> bool:
        """Whether the rewind re-opened a complete, failed or cancelled partition."""
        return self.status_before != "available"


@dataclass(frozen=True, slots=True)
class Backlog:
    """What is waiting, for an autoscaler: partitions per status, and available items at
    their open partition's current gate. Each count stops at the cap it was read with.

    ``oldest_waiting`` is how many seconds the oldest of those items has been ready to
    run (since it was created, reached its gate or its retry delay ended), by the
    database clock; 0.0 when none is ready.
    """

    partitions: dict[str, int]
    items_waiting: int
    oldest_waiting: float = 0.0
    # Items parked (status ``waiting``) in open partitions, and how many seconds the
    # longest-parked of them has waited for its completion (0.0 when none is parked).
    items_parked: int = 0
    oldest_parked: float = 0.0


@dataclass(frozen=True, slots=True)
class WaitSummary:
    """A partition's parked items (status ``waiting``): how many per gate, how many
    seconds the longest-parked has waited (by the database clock), and the earliest
    deadline among them. Never a token."""

    by_gate: dict[int, int]
    oldest_seconds: float
    next_deadline: datetime | None


@dataclass(frozen=True, slots=True)
class Throughput:
    """Partitions finished per minute over the last ``minutes`` minutes, by the database
    clock: ``finished`` maps each final status (complete, failed, cancelled) to one count
    per minute, the oldest first and the minute up to now last. Each count stops at the
    cap it was read with."""

    minutes: int
    finished: dict[str, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class FlowControlInfo:
    """A key's, a handler's or the fleet's flow controls as an operator sees them:
    limits set (``None``: the processors' defaults), and when it was paused, or is
    blocked until after a handler's ``Retry-After`` (naive UTC; ``None``: not)."""

    scope: str
    name: str
    max_inflight: int | None
    rate_limit: float | None
    paused_at: datetime | None
    blocked_until: datetime | None


@dataclass(frozen=True, slots=True)
class PipelineMove:
    """What moving a partition to a pipeline version did: its pipeline, the version it
    had (``None``: none pinned), the one it has now, and its partition version after."""

    partition_id: str
    pipeline: str
    before: str | None
    after: str
    version: int
    released: bool  # a processor held it: its lease ended, to be taken again at once


@dataclass(frozen=True, slots=True)
class PipelineCount:
    """Open partitions of one pipeline at one version (``None``: not pinned yet), and how
    many of them a processor holds now."""

    pipeline: str
    version: str | None
    open: int
    leased: int


@dataclass(frozen=True, slots=True)
class PlaceCount:
    """Open partitions at one place: a pipeline, the version pinned on them (``None``: not
    pinned yet) and the gate they are at."""

    pipeline: str
    version: str | None
    gate: int
    partitions: int


@dataclass(frozen=True, slots=True)
class ProcessorInfo:
    """A live processor (one whose row's ``until`` has not passed by the database clock)
    and what it serves: the tables of routes (:class:`watcher.pipelines.ServedRoute`)
    it serves (``--handler-url`` alone: the ``default`` pipeline's, every version and
    gate), or ``None`` for every place (a library watcher without ``pipelines``).
    ``until`` is when its row stops counting unless it writes it again; ``updated_at``
    when it last did."""

    owner: str
    serves: tuple[ServedRoute, ...] | None
    until: datetime
    updated_at: datetime
