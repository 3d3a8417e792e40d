"""A pool of dispatch slots shared by every partition a watcher holds."""

from __future__ import annotations

import asyncio


class SlotPool:
    """``capacity`` concurrent processor calls, shared across partitions.

    Partitions take what is free without waiting; when a slot frees up, every
    partition that asked to be told is woken, in the order they asked, so
    that they take turns at the freed slots.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.in_use = 0
        self._waiting: dict[asyncio.Event, None] = {}

    @property
    def free(self) -> int:
        """Slots not in use."""
        return self.capacity - self.in_use

    def take(self, wanted: int) -> int:
        """Take up to ``wanted`` slots; returns how many were taken (maybe 0)."""
        taken = max(0, min(wanted, self.free))
        self.in_use += taken
        return taken

    def give_back(self, count: int = 1) -> None:
        """Return slots and wake the partitions waiting for one."""
        self.in_use -= count
        waiting, self._waiting = self._waiting, {}
        for event in waiting:
            event.set()

    def notify_when_free(self, event: asyncio.Event) -> None:
        """Set ``event`` the next time a slot is given back."""
        self._waiting.setdefault(event, None)


async def wait_event(event: asyncio.Event, seconds: float) -> bool:
    """Wait until ``event`` is set or ``seconds`` pass; returns whether it was set.

    Uses ``asyncio.timeout`` rather than ``wait_for``: on Python 3.11,
    ``wait_for`` can swallow a cancellation that arrives as the event fires,
    which would leave a cancelled task running.
    """
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
        return True
    except TimeoutError:
        return False
