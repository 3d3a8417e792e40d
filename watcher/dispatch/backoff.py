"""Waits for the retry loops off the hot path, built on tenacity.

Start-up's wait for the database, the lease loop, the result writer's retries
and the PostgreSQL listener all retry with doubling waits up to a ceiling. A
lock conflict (a deadlock victim, a lock wait timeout) is no outage: the loops
that can meet one retry it after a short fixed wait instead. A stop or a
wake-up cuts any wait short (:func:`sleep_until`), so shutting down never
waits out a backoff.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from tenacity import RetryCallState, wait_exponential

from watcher.flow.slots import wait_event
from watcher.store.drivers.conflicts import is_lock_conflict


def last_error(state: RetryCallState) -> BaseException | None:
    """The error the last attempt raised (``None`` if it raised nothing)."""
    return state.outcome.exception() if state.outcome is not None else None


def backoff(*, first: float, maximum: float, conflict: float | None = None
            ) -> Callable[[RetryCallState], float]:
    """A tenacity ``wait``: ``first`` seconds, doubling after each failure up to ``maximum``.

    With ``conflict`` given, an attempt that lost a lock conflict is retried
    after ``conflict`` seconds instead.
    """
    doubling = wait_exponential(multiplier=first, max=maximum)

    def wait(state: RetryCallState) -> float:
        error = last_error(state)
        if conflict is not None and error is not None and is_lock_conflict(error):
            return conflict
        return float(doubling(state))

    return wait


def sleep_until(event: asyncio.Event) -> Callable[[float], Awaitable[None]]:
    """A tenacity ``sleep`` that ends early once ``event`` is set.

    The loop then makes its next attempt at once; each loop checks there
    whether it is stopping.
    """

    async def sleep(seconds: float) -> None:
        await wait_event(event, seconds)

    return sleep
