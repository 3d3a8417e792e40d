"""Delays: an item's ``not_before``, a partition's ``start_at`` and a handler's snooze.

Pure checks shared by the client, the ingest API, spawns and the engine. A
delay is stored as a time the database compares with its own clock: an item's
``retry_at`` (the ready read takes only items whose ``retry_at`` has passed) or
an unleased partition's ``until`` (the lease scan takes only partitions whose
``until`` has passed). So nothing starts early by the database clock, and an
idle processor notices a due item within one poll.

The bounds here are sanity checks against mistakes (milliseconds taken for
seconds, a date a century out); they compare with this host's clock, which is
close enough for a bound of months.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

# The furthest ahead an item's not_before or a partition's start_at may be.
MAX_DELAY_AHEAD = timedelta(days=366)
# The longest snooze a handler may ask for: an item that needs a longer wait than
# this is better a new partition scheduled with start_at.
MAX_SNOOZE_SECONDS = 7 * 24 * 3600.0


class DelayError(ValueError):
    """A delay that cannot be stored: its message names what is wrong and what to do."""


def checked_time(moment: object, what: str, *, now: datetime | None = None) -> datetime:
    """``moment`` (an aware datetime in any zone) in UTC, checked.

    ``what`` names the value in the message (``"not_before"``, ``"start_at"``).
    ``now`` (aware) is the host's time unless given. A time in the past is kept: it
    is simply due at once.

    Raises:
        DelayError: not a datetime, a naive datetime (its zone is unknown: local time
            and UTC would differ by hours), or further ahead than :data:`MAX_DELAY_AHEAD`.
    """
    if not isinstance(moment, datetime):
        raise DelayError(f"{what} must be a datetime with a time zone, got "
                         f"{type(moment).__name__}")
    offset = moment.utcoffset()
    if offset is None:
        raise DelayError(
            f"{what} {moment.isoformat()} has no time zone, so it is ambiguous (local time "
            "or UTC?); pass an aware datetime, e.g. datetime.now(UTC) + timedelta(minutes=5)")
    current = now or datetime.now(UTC)
    if moment - current > MAX_DELAY_AHEAD:
        raise DelayError(
            f"{what} {moment.isoformat()} is more than {MAX_DELAY_AHEAD.days} days ahead; "
            "check its units and year")
    return moment.astimezone(UTC)


def stored_time(moment: datetime) -> datetime:
    """An aware time (from :func:`checked_time`) as the naive UTC time the tables store."""
    return moment.astimezone(UTC).replace(tzinfo=None)


def parse_time(text: object, what: str, *, now: datetime | None = None) -> datetime:
    """An RFC 3339 time with an offset (``2026-11-26T10:00:00Z``, ``...+01:00``), in UTC
    (see :func:`checked_time`).

    Raises:
        DelayError: not a string, not such a time, no offset, or too far ahead.
    """
    if not isinstance(text, str):
        raise DelayError(f"{what} must be an RFC 3339 time such as "
                         f"\"2026-11-26T10:00:00Z\", got {type(text).__name__}")
    try:
        moment = datetime.fromisoformat(text.replace("z", "Z"))
    except ValueError:
        raise DelayError(f"{what} {text!r} is not an RFC 3339 time such as "
                         "\"2026-11-26T10:00:00Z\"") from None
    if moment.utcoffset() is None:
        raise DelayError(f"{what} {text!r} has no offset, so it is ambiguous; end it with "
                         "Z (UTC) or an offset such as +01:00")
    return checked_time(moment, what, now=now)


def snooze_problem(seconds: object, limit: float = MAX_SNOOZE_SECONDS) -> str | None:
    """Why ``seconds`` is not a snooze a handler may ask for, or ``None`` when it is:
    a number of seconds above 0 and at most ``limit``."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return f"'snooze' must be a number of seconds, got {type(seconds).__name__}"
    if not math.isfinite(seconds) or seconds <= 0:
        return f"'snooze' must be a number of seconds above 0, got {seconds!r}"
    if seconds > limit:
        return (f"'snooze' of {seconds:g} s is longer than the {limit:g} s allowed; wait "
                "longer by snoozing again, or schedule a new partition with start_at")
    return None
