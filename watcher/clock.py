"""The store's clock: the database's own, or a fixed time a test sets.

Every statement reads the time as ``COALESCE(:clock_now, <database now>)``
(see :func:`watcher.drivers.sql.clock_now`). The clock only supplies the
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
