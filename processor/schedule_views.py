"""How a schedule shows in JSON (the CLI's --json, the ingest API, the console) and in text:
one shape everywhere."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from processor.observe.redact import redact_url
from processor.views import pipeline_text
from watcher.records import DEFAULT_PIPELINE
from watcher.rules.durations import format_duration
from watcher.schedules.records import ScheduleInfo
from watcher.schedules.timing import tick_text


def _time(moment: datetime | None) -> str | None:
    return None if moment is None else tick_text(moment)


def timing_text(info: ScheduleInfo) -> str:
    """``cron '0 3 * * *' Europe/Berlin`` or ``every 90s``."""
    timing = info.timing
    if timing.cron is not None:
        return f"cron '{timing.cron}' {timing.timezone}"
    assert timing.every is not None
    return f"every {format_duration(timing.every)}"


def schedule_dict(info: ScheduleInfo) -> dict[str, Any]:
    """A schedule as JSON: its timing, policy, the settings of its partitions (the
    notify URL with its password and query values masked), and its last and next ticks
    (ISO 8601 UTC; ``next_tick`` is ``null`` while paused)."""
    settings = info.settings
    return {
        "name": info.name,
        "cron": info.timing.cron,
        "timezone": info.timing.timezone if info.timing.cron is not None else None,
        "every": info.timing.every,
        "catch_up": info.catch_up.value,
        "no_overlap": info.no_overlap,
        "items": info.item_count,
        "reduce_gates": sorted(settings.reduce_gates),
        "on_item_failure": "continue" if settings.continue_on_failure else "fail",
        "priority": settings.priority,
        "key": settings.key or None,
        "notify": None if settings.notify is None else redact_url(settings.notify),
        "pipeline": settings.pipeline,
        "pipeline_version": settings.pipeline_version,
        "paused": info.paused_at is not None,
        "next_tick": None if info.paused_at is not None else _time(info.next_at),
        "last_tick": _time(info.last_tick),
        "last_partition": info.last_partition,
        "created_at": _time(info.created_at),
    }


def schedule_text(info: ScheduleInfo) -> str:
    """A schedule in a few lines, for ``processor schedules show`` and ``add``."""
    return "\n".join(schedule_lines(info))


def schedule_lines(info: ScheduleInfo) -> list[str]:
    """:func:`schedule_text`'s lines, each with its data as stored: the CLI prints each
    with its control characters escaped (a key is any text)."""
    shown = schedule_dict(info)
    settings = info.settings
    pipeline = (pipeline_text(settings.pipeline, settings.pipeline_version)
                if settings.pipeline != DEFAULT_PIPELINE
                or settings.pipeline_version is not None else "")
    lines = [f"schedule {info.name}: {timing_text(info)}, catch-up {shown['catch_up']}"
             + (", no overlap" if info.no_overlap else "")
             + (" (paused)" if shown["paused"] else ""),
             f"  partitions: {info.name}/<tick time>, {shown['items']} item(s), "
             f"on item failure {shown['on_item_failure']}, priority {shown['priority']}"
             + (f", key {shown['key']}" if shown["key"] else "")
             + (f", reduce gates {','.join(map(str, shown['reduce_gates']))}"
                if shown["reduce_gates"] else "")
             + (f", pipeline {pipeline}" if pipeline else "")
             + (f", notify {shown['notify']}" if shown["notify"] else ""),
             f"  next tick: {shown['next_tick'] or '-'}",
             f"  last tick: {shown['last_tick'] or '-'}"
             + (f" (last partition {info.last_partition})" if info.last_partition else "")]
    return lines
