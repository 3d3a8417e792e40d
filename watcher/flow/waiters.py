"""The partitions waiting on one limit to let calls by again, woken in the order they
began to wait (:mod:`watcher.flow.limits`: every limit keeps its own)."""

from __future__ import annotations

import asyncio


class Waiters:
    """Events of waiting partitions, each once, oldest first."""

    def __init__(self) -> None:
        self._events: dict[asyncio.Event, None] = {}

    def __bool__(self) -> bool:
        return bool(self._events)

    def __contains__(self, event: asyncio.Event) -> bool:
        return event in self._events

    def add(self, event: asyncio.Event) -> None:
        """``event``'s partition waits (a second add keeps its place)."""
        self._events.setdefault(event, None)

    def remove(self, event: asyncio.Event) -> None:
        """``event``'s partition no longer waits (it may not have)."""
        self._events.pop(event, None)

    def wake(self, *, everyone: bool = True) -> None:
        """Wake every waiting partition, or only the one that has waited longest."""
        while self._events:
            event = next(iter(self._events))
            del self._events[event]
            event.set()
            if not everyone:
                return
