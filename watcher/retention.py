"""Removing partitions in bounded batches: one partition (delete), finished ones past a
cutoff (purge), and retention, which purges in the background on one processor at a time.

Every batch is a transaction of its own (:meth:`Store.partition_delete_batch`):
the partition row is marked ``deleting`` (so nothing re-opens it), up to a
batch of its items goes, and the row goes with the last batch. No lock is held
for long and no transaction grows with a partition, and a delete cut short
(a crash, a lost retention lease) leaves a ``deleting`` partition that the
next purge or delete finishes.

:class:`Retention` is the background duty: each processor that has it tries
to take the ``retention`` leader lease (:meth:`Store.leader_take`, by the
database clock) once per interval, and only the holder purges; it renews the
lease between batches and stops when it cannot. ``run_once()`` does one pass;
``run()`` only waits, repeats and stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass

from sqlalchemy.exc import SQLAlchemyError

from watcher.errors import ConfigError
from watcher.models import Status
from watcher.outages import OutageLatch
from watcher.reports import PurgeReport
from watcher.rules.checks import check_seconds, check_whole_number
from watcher.rules.durations import format_duration
from watcher.store import Store

log = logging.getLogger(__name__)

# Items deleted per transaction.
DEFAULT_BATCH = 1000
MAX_BATCH = 100_000
# Candidate partitions read per query.
PURGE_READ = 100
# Open partitions item retention reads per query.
OPEN_READ = 100
# What retention and purge remove unless told otherwise: failed partitions are
# kept for someone to look at.
DEFAULT_STATUSES = (Status.COMPLETE.value, Status.CANCELLED.value)
# What a purge may be asked to remove: finished partitions only.
PURGEABLE_STATUSES = (Status.COMPLETE.value, Status.FAILED.value, Status.CANCELLED.value)
DEFAULT_INTERVAL = 60.0
DEFAULT_HOLD = 30.0
RETENTION_DUTY = "retention"

KeepGoing = Callable[[], Awaitable[bool]]


def check_statuses(setting: str, statuses: object) -> tuple[str, ...]:
    """``statuses`` as a tuple if it names finished statuses only, at least one.

    Raises:
        ConfigError: a status is not complete, failed or cancelled, or none is given.
    """
    if isinstance(statuses, str):
        statuses = [part.strip() for part in statuses.split(",") if part.strip()]
    if not isinstance(statuses, Collection) or not statuses:
        raise ConfigError(f"{setting} must name at least one of "
                          f"{', '.join(PURGEABLE_STATUSES)}, got {statuses!r}")
    wrong = [status for status in statuses if status not in PURGEABLE_STATUSES]
    if wrong:
        raise ConfigError(
            f"{setting} may name only finished statuses ({', '.join(PURGEABLE_STATUSES)}), "
            f"got {', '.join(map(repr, wrong))}")
    return tuple(dict.fromkeys(statuses))


async def delete_partition(store: Store, partition_id: str, *, force: bool = False,
                           batch: int = DEFAULT_BATCH) -> int:
    """Delete a partition and its items in batches; returns how many items went.

    Raises:
        PartitionNotFoundError: no partition has this id.
        PartitionLeasedError: a processor holds a live lease on it and ``force`` is false.
        sqlalchemy.exc.SQLAlchemyError: the database failed (a ``deleting``
            partition is left, which deleting it again or a purge finishes).
    """
    await store.partition_delete_begin(partition_id, force=force)
    deleted = 0
    while True:
        step = await store.partition_delete_batch(partition_id, batch)
        deleted += step.items
        if step.done or step.skipped:  # skipped: a concurrent purge finished it
            return deleted


async def purge(store: Store, *, older_than: float, statuses: Collection[str],
                batch: int = DEFAULT_BATCH, keep_going: KeepGoing | None = None) -> PurgeReport:
    """Delete the partitions in ``statuses`` last updated more than ``older_than`` seconds
    ago (by the store's clock), and finish any left ``deleting``, in batches.

    ``keep_going`` is asked before each batch; when it answers false the purge
    stops there (the report says so) and the next purge carries on.

    First it forgets the tokens of deleted items' waits kept for 30 days
    (:meth:`Store.removed_waits_purge`): from then on they are unknown (404).

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database failed; what was deleted stays deleted.
    """
    while await store.removed_waits_purge(batch=batch) >= batch:
        if keep_going is not None and not await keep_going():
            return PurgeReport(stopped=True)
    partitions = items = 0
    while True:
        candidates = await store.partitions_purgeable(older_than=older_than, statuses=statuses,
                                                      limit=PURGE_READ)
        progress = 0
        for partition_id in candidates:
            while True:
                if keep_going is not None and not await keep_going():
                    return PurgeReport(partitions, items, stopped=True)
                step = await store.partition_delete_batch(
                    partition_id, batch, statuses=statuses, older_than=older_than)
                items += step.items
                progress += step.items + step.done
                partitions += step.done
                if step.done or step.skipped:
                    break
        # Nothing read, or nothing of what was read qualified any more (re-opened
        # meanwhile, or finished by a concurrent delete): done.
        if not progress:
            return PurgeReport(partitions, items)


async def purge_finished_items(store: Store, *, older_than: float,
                               batch: int = DEFAULT_BATCH,
                               keep_going: KeepGoing | None = None) -> PurgeReport:
    """Delete the complete items of open partitions last updated more than
    ``older_than`` seconds ago (by the store's clock), in batches of about ``batch``.

    A long-lived partition that keeps re-opening never finishes, so partition
    retention never removes it; this sheds its finished items (see
    :meth:`Store.items_purge_finished` for what stays). Each batch is its own
    transaction; ``keep_going`` is asked before each. The report counts the
    removed items as ``finished_items``.

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database failed; what was deleted stays deleted.
    """
    removed = 0
    after: str | None = None
    while True:
        page = await store.partitions_open_page(after=after, limit=OPEN_READ)
        for partition_id in page:
            resume: str | None = None
            while True:
                if keep_going is not None and not await keep_going():
                    return PurgeReport(finished_items=removed, stopped=True)
                count, resume = await store.items_purge_finished(
                    partition_id, older_than=older_than, batch=batch, after=resume)
                removed += count
                if resume is None:
                    break
        if len(page) < OPEN_READ:
            return PurgeReport(finished_items=removed)
        after = page[-1]


@dataclass(frozen=True)
class RetentionConfig:
    """Background retention: what to remove and how often to look.

    ``older_than`` is seconds since a partition's last update (``None``: finished
    partitions stay); ``items_older_than``, when set, also deletes the complete
    items of open partitions last updated that long ago; ``interval`` is
    how often a processor tries to take the retention lease and purge;
    ``hold`` is how long the lease lasts past a renewal (renewed every third
    of it while purging); ``batch`` is items deleted per transaction.

    Raises:
        ConfigError: a value is out of range; the message names it.
    """

    older_than: float | None
    statuses: tuple[str, ...] = DEFAULT_STATUSES
    interval: float = DEFAULT_INTERVAL
    hold: float = DEFAULT_HOLD
    batch: int = DEFAULT_BATCH
    items_older_than: float | None = None

    def __post_init__(self) -> None:
        if self.older_than is None and self.items_older_than is None:
            raise ConfigError("retention needs --retention (finished partitions) or "
                              "--retention-items (finished items of open partitions), or both")
        if self.older_than is not None:
            check_seconds("retention", self.older_than)
        if self.items_older_than is not None:
            check_seconds("item retention", self.items_older_than)
        check_seconds("retention interval", self.interval)
        check_seconds("retention lease", self.hold)
        check_whole_number("purge batch", self.batch, maximum=MAX_BATCH)
        object.__setattr__(self, "statuses", check_statuses("retention statuses",
                                                            self.statuses))


def snooze_cap(retention: object) -> float:
    """The longest snooze a handler may ask for: a week, or the shortest retention period
    set, when shorter (an item that waits longer than its partition is kept makes no
    sense)."""
    from watcher.rules.delays import MAX_SNOOZE_SECONDS

    periods = [period for period in (getattr(retention, "older_than", None),
                                     getattr(retention, "items_older_than", None))
               if period]
    return min([MAX_SNOOZE_SECONDS, *periods])


class Retention:
    """Purges finished partitions in the background, on one processor at a time.

    ``on_purged`` is told what each pass removed (the processor's metrics).
    """

    def __init__(self, store: Store, owner: str, config: RetentionConfig, *,
                 on_purged: Callable[[PurgeReport], None] | None = None) -> None:
        self.store = store
        self.owner = owner
        self.config = config
        self._on_purged = on_purged
        self._stop = asyncio.Event()
        self._renewed_at = 0.0
        self._outage = OutageLatch()

    @property
    def _lease(self) -> float:
        # Held through the wait until the next pass, so the holder keeps the duty
        # while it lives; another processor takes over once it has expired.
        return self.config.interval + self.config.hold

    async def run_once(self) -> PurgeReport | None:
        """One pass: take (or keep) the retention lease and, holding it, purge.

        Returns what was removed, or ``None`` when another processor holds the lease.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed.
        """
        if not await self.store.leader_take(RETENTION_DUTY, self.owner, self._lease):
            return None
        self._renewed_at = time.monotonic()
        report = PurgeReport()
        if self.config.older_than is not None:
            report = await purge(self.store, older_than=self.config.older_than,
                                 statuses=self.config.statuses, batch=self.config.batch,
                                 keep_going=self._still_leader)
            if report.partitions or report.items:
                log.info("action=retention_purged owner=%s partitions=%d items=%d "
                         "older_than=%s statuses=%s%s", self.owner, report.partitions,
                         report.items, format_duration(self.config.older_than),
                         ",".join(self.config.statuses),
                         " stopped=true" if report.stopped else "")
        if self.config.items_older_than is not None and not report.stopped:
            shed = await purge_finished_items(
                self.store, older_than=self.config.items_older_than, batch=self.config.batch,
                keep_going=self._still_leader)
            if shed.finished_items:
                log.info("action=retention_items_purged owner=%s items=%d older_than=%s%s",
                         self.owner, shed.finished_items,
                         format_duration(self.config.items_older_than),
                         " stopped=true" if shed.stopped else "")
            report = dataclasses.replace(report, finished_items=shed.finished_items,
                                         stopped=shed.stopped)
        if self._on_purged is not None:
            self._on_purged(report)
        return report

    async def _still_leader(self) -> bool:
        """Whether to go on purging: not stopping, and still holding the lease (renewed
        when a third of it has passed)."""
        if self._stop.is_set():
            return False
        now = time.monotonic()
        if now - self._renewed_at < self.config.hold / 3:
            return True
        if not await self.store.leader_take(RETENTION_DUTY, self.owner, self._lease):
            log.warning("action=retention_lease_lost owner=%s; another processor purges now",
                        self.owner)
            return False
        self._renewed_at = now
        return True

    async def run(self) -> None:
        """Pass after pass, one per interval, until :meth:`stop`; then give up the lease.

        A database failure is logged when it begins and when it ends; the next
        pass tries again.
        """
        log.info("action=retention_started owner=%s older_than=%s statuses=%s items_older_than=%s "
                 "every=%s", self.owner, _duration_or_off(self.config.older_than),
                 ",".join(self.config.statuses), _duration_or_off(self.config.items_older_than),
                 format_duration(self.config.interval))
        try:
            while not self._stop.is_set():
                try:
                    await self.run_once()
                except SQLAlchemyError as error:
                    if self._outage.fail():
                        log.warning("action=retention_failed owner=%s error=%s; trying again "
                                    "in %s", self.owner, type(error).__name__,
                                    format_duration(self.config.interval))
                else:
                    if self._outage.recover():
                        log.info("action=retention_recovered owner=%s", self.owner)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.config.interval)
        finally:
            with contextlib.suppress(SQLAlchemyError, OSError):
                await self.store.leader_release(RETENTION_DUTY, self.owner)

    def stop(self) -> None:
        """Ask :meth:`run` to end after the batch in progress. Safe to call twice."""
        self._stop.set()


def _duration_or_off(seconds: float | None) -> str:
    return "off" if seconds is None else format_duration(seconds)
