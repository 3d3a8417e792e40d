"""The values of schedules the store writes and reads: a new schedule, and one as stored."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from watcher.records import NewItem, PartitionSettings
from watcher.schedules.timing import CatchUp, Timing


@dataclass(frozen=True, slots=True)
class NewSchedule:
    """A schedule to add: when it ticks, what it does after downtime, and the partition
    each tick creates (its items and settings, as ``create`` takes them)."""

    name: str
    timing: Timing
    catch_up: CatchUp = CatchUp.SKIP
    no_overlap: bool = False
    items: tuple[NewItem, ...] = ()
    settings: PartitionSettings = field(default_factory=PartitionSettings)


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A stored schedule: its definition, its last and next ticks (naive UTC, the database
    clock's), the partition its last created tick made, and whether it is paused."""

    name: str
    timing: Timing
    catch_up: CatchUp
    no_overlap: bool
    settings: PartitionSettings
    item_count: int
    created_at: datetime
    next_at: datetime | None
    last_tick: datetime | None = None
    last_partition: str | None = None
    paused_at: datetime | None = None
    version: int = 1


@dataclass(frozen=True, slots=True)
class DueSchedule:
    """What the ticker reads of a due schedule: enough to plan its ticks and guard its
    write (``version``); ``after`` is its last tick, or when it began counting."""

    name: str
    version: int
    timing: Timing
    catch_up: CatchUp
    no_overlap: bool
    anchor: datetime
    after: datetime
    last_partition: str | None
    key: str = ""  # the concurrency key its partitions get; '' for none
