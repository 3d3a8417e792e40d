"""Flow control at one processor: the limits a partition's calls pass through.

Every call needs a slot of the processor's pool (``--concurrency``) and passes
the *limits* of its flow controls: the hold while the handler's service is down
(:mod:`watcher.flow.handler_hold`), the handler's token pool (its rate limit and
its ``Retry-After`` holds) and, for a keyed partition, its key's in-flight pool
(:mod:`watcher.flow.key_pools`) and token pool (:mod:`watcher.flow.rates`).
:class:`FlowSlots` puts them together behind the interface the supervisor uses
for slots (:class:`watcher.flow.slots.Slots`), so dispatch itself does not change;
:class:`FlowControl` owns the limits and the loops that keep them in step with
the database.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Protocol

from watcher.config import WatcherConfig
from watcher.flow.handler_hold import HandlerHold, Probe
from watcher.flow.key_limiter import KeyLimiter
from watcher.flow.rates import RateLimiter
from watcher.flow.slots import SlotPool, Slots
from watcher.hooks import Hooks, SafeHooks
from watcher.records import PartitionSettings
from watcher.store import Store

log = logging.getLogger(__name__)


class Limit(Protocol):
    """One limit a call passes: slots in flight, or tokens."""

    @property
    def refill_at(self) -> int: ...
    def free(self, now: float) -> int: ...
    def take(self, wanted: int, now: float) -> int: ...
    def untake(self, count: int) -> None: ...
    def give_back(self, count: int) -> None: ...
    def pass_turn(self, now: float) -> None: ...
    def notify_when_free(self, event: asyncio.Event) -> None: ...
    def leave(self, event: asyncio.Event) -> None: ...


class FlowSlots:
    """A partition's slots: the processor's pool, and every limit of its flow controls.
    A call is made only when all of them let it through."""

    def __init__(self, shared: SlotPool, limits: Sequence[Limit],
                 clock: Callable[[], float], key: str = "") -> None:
        self.shared = shared
        self.limits = tuple(limits)
        self._now = clock
        self.key = key  # the partition's concurrency key: turns are shared across keys

    @property
    def refill_at(self) -> int:
        """Free slots worth a turn: the processor pool's quarter, or less when a limit's
        limit is smaller (a key limited to 4 calls is worth waking for one)."""
        return min(self.shared.refill_at, *(limit.refill_at for limit in self.limits))

    @property
    def in_use(self) -> int:
        return self.shared.in_use

    @property
    def free(self) -> int:
        now = self._now()
        return min(self.shared.free_for(self.key), *(limit.free(now) for limit in self.limits))

    def take(self, wanted: int) -> int:
        now = self._now()
        allowed = min(wanted, self.shared.free_for(self.key))
        passed: list[Limit] = []
        for limit in self.limits:
            got = limit.take(allowed, now)
            if got < allowed:
                for earlier in passed:
                    earlier.untake(allowed - got)
                allowed = got
            passed.append(limit)
        return self.shared.take(allowed, self.key)

    def give_back(self, count: int = 1) -> None:
        for limit in self.limits:
            limit.give_back(count)
        self.shared.give_back(count, self.key)

    def give_back_later(self, count: int, seconds: float) -> None:
        """Abandoned calls: the processor's pool takes their slots back now, the limits
        after ``seconds`` (the handler may still be running them)."""
        self.shared.give_back(count, self.key)
        loop = asyncio.get_running_loop()
        for limit in self.limits:
            loop.call_later(seconds, limit.give_back, count)

    def notify_when_free(self, event: asyncio.Event, order: float = 0.0, *,
                         ready: bool = False) -> None:
        """Be woken by the limit that holds the partition back: a limit with fewer than
        :attr:`refill_at` free, else the processor's pool (``order`` and ``ready`` as
        :meth:`SlotPool.notify_when_free` takes them). (Waiting on the pool while a
        limit holds it back would wake it at once, again and again.)"""
        now = self._now()
        enough = self.refill_at
        for limit in self.limits:
            if limit.free(now) < enough:
                limit.notify_when_free(event)
                return
        self.shared.notify_when_free(event, order, ready=ready, key=self.key)

    def pass_turn(self) -> None:
        now = self._now()
        for limit in self.limits:
            limit.pass_turn(now)
        self.shared.pass_turn()

    def leave(self, event: asyncio.Event) -> None:
        for limit in self.limits:
            limit.leave(event)
        self.shared.leave(event)

    def calls_started(self, count: int) -> None:
        self.shared.calls_started(count)

    def calls_ended(self, count: int) -> None:
        self.shared.calls_ended(count)


class RoutedLimit:
    """The limit of the service a partition's calls go to now: its current gate's, which
    ``target`` returns (a dictionary lookup), as a processor routing by pipeline gives it
    (docs/how-to/pipelines.md). Every call asks it anew, so a gate move changes service."""

    def __init__(self, target: Callable[[], Limit]) -> None:
        self._target = target
        self._notified: set[Limit] = set()

    @property
    def refill_at(self) -> int:
        return self._target().refill_at

    def free(self, now: float) -> int:
        return self._target().free(now)

    def take(self, wanted: int, now: float) -> int:
        return self._target().take(wanted, now)

    def untake(self, count: int) -> None:
        self._target().untake(count)

    def give_back(self, count: int) -> None:
        self._target().give_back(count)

    def pass_turn(self, now: float) -> None:
        self._target().pass_turn(now)

    def notify_when_free(self, event: asyncio.Event) -> None:
        target = self._target()
        self._notified.add(target)
        target.notify_when_free(event)

    def leave(self, event: asyncio.Event) -> None:
        # Every service's it waited on: the gate may have moved on since.
        notified, self._notified = self._notified, set()
        for limit in notified:
            limit.leave(event)


ServiceOf = Callable[[], str | None]
"""The service a partition's calls go to now (its URL without secrets); ``None``: the
one handler of a processor that does not route."""

ServiceProbe = Callable[[str], Awaitable[bool]]
"""Asks one service whether it answers (an HTTP processor routing by pipeline has one)."""


class FlowControl:
    """The flow controls of one processor: its key pools and token pools, and the loops
    that keep them in step with the database.

    ``probe`` asks the one handler's service whether it answers; ``service_probe`` asks
    one service of a processor that routes, whose holds are per service
    (:meth:`hold_for`): a service down holds only its own calls."""

    def __init__(self, store: Store, config: WatcherConfig, hooks: Hooks | SafeHooks,
                 clock: Callable[[], float] = time.monotonic, *,
                 probe: Probe | None = None,
                 service_probe: ServiceProbe | None = None) -> None:
        # One round of database work at a time, so that a stop never cuts one short.
        self._db_round = asyncio.Lock()
        self._stop_wait = config.shutdown_timeout
        self.keys = KeyLimiter(store, config, hooks, clock, self._db_round)
        self.rates = RateLimiter(store, config, hooks, clock, self._db_round)
        # This processor's hold while the handler's service is down; ``probe`` asks it.
        self.hold = HandlerHold(probe, handler=config.handler_name, clock=clock)
        self.holds: dict[str, HandlerHold] = {}  # per service, when the processor routes
        self._service_probe = service_probe
        self._clock = clock

    def hold_for(self, service: str | None) -> HandlerHold:
        """The hold on the calls to ``service`` (made at its first use); ``None``: the
        one handler's (:attr:`hold`)."""
        if service is None:
            return self.hold
        hold = self.holds.get(service)
        if hold is None:
            probe = (None if self._service_probe is None
                     else functools.partial(self._service_probe, service))
            hold = self.holds[service] = HandlerHold(probe, handler=service, clock=self._clock)
        return hold

    def slots_for(self, settings: PartitionSettings, shared: SlotPool,
                  service: ServiceOf | None = None) -> Slots:
        """The slots a partition with ``settings`` dispatches in; with ``service``, its
        calls pass the hold and the token pool of the service it calls now."""
        limits: list[Limit] = [self.hold, self.rates.handler]
        if service is not None:
            limits = [RoutedLimit(lambda: self.hold_for(service())),
                      RoutedLimit(lambda: self.rates.service_pool(service()))]
        key = settings.key
        if key:
            limits += [self.keys.pool(key), self.rates.key_pool(key)]
        return FlowSlots(shared, limits, self._clock, key)

    def holds_of(self, service: ServiceOf | None
                 ) -> tuple[Callable[[float], None], Callable[[str], None]]:
        """What holds a partition's calls for a ``Retry-After`` and for an outage: the
        hold of the service it calls now (``service``; ``None``: the one handler's)."""
        if service is None:
            return self.throttled, self.unavailable
        return (lambda seconds: self.throttled(seconds, service()),
                lambda reason: self.unavailable(reason, service()))

    def throttled(self, seconds: float, service: str | None = None) -> None:
        """The handler (``service``) answered ``Retry-After: seconds``: hold its calls,
        fleet-wide."""
        self.rates.throttled(seconds, service)

    def unavailable(self, reason: str, service: str | None = None) -> None:
        """A call got no answer from the handler's service (``service``): hold its calls
        here and probe it (:class:`~watcher.flow.handler_hold.HandlerHold`)."""
        self.hold_for(service).unavailable(reason)

    async def run(self, held_keys: Callable[[], Iterable[str]]) -> None:
        """Keep grants and tokens in step until cancelled."""
        await asyncio.gather(self.keys.run(held_keys), self.rates.run(held_keys))

    async def learn(self, held_keys: Callable[[], Iterable[str]]) -> None:
        """Read the holds and rates of the pools not known yet, now
        (:meth:`~watcher.flow.rates.RateLimiter.learn`).

        Raises the database's error when a read fails.
        """
        await self.rates.learn(held_keys)

    async def stop(self, running: asyncio.Task[None]) -> None:
        """Stop ``running`` (the task of :meth:`run`) between two rounds of its database
        work, not inside one: waits for a round under way to end (up to the shutdown
        timeout, then cancels it all the same), then cancels it.

        A query cancelled mid-way makes SQLAlchemy invalidate its connection; with
        aiosqlite that close can outlive the connection's thread and leave a task that
        never ends, which hung a stopping process at exit.
        """
        for hold in (self.hold, *self.holds.values()):
            await hold.stop()
        between_rounds = False
        try:
            async with asyncio.timeout(self._stop_wait):
                await self._db_round.acquire()
            between_rounds = True
        except TimeoutError:
            log.debug("action=flow_control_stop_waited seconds=%s", self._stop_wait)
        try:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
        finally:
            if between_rounds:
                self._db_round.release()

    async def release(self) -> None:
        """Give back what this processor holds (it stops)."""
        await self.keys.release()
