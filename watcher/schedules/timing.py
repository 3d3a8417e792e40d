"""When a schedule ticks: cron expressions (croniter, in a zoneinfo time zone) or a fixed
interval, the catch-up policy after downtime, and the partition id of a tick. Pure: no I/O.

Every time here is a naive UTC datetime, as the tables store them. A cron
expression is read in its schedule's time zone; daylight-saving changes follow
Vixie cron's rules (see :func:`cron_ticks_back`):

- a fixed-time job (neither its minute nor its hour field starts with ``*``)
  whose time falls in the hour skipped in spring runs once, at the jump
  (croniter's own behaviour);
- in the hour repeated in autumn a fixed-time job runs once, at the first
  occurrence (croniter yields both; the second is dropped here);
- other jobs (``*/15 * * * *``, ``0 * * * *``) run by elapsed time: every
  occurrence, in both changes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from watcher.errors import InvalidInputError
from watcher.models import ID_MAX_LENGTH

# The shortest interval of an --every schedule.
MIN_EVERY = 1.0
# The longest: a year (a rarer tick wants a cron expression).
MAX_EVERY = 366 * 86400.0
# The most missed ticks the "all" policy creates after downtime: the latest ones.
MAX_CATCH_UP = 1000
# How late a tick may be seen and still count as on time (the "none" policy).
ON_TIME = timedelta(seconds=60)
# The partition id is NAME/<ISO time>, at most 27 characters after the name.
NAME_MAX_LENGTH = ID_MAX_LENGTH - 32
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
CRON_MAX_LENGTH = 255
TIMEZONE_MAX_LENGTH = 64


class CatchUp(StrEnum):
    """What a schedule does with the ticks it missed while no processor ran."""

    SKIP = "skip"  # create the latest missed tick only (the default)
    ALL = "all"  # create every missed tick, the latest MAX_CATCH_UP of them
    NONE = "none"  # create none of them; wait for the next tick


@dataclass(frozen=True, slots=True)
class Timing:
    """When a schedule ticks: a cron expression in a time zone, or every ``every`` seconds
    from ``anchor`` (its creation, in whole seconds)."""

    cron: str | None = None
    timezone: str = "UTC"
    every: float | None = None


@dataclass(frozen=True, slots=True)
class TickPlan:
    """What one pass does with a due schedule: the ticks to create (oldest first), how
    many due ticks it passes over, the latest due tick (recorded as the last tick) and
    the next tick after now."""

    fire: tuple[datetime, ...]
    passed: int
    latest: datetime | None
    next_at: datetime


def schedule_name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a schedule, or ``None``: its ticks' partition ids start with
    it and a ``/``, so it is 1 to 223 letters, digits, ``.``, ``_``, ``:`` or ``-``,
    starting with a letter or digit."""
    if not isinstance(name, str) or not name:
        return f"a schedule name must be a non-empty string, got {name!r}"
    if len(name) > NAME_MAX_LENGTH:
        return (f"schedule name {name[:40]!r}... is {len(name)} characters; the limit is "
                f"{NAME_MAX_LENGTH} (its partition ids add the tick time)")
    if not NAME_PATTERN.fullmatch(name):
        return (f"schedule name {name!r} may hold only letters, digits, '.', '_', ':' and '-', "
                "starting with a letter or digit (no '/': its partitions are NAME/<tick time>)")
    return None


def check_timing(cron: str | None, timezone: str | None, every: float | None) -> Timing:
    """A schedule's timing, checked: exactly one of ``cron`` and ``every``; a time zone only
    with ``cron`` (UTC by default).

    Raises:
        InvalidInputError: neither or both, a cron expression croniter cannot read, an
            unknown time zone, or an interval below :data:`MIN_EVERY` seconds.
    """
    if (cron is None) == (every is None):
        raise InvalidInputError("a schedule needs exactly one of a cron expression (--cron) "
                                "and an interval (--every)")
    if every is not None:
        if timezone not in (None, "UTC"):
            raise InvalidInputError("--timezone goes with --cron; an --every interval counts "
                                    "elapsed time")
        if (isinstance(every, bool) or not isinstance(every, int | float)
                or not MIN_EVERY <= every <= MAX_EVERY):
            raise InvalidInputError(f"the interval must be from {MIN_EVERY:g} s to 366 days, "
                                    f"got {every!r}")
        return Timing(every=float(every))
    assert cron is not None
    zone = timezone or "UTC"
    _zone(zone)
    from croniter import croniter

    if (not isinstance(cron, str) or len(cron) > CRON_MAX_LENGTH
            or len(cron.split()) != 5 or not croniter.is_valid(cron)):
        raise InvalidInputError(
            f"{cron!r} is not a cron expression of five fields (minute hour day-of-month "
            "month day-of-week), such as '0 3 * * *' or '*/15 * * * 1-5'")
    return Timing(cron=" ".join(cron.split()), timezone=zone)


def _zone(name: str) -> ZoneInfo:
    """Raises InvalidInputError: no such IANA time zone."""
    try:
        if not isinstance(name, str) or len(name) > TIMEZONE_MAX_LENGTH:
            raise ValueError(name)
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidInputError(f"unknown time zone {name!r}; use an IANA name such as "
                                "'Europe/Berlin', 'America/New_York' or 'UTC'") from None


def _fixed_time(cron: str) -> bool:
    minute, hour = cron.split()[:2]
    return not (minute.startswith("*") or hour.startswith("*"))


def _cron_iter(timing: Timing, start: datetime, backwards: bool) -> Iterator[datetime]:
    """The cron ticks strictly after (or before) ``start``, as naive UTC, with the repeated
    hour's second occurrence of a fixed-time job dropped."""
    from croniter import croniter

    assert timing.cron is not None
    zone = _zone(timing.timezone)
    fixed = _fixed_time(timing.cron)
    ticks = croniter(timing.cron, start.replace(tzinfo=UTC).astimezone(zone))
    step = ticks.get_prev if backwards else ticks.get_next
    while True:
        local = step(datetime)
        if fixed and _repeated(local, zone):
            continue
        yield local.astimezone(UTC).replace(tzinfo=None)


def _repeated(local: datetime, zone: ZoneInfo) -> bool:
    """Whether ``local`` is the second occurrence of a wall time the autumn change repeats
    (croniter's own ``fold`` is not reliable, so the offsets decide)."""
    wall = local.replace(tzinfo=None)
    first, second = wall.replace(tzinfo=zone, fold=0), wall.replace(tzinfo=zone, fold=1)
    if first.utcoffset() == second.utcoffset():
        return False
    # A wall time in the spring gap has two offsets too, but its first reading is no real time.
    real = first.astimezone(UTC).astimezone(zone).replace(tzinfo=None) == wall
    return real and local.utcoffset() == second.utcoffset()


def anchor_of(created_at: datetime) -> datetime:
    """An --every schedule's anchor: its creation, in whole seconds."""
    return created_at.replace(microsecond=0)


def _every_us(timing: Timing) -> int:
    assert timing.every is not None
    return round(timing.every * 1_000_000)


def next_tick(timing: Timing, anchor: datetime, after: datetime) -> datetime:
    """The first tick strictly after ``after``."""
    if timing.cron is not None:
        return next(_cron_iter(timing, after, backwards=False))
    step = _every_us(timing)
    passed = max(0, (after - anchor) // timedelta(microseconds=1))
    return anchor + timedelta(microseconds=(passed // step + 1) * step)


def ticks_back(timing: Timing, anchor: datetime, after: datetime, now: datetime,
               limit: int) -> list[datetime]:
    """The ticks in ``(after, now]``, newest first, at most ``limit`` of them."""
    found: list[datetime] = []
    if timing.cron is not None:
        for tick in _cron_iter(timing, now + timedelta(microseconds=1), backwards=True):
            if tick <= after or len(found) == limit:
                break
            found.append(tick)
        return found
    step = timedelta(microseconds=_every_us(timing))
    if now < anchor + step:
        return found
    tick = anchor + ((now - anchor) // step) * step
    while tick > after and tick > anchor and len(found) < limit:
        found.append(tick)
        tick -= step
    return found


def plan_ticks(timing: Timing, anchor: datetime, after: datetime, now: datetime,
               catch_up: CatchUp) -> TickPlan:
    """What to do with a schedule whose ticks after ``after`` (its last tick, or when it
    started counting) are due by ``now``, under its catch-up policy."""
    due = ticks_back(timing, anchor, after, now, MAX_CATCH_UP + 1)
    following = next_tick(timing, anchor, now)
    if not due:
        return TickPlan((), 0, None, following)
    latest = due[0]
    if catch_up is CatchUp.ALL:
        fire = tuple(reversed(due[:MAX_CATCH_UP]))
    elif catch_up is CatchUp.SKIP or now - latest <= ON_TIME:
        fire = (latest,)
    else:
        fire = ()
    # Passed over: every due tick not fired (MAX_CATCH_UP + 1 when there were more).
    return TickPlan(fire, len(due) - len(fire), latest, following)


def tick_text(tick: datetime) -> str:
    """A tick time in ISO 8601 UTC: ``2026-11-28T03:00:00Z`` (a fraction only when it has one)."""
    text = tick.strftime("%Y-%m-%dT%H:%M:%S")
    if tick.microsecond:
        text += f".{tick.microsecond:06d}".rstrip("0")
    return text + "Z"


def tick_partition_id(name: str, tick: datetime) -> str:
    """The partition a schedule's tick creates: ``NAME/<tick time>``."""
    return f"{name}/{tick_text(tick)}"
