"""The client's schedules: add, list, show, pause, resume and delete them.

:class:`ScheduleClient` is a part of :class:`processor.AsyncClient`, and
:class:`SyncScheduleClient` of :class:`processor.Client`. A schedule creates the
partition ``NAME/<tick time, ISO 8601 UTC>`` at each tick, with the items and
settings given here (what :meth:`~processor.AsyncClient.create_partition` takes);
the processors tick it, each tick once across the fleet (:mod:`watcher.schedules`).
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from processor.client.checks import check_items, check_limit, check_settings
from watcher.errors import InvalidInputError, ScheduleNotFoundError
from watcher.records import NewItem
from watcher.schedules.records import NewSchedule, ScheduleInfo
from watcher.schedules.timing import CatchUp, check_timing, schedule_name_problem, tick_text
from watcher.store import Store

T = TypeVar("T")

MAX_SCHEDULES_PAGE = 10_000


def check_schedule_name(name: object) -> str:
    """Raises InvalidInputError: not a schedule name (see
    :func:`~watcher.schedules.timing.schedule_name_problem`)."""
    problem = schedule_name_problem(name)
    if problem is not None:
        raise InvalidInputError(problem)
    assert isinstance(name, str)
    return name


def check_catch_up(catch_up: object) -> CatchUp:
    """Raises InvalidInputError: not one of skip, all, none."""
    if not isinstance(catch_up, str) or catch_up not in CatchUp.__members__.values():
        raise InvalidInputError(f"catch_up must be one of skip, all, none, got {catch_up!r}")
    return CatchUp(catch_up)


def check_every(every: object) -> float | None:
    """An interval in seconds (a number or a timedelta), or ``None``.

    Raises:
        InvalidInputError: not a number of seconds.
    """
    if every is None:
        return None
    if isinstance(every, timedelta):
        return every.total_seconds()
    if isinstance(every, bool) or not isinstance(every, int | float):
        raise InvalidInputError(f"every must be a number of seconds or a timedelta, got "
                                f"{every!r}")
    return float(every)


def new_schedule(name: object, *, cron: str | None, timezone: str | None,
                 every: float | timedelta | None, items: Sequence[NewItem],
                 reduce_gates: Iterable[int], on_item_failure: str, priority: int,
                 key: str | None, catch_up: str, no_overlap: bool,
                 max_item_bytes: int, notify: str | None = None,
                 pipeline: str | None = None,
                 pipeline_version: str | None = None) -> NewSchedule:
    """A new schedule, every part checked as ``create_partition`` checks a partition's
    (``notify``, ``pipeline`` and ``pipeline_version`` too: each tick's partition
    names them).

    Raises:
        InvalidInputError: a bad name, cron expression, time zone, interval, catch-up
            policy, item or setting; the message names it.
    """
    checked_name = check_schedule_name(name)
    timing = check_timing(cron, timezone, check_every(every))
    example = f"{checked_name}/{tick_text(datetime(2026, 1, 1))}"
    settings = check_settings(example, reduce_gates, on_item_failure, priority, key,
                              notify=notify, pipeline=pipeline,
                              pipeline_version=pipeline_version)
    checked = check_items(example, items, allow_empty=True, max_item_bytes=max_item_bytes)
    if any(item.not_before is not None for item in checked):
        raise InvalidInputError("a schedule's items cannot have not_before: each tick's "
                                "partition starts at its tick")
    return NewSchedule(checked_name, timing, check_catch_up(catch_up), bool(no_overlap),
                       tuple(checked), settings)


class ScheduleClient:
    """Schedules (a part of :class:`processor.AsyncClient`)."""

    store: Store
    max_item_bytes: int

    async def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError  # AsyncClient's

    async def add_schedule(self, name: str, *, cron: str | None = None,
                           timezone: str | None = None,
                           every: float | timedelta | None = None,
                           items: Sequence[NewItem] = (), reduce_gates: Iterable[int] = (),
                           on_item_failure: str = "fail", priority: int = 0,
                           key: str | None = None, catch_up: str = "skip",
                           no_overlap: bool = False, notify: str | None = None,
                           pipeline: str | None = None,
                           pipeline_version: str | None = None) -> ScheduleInfo:
        """Add a schedule that creates the partition ``NAME/<tick time>`` at each tick of
        ``cron`` (five fields, read in ``timezone``, UTC by default) or ``every`` seconds
        (from 1), with ``items`` and the settings ``create_partition`` takes.

        ``catch_up`` says what the ticks missed while no processor ran do: ``"skip"``
        (the default) creates the latest of them, ``"all"`` each of them (the latest
        1,000), ``"none"`` none (a tick seen within a minute still counts as on time).
        ``no_overlap`` skips a tick while the schedule's last partition is still open.
        ``notify``, ``pipeline`` and ``pipeline_version`` are each tick's partition's, as
        ``create_partition`` takes them.

        Raises:
            InvalidInputError: a bad name, cron expression, time zone, interval, policy,
                item or setting (nothing is written).
            ScheduleExistsError: a schedule with this name exists.
        """
        schedule = new_schedule(name, cron=cron, timezone=timezone, every=every, items=items,
                                reduce_gates=reduce_gates, on_item_failure=on_item_failure,
                                priority=priority, key=key, catch_up=catch_up,
                                no_overlap=no_overlap, max_item_bytes=self.max_item_bytes,
                                notify=notify, pipeline=pipeline,
                                pipeline_version=pipeline_version)
        return await self._call(self.store.schedule_add(schedule))

    async def schedules(self, limit: int = 1000, *, after: str | None = None
                        ) -> list[ScheduleInfo]:
        """The schedules by name, ``limit`` at a time after the name ``after``.

        Raises:
            InvalidInputError: ``limit`` is not from 1 to 10,000.
        """
        check_limit("limit", limit, MAX_SCHEDULES_PAGE)
        return await self._call(self.store.schedules_list(after=after, limit=limit))

    async def schedule(self, name: str) -> ScheduleInfo:
        """One schedule.

        Raises:
            ScheduleNotFoundError: no schedule has this name.
        """
        info = await self._call(self.store.schedule_get(check_schedule_name(name)))
        if info is None:
            raise ScheduleNotFoundError(name)
        return info

    async def schedule_items(self, name: str) -> list[NewItem]:
        """The items each tick's partition of schedule ``name`` gets.

        Raises:
            ScheduleNotFoundError: no schedule has this name.
        """
        return await self._call(self.store.schedule_items(check_schedule_name(name)))

    async def pause_schedule(self, name: str) -> bool:
        """Pause a schedule: no ticks until :meth:`resume_schedule`. Returns ``False`` when
        it was paused already.

        Raises:
            ScheduleNotFoundError: no schedule has this name.
        """
        return await self._call(self.store.schedule_pause(check_schedule_name(name), True))

    async def resume_schedule(self, name: str) -> bool:
        """Resume a schedule from its next tick (the ticks of the pause are not caught up).
        Returns ``False`` when it was not paused.

        Raises:
            ScheduleNotFoundError: no schedule has this name.
        """
        return await self._call(self.store.schedule_pause(check_schedule_name(name), False))

    async def delete_schedule(self, name: str) -> None:
        """Delete a schedule; the partitions it created stay.

        Raises:
            ScheduleNotFoundError: no schedule has this name.
        """
        await self._call(self.store.schedule_delete(check_schedule_name(name)))


class SyncScheduleClient:
    """Schedules (a part of :class:`processor.Client`): see :class:`ScheduleClient`."""

    _async: Any

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError  # Client's

    def add_schedule(self, name: str, *, cron: str | None = None, timezone: str | None = None,
                     every: float | timedelta | None = None, items: Sequence[NewItem] = (),
                     reduce_gates: Iterable[int] = (), on_item_failure: str = "fail",
                     priority: int = 0, key: str | None = None, catch_up: str = "skip",
                     no_overlap: bool = False, notify: str | None = None,
                     pipeline: str | None = None,
                     pipeline_version: str | None = None) -> ScheduleInfo:
        """See :meth:`ScheduleClient.add_schedule`."""
        return self._run(self._async.add_schedule(
            name, cron=cron, timezone=timezone, every=every, items=items,
            reduce_gates=reduce_gates, on_item_failure=on_item_failure, priority=priority,
            key=key, catch_up=catch_up, no_overlap=no_overlap, notify=notify,
            pipeline=pipeline, pipeline_version=pipeline_version))

    def schedules(self, limit: int = 1000, *, after: str | None = None) -> list[ScheduleInfo]:
        """See :meth:`ScheduleClient.schedules`."""
        return self._run(self._async.schedules(limit, after=after))

    def schedule(self, name: str) -> ScheduleInfo:
        """See :meth:`ScheduleClient.schedule`."""
        return self._run(self._async.schedule(name))

    def schedule_items(self, name: str) -> list[NewItem]:
        """See :meth:`ScheduleClient.schedule_items`."""
        return self._run(self._async.schedule_items(name))

    def pause_schedule(self, name: str) -> bool:
        """See :meth:`ScheduleClient.pause_schedule`."""
        return self._run(self._async.pause_schedule(name))

    def resume_schedule(self, name: str) -> bool:
        """See :meth:`ScheduleClient.resume_schedule`."""
        return self._run(self._async.resume_schedule(name))

    def delete_schedule(self, name: str) -> None:
        """See :meth:`ScheduleClient.delete_schedule`."""
        return self._run(self._async.delete_schedule(name))
