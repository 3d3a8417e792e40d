"""The hold on every call to the handler while its service is down, and the probe that ends it.

A call that got no answer from the handler's service
(:class:`~watcher.protocol.HandlerUnavailableError`) starts a hold at this processor,
unless its item is past its bound of unpaid retries (:mod:`watcher.dispatch.unpaid`): no new call
to the handler starts (items, batches, reduce pages), and the probe asks the service
whether it answers again: first after :data:`PROBE_FIRST_WAIT`, then at waits that double
up to :data:`PROBE_MAX_WAIT`. The hold ends at the first probe that says it answers; a
processor whose handler has no probe ends it after the first wait, and its next calls are
the probe. One WARNING when a hold starts, one when it ends, never one per call.

:class:`HandlerHold` is one of the limits every call passes (:mod:`watcher.flow.limits`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final

from watcher.flow.waiters import Waiters
from watcher.rules.buckets import UNLIMITED

log = logging.getLogger(__name__)

PROBE_FIRST_WAIT: Final = 0.5
PROBE_MAX_WAIT: Final = 10.0
# A probe that takes longer than this says the service is still down.
PROBE_TIMEOUT: Final = 5.0

Probe = Callable[[], Awaitable[bool]]
"""Asks the handler's service whether it answers: ``True`` when it does. May raise
(taken as down)."""


class HandlerHold:
    """The hold of the module's docstring, as a limit: while held, it lets no call by.

    ``probe`` asks the service whether it answers (``None``: none, the hold ends after
    ``first_wait``); ``handler`` names it in the log; ``clock`` reads monotonic seconds.
    Used from one event loop.
    """

    def __init__(self, probe: Probe | None, *, handler: str = "default",
                 clock: Callable[[], float] = time.monotonic,
                 first_wait: float = PROBE_FIRST_WAIT, max_wait: float = PROBE_MAX_WAIT,
                 probe_timeout: float = PROBE_TIMEOUT) -> None:
        self._probe = probe
        self.handler = handler
        self._clock = clock
        self.first_wait, self.max_wait, self.probe_timeout = first_wait, max_wait, probe_timeout
        self.held = False
        self.since = 0.0
        self.failed_calls = 0  # calls that failed for the outage since the hold began
        self.holds = 0  # holds begun since the start
        self.probes = 0  # probes made since the start
        self._task: asyncio.Task[None] | None = None
        self._waiting = Waiters()

    # -- what the supervisors tell it ------------------------------------------

    def unavailable(self, reason: str) -> None:
        """A call got no answer from the service (``reason`` says why): hold every call
        and probe the service, unless a hold is on already (then it is only counted)."""
        self.failed_calls += 1
        if self.held:
            return
        self.held, self.since, self.failed_calls = True, self._clock(), 1
        self.holds += 1
        log.warning("action=handler_hold_started handler=%s error=%s (no new call to the "
                    "handler starts until it answers again; the calls held spend no "
                    "attempt)", self.handler, reason)
        self._task = asyncio.get_running_loop().create_task(
            self._probe_until_up(), name="handler-probe")

    async def _probe_until_up(self) -> None:
        wait, probes = self.first_wait, 0
        while True:
            await asyncio.sleep(wait)
            probes += 1
            self.probes += 1
            if self._probe is None or await self._answers():
                break
            wait = min(wait * 2, self.max_wait)
        self._end(probes)

    async def _answers(self) -> bool:
        assert self._probe is not None
        try:
            async with asyncio.timeout(self.probe_timeout):
                return bool(await self._probe())
        except Exception:  # a probe that fails says the service is down
            return False

    def _end(self, probes: int) -> None:
        self.held, self._task = False, None
        log.warning("action=handler_hold_ended handler=%s seconds=%.1f probes=%d "
                    "failed_calls=%d", self.handler, self._clock() - self.since, probes,
                    self.failed_calls)
        self._waiting.wake()

    async def stop(self) -> None:
        """Stop probing (the processor stops). Safe to call more than once."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- the limit (watcher.flow.limits.Limit) ----------------------------------------

    @property
    def refill_at(self) -> int:
        return UNLIMITED

    def free(self, now: float) -> int:
        return 0 if self.held else UNLIMITED

    def take(self, wanted: int, now: float) -> int:
        return 0 if self.held else wanted

    def untake(self, count: int) -> None:
        """Nothing is counted: nothing to return."""

    def give_back(self, count: int) -> None:
        """Nothing is counted: nothing to return."""

    def pass_turn(self, now: float) -> None:
        """Every waiting partition is woken when the hold ends."""

    def notify_when_free(self, event: asyncio.Event) -> None:
        self._waiting.add(event)

    def leave(self, event: asyncio.Event) -> None:
        self._waiting.remove(event)
