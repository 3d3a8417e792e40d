"""The latch behind every "it failed" and "it recovered" log pair.

A loop that meets a database or service outage logs its start once and its end once,
never a line per failed try. :class:`OutageLatch` is that memory, shared by each
such loop (the lease cycle, the listener, the result writer, rate limits, key grants,
the processor's registration, retention, the schedules' ticker, each partition's
supervisor, the notifications' delivery, the metrics' reads and the live feed's poller).
"""

from __future__ import annotations


class OutageLatch:
    """Whether an outage was reported and has not ended yet."""

    __slots__ = ("failing",)

    def __init__(self) -> None:
        self.failing = False

    def fail(self) -> bool:
        """Note a failure; ``True`` when it starts an outage (the first failure since
        the last recovery), the one time to log it."""
        started = not self.failing
        self.failing = True
        return started

    def recover(self) -> bool:
        """Note a success; ``True`` when it ends an outage, the one time to log that."""
        ended = self.failing
        self.failing = False
        return ended
