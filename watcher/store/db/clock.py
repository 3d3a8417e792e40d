"""The store's clock: the database's own, or a fixed time a test sets.

Every statement reads the time as ``COALESCE(:clock_now, <database now>)``
(see :func:`watcher.store.drivers.sql.clock_now`). The clock only supplies the
parameter: :class:`DatabaseClock` sends ``NULL``, so the database clock
decides, and :class:`FixedClock` sends its time. The statements, and the path
they take to the database, are therefore the same under both.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    """Where a store's statements take the current time from."""

    def reading(self) -> datetime | None:
        """The current time as a naive UTC datetime, or ``None`` for the database's clock."""
        ...


class DatabaseClock:
    """The database's own clock (production): lease expiry never depends on a host's clock."""

    def reading(self) -> None:
        """Always ``None``: the statement falls back to the database's ``now()``."""
        return None

    def __repr__(self) -> str:
        return "DatabaseClock()"


class FixedClock:
    """A time that stands still until a test moves it (naive UTC, as the tables store it).

    Raises:
        ValueError: ``moment`` carries a time zone.
    """

    def __init__(self, moment: datetime) -> None:
        self.moment = self._naive(moment)

    @staticmethod
    def _naive(moment: datetime) -> datetime:
        if moment.tzinfo is not None:
            raise ValueError(f"a FixedClock takes a naive UTC time, not {moment.isoformat()}")
        return moment

    def reading(self) -> datetime:
        """The time set, unchanged until :meth:`advance` or :meth:`set`."""
        return self.moment

    def advance(self, seconds: float) -> datetime:
        """Move the clock on by ``seconds`` (back, if negative); returns the new time."""
        self.moment += timedelta(seconds=seconds)
        return self.moment

    def set(self, moment: datetime) -> None:
        """Set the clock to ``moment``.

        Raises:
            ValueError: ``moment`` carries a time zone.
        """
        self.moment = self._naive(moment)

    def __repr__(self) -> str:
        return f"FixedClock({self.moment!r})"


# How long a reading of the database clock is carried on by this host's monotonic clock.
READING_MAX_AGE = 10.0


class ClockReading:
    """The database clock's time as a statement last returned it, carried on by this
    host's monotonic clock: a time to record (a partition's timeline), never to fence
    with (a lease's ``until`` is always compared inside the database).

    Over :data:`READING_MAX_AGE` seconds, monotonic clocks drift by microseconds; the
    error is the reading's own round trip, a millisecond or so.
    """

    __slots__ = ("_at", "_max_age", "_read")

    def __init__(self, max_age: float = READING_MAX_AGE) -> None:
        self._max_age = max_age
        self._read: datetime | None = None
        self._at = 0.0

    def observe(self, read: datetime, at: float) -> None:
        """A statement returned the database's time ``read`` at ``at``
        (``time.monotonic()``, taken as its answer came back)."""
        self._read, self._at = read, at

    def now(self, at: float) -> datetime | None:
        """The database's time at ``at`` (``time.monotonic()``), as carried on from the
        latest reading; ``None`` when there is none, or it is over the age allowed."""
        if self._read is None or not 0.0 <= at - self._at <= self._max_age:
            return None
        return self._read + timedelta(seconds=at - self._at)
