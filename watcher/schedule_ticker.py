"""The schedules' ticker: creates each due schedule's partitions, on every processor at once.

Each processor runs one. A pass (:meth:`Ticker.run_once`) is one indexed read
of the schedules due by the database clock, and nothing more when none is.
For each due one it plans the ticks under the schedule's catch-up policy
(:func:`~watcher.schedules.timing.plan_ticks`) and writes each in its own
transaction, which moves the schedule on (guarded by the version it read) and
creates the tick's partition ``NAME/<tick time>``. Of processors that race, one
moves the schedule and the others find the version changed, so each tick's
partition is created once across the fleet; the partition id makes a repeated
create a no-op besides. ``run()`` only waits, repeats and stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from dataclasses import dataclass

from sqlalchemy.exc import SQLAlchemyError

from watcher.outages import OutageLatch
from watcher.rules.checks import check_seconds, check_whole_number
from watcher.rules.durations import format_duration
from watcher.schedules.records import DueSchedule
from watcher.schedules.timing import TickPlan, plan_ticks, tick_partition_id, tick_text
from watcher.store import Store
from watcher.store.schedules import TickOutcome

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 1.0
# Due schedules read per pass (a pass that handles as many ticks runs again at once).
DUE_BATCH = 100


@dataclass(frozen=True)
class TickerConfig:
    """How often the ticker looks for due schedules, and how many it reads at a time.

    Raises:
        ConfigError: a value is out of range; the message names it.
    """

    interval: float = DEFAULT_INTERVAL
    batch: int = DUE_BATCH

    def __post_init__(self) -> None:
        check_seconds("schedule poll interval", self.interval)
        check_whole_number("due schedules per read", self.batch, maximum=10_000)


class Ticker:
    """Creates the partitions of due schedules (see the module's docstring)."""

    def __init__(self, store: Store, owner: str, config: TickerConfig | None = None) -> None:
        self.store = store
        self.owner = owner
        self.config = config or TickerConfig()
        self._stop = asyncio.Event()
        self._outage = OutageLatch()

    async def run_once(self) -> Counter[TickOutcome]:
        """One pass: read the due schedules and handle their ticks. Returns how many
        ticks each outcome had (empty when no schedule was due).

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed; what was written stays.
        """
        outcomes: Counter[TickOutcome] = Counter()
        now, due = await self.store.schedules_due(self.config.batch)
        for schedule in due:
            assert now is not None
            plan = plan_ticks(schedule.timing, schedule.anchor, schedule.after, now,
                              schedule.catch_up)
            outcomes.update(await self._tick(schedule, plan))
        return outcomes

    async def _tick(self, schedule: DueSchedule, plan: TickPlan) -> list[TickOutcome]:
        """Write ``plan``: each tick to create in its own transaction, the last one moving
        the schedule to its next tick; stops when another processor moved it first."""
        if plan.passed:
            log.info("action=schedule_ticks_passed schedule=%s passed=%d catch_up=%s latest=%s",
                     schedule.name, plan.passed, schedule.catch_up.value,
                     tick_text(plan.latest) if plan.latest else "-")
        if not plan.fire:
            outcome = await self.store.schedule_tick(schedule, plan.latest, plan.next_at,
                                                     create=False)
            return [outcome]
        outcomes = []
        version = schedule.version
        last_partition = schedule.last_partition
        for position, tick in enumerate(plan.fire):
            last = position == len(plan.fire) - 1
            # Until the last, the next tick to create is still due: a crash leaves it so.
            next_at = plan.next_at if last else plan.fire[position + 1]
            step = DueSchedule(schedule.name, version, schedule.timing, schedule.catch_up,
                               schedule.no_overlap, schedule.anchor, schedule.after,
                               last_partition, schedule.key)
            outcome = await self.store.schedule_tick(step, tick, next_at, create=True)
            outcomes.append(outcome)
            partition_id = tick_partition_id(schedule.name, tick)
            if outcome is TickOutcome.LOST:
                break
            version += 1
            if outcome is TickOutcome.CREATED:
                last_partition = partition_id
                log.info("action=schedule_ticked schedule=%s partition=%s owner=%s",
                         schedule.name, partition_id, self.owner)
            elif outcome is TickOutcome.OVERLAP:
                log.info("action=schedule_tick_skipped schedule=%s partition=%s reason=overlap "
                         "open=%s", schedule.name, partition_id, last_partition)
            elif outcome is TickOutcome.EXISTED:
                log.info("action=schedule_tick_existed schedule=%s partition=%s",
                         schedule.name, partition_id)
        return outcomes

    async def run(self) -> None:
        """Pass after pass, one per interval (at once after a busy pass), until :meth:`stop`.

        A database failure is logged when it begins and when it ends; the next pass
        tries again.
        """
        log.info("action=ticker_started owner=%s every=%s", self.owner,
                 format_duration(self.config.interval))
        while not self._stop.is_set():
            delay = self.config.interval
            try:
                outcomes = await self.run_once()
            except SQLAlchemyError as error:
                if self._outage.fail():
                    log.warning("action=ticker_failed owner=%s error=%s; trying again in %s",
                                self.owner, type(error).__name__,
                                format_duration(self.config.interval))
            else:
                if self._outage.recover():
                    log.info("action=ticker_recovered owner=%s", self.owner)
                if sum(outcomes.values()) >= self.config.batch:
                    delay = 0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)

    def stop(self) -> None:
        """Ask :meth:`run` to end after the pass in progress. Safe to call twice."""
        self._stop.set()
