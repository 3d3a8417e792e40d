"""A lease this watcher holds on one partition: its version, gate and timeline, and
the events that tell its supervisor it ended; and what several leases share (their
locks, held in turn, and the progress their timelines carry).

:class:`watcher.leasing.keeper.LeaseKeeper` takes, renews and releases these.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field

from watcher.records import ItemWrite, PartitionSettings
from watcher.rules.decisions import completed_in_place
from watcher.rules.timeline import DoneTally, Progress


@dataclass(eq=False)
class Lease:
    """A lease this watcher holds on one partition.

    ``version`` and ``gate`` track the partition row; ``lock`` serialises the
    watcher's own writes on it so they never conflict with each other.
    ``settings`` are what the partition fixed at creation (its reduce gates and
    failed-item policy).
    """

    partition_id: str
    version: int
    gate: int
    renewed_at: float = field(default_factory=time.monotonic)
    settings: PartitionSettings = field(default_factory=PartitionSettings)
    lost: bool = False
    closed: bool = False
    notified: bool = False  # a client wrote the partition: look again now
    # Being handed over to a processor that asked (watcher.leasing.handover): no new call.
    handing_over: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    # Set once the lease ends (lost, stopped by a client, or closed): a long call
    # made under it can be abandoned.
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    # The partition's timeline as stored (``timeline_known``: read since the lease was
    # taken), and the items done since it was last written (:mod:`watcher.rules.timeline`).
    timeline: str | None = None
    timeline_known: bool = False
    done: DoneTally = field(default_factory=DoneTally)
    # Whether the drained gate may try to close the partition before reading its summary
    # (:mod:`watcher.store.sql.closing`): every result written at this gate completed
    # its item in place (none moved on, failed, waits for a retry or spawned), and no
    # such try was refused under this lease.
    completed_in_place: bool = True
    close_refused: bool = False

    @property
    def may_close_at_once(self) -> bool:
        """Whether the drained gate tries its close before reading its summary."""
        return self.completed_in_place and not self.close_refused and self.timeline_known

    def progress(self, now: float) -> Progress:
        """The items done since the timeline was last written, at the current gate."""
        return Progress(self.gate, self.done.items, self.done.age(now))

    def timeline_read(self, timeline: str | None) -> None:
        """The stored timeline is ``timeline`` (read, not written: the items done since
        the last write are still to write)."""
        self.timeline = timeline
        self.timeline_known = True

    def timeline_written(self, timeline: str | None, progress: Progress) -> None:
        """The stored timeline is ``timeline`` now, with ``progress`` counted in it."""
        self.timeline = timeline
        self.timeline_known = True
        self.done.written(progress.items)

    def results_written(self, writes: Sequence[ItemWrite],
                        outcomes: Sequence[bool | BaseException]) -> None:
        """The writer's outcomes for a batch of this lease's results: unless each
        completed its item in place (:func:`~watcher.rules.decisions.completed_in_place`),
        the drained gate reads its summary before it closes."""
        if not completed_in_place(writes, outcomes, self.gate):
            self.completed_in_place = False

    def adopt(self, version: int, gate: int | None) -> None:
        """Take a newer version (and gate) read from the database as our own.

        A gate that moved (a client set it) wakes the supervisor.
        """
        self.version = version
        if gate is not None and gate != self.gate:
            self.gate = gate
            self.completed_in_place = True
            self.wake.set()

    def renewed(self, version: int, gate: int | None, at: float) -> None:
        """The lease was extended (or taken again) at ``at`` (``time.monotonic()``)."""
        self.adopt(version, gate)
        self.renewed_at = at

    def wrote(self, version: int, gate: int | None = None) -> None:
        """This watcher's own guarded write of the partition went through.

        The row is at ``version`` now, and at ``gate`` when the write moved it.
        """
        self.version = version
        if gate is not None and gate != self.gate:
            self.gate = gate
            self.completed_in_place = True

    def notify(self) -> None:
        """A client wrote the partition: its supervisor reads again at once."""
        self.notified = True
        self.wake.set()

    def read_started(self) -> None:
        """A read of ready items begins: it sees every client write notified so far."""
        self.notified = False

    def mark_lost(self) -> bool:
        """Record that another watcher holds the partition now (or it is gone).

        Wakes the supervisor so it stops. Returns ``False`` when it was lost already.
        """
        if self.lost:
            return False
        self.lost = True
        self.wake.set()
        self.ended.set()
        return True

    def mark_closed(self) -> None:
        """Record that the partition closed; closing released the lease."""
        self.closed = True
        self.ended.set()


@contextlib.asynccontextmanager
async def locked(leases: Iterable[Lease]) -> AsyncIterator[None]:
    """Hold the locks of ``leases``; every lock taken is released, even on cancellation."""
    held: list[asyncio.Lock] = []
    try:
        for lease in leases:
            await lease.lock.acquire()
            held.append(lease.lock)
        yield
    finally:
        for lock in held:
            lock.release()


def progress_of(leases: Iterable[Lease], now: float, *,
                after: float = 0.0) -> dict[str, Progress]:
    """What a renewal (or release) of ``leases`` carries into their timelines: the items
    done since the last write, and an empty progress for those whose stored timeline
    this holder has not read yet (the renewal reads it).

    With ``after`` (seconds), a lease's items wait until the first of them is that old:
    a renewal then writes a busy partition's timeline every few renewals, not at each
    (its gate moves, its close and a release write every count at once)."""
    return {lease.partition_id: lease.progress(now) for lease in leases
            if not lease.timeline_known
            or (lease.done.items and lease.done.age(now) >= after)}


def known_timelines(leases: Iterable[Lease]) -> dict[str, str | None]:
    """The holder's copy of each timeline it knows, by partition: what a renewal adds
    progress to, and writes only where it is still what is stored."""
    return {lease.partition_id: lease.timeline for lease in leases if lease.timeline_known}


def handed_over_progress(leases: Iterable[Lease], now: float) -> dict[str, Progress]:
    """The progress lost ``leases`` hand over, by partition: a partition lost twice
    (taken back meanwhile) hands over both counts, at the later lease's gate and from
    the earlier first item."""
    handed: dict[str, Progress] = {}
    for lease in leases:
        done = lease.progress(now)
        before = handed.get(lease.partition_id)
        if before is not None:
            done = Progress(done.gate, before.items + done.items, max(before.age, done.age))
        handed[lease.partition_id] = done
    return handed
