"""Fleet-wide rate limits, and the fleet-wide hold a handler's ``Retry-After`` asks for.

A rate limit is a token bucket in the database: a ``flow_controls`` row (of the
handler, or of a key) holds its tokens and when they were last refilled. Each
processor claims tokens from it for the calls it is about to make, a few times a
second while it has calls waiting, in a short transaction that holds the row
locked, so the fleet as a whole never makes more calls than the rate allows
(plus a burst of :data:`BURST_SECONDS` of it). Tokens a processor does not use
soon lapse here, so none is hoarded, and go back to the bucket with its next
claim, so none is lost: a processor slowed down (a busy machine, a long pause
of its event loop) does not take the fleet's rate below the limit.

A ``Retry-After`` from the handler (an HTTP 429, or a 503 with the header) sets
the handler row's ``blocked_until``; every processor reads it once a poll and
holds every call to that handler until then. A pool is made unknown (the handler's when
the processor starts, a service's at its first call by this processor, a key's at its
first use) and lets no call by until its hold and rate have been read, at once: a
processor started during a hold, or calling a service for the first time during one,
honours it from its first call.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable

from sqlalchemy.exc import SQLAlchemyError

from watcher.config import WatcherConfig
from watcher.flow.slots import wait_event
from watcher.flow.waiters import Waiters
from watcher.hooks import Hooks, SafeHooks
from watcher.models import FlowScope
from watcher.outages import OutageLatch
from watcher.rules.buckets import BURST_SECONDS, CLAIM_INTERVAL, TOKEN_LIFETIME, UNLIMITED
from watcher.store import Store

log = logging.getLogger(__name__)

# At most one WARNING about the handler's Retry-After holds this often; each says how
# many holds began since the last one.
THROTTLE_LOG_INTERVAL = 60.0

class TokenPool:
    """The tokens this processor holds of one bucket (the handler's or a key's), and
    the handler's hold when it is the handler's.

    Partitions take tokens without waiting, as slots; those that find none ask to
    be woken when tokens arrive or a hold ends.
    """

    def __init__(self, scope: FlowScope, name: str, demand: asyncio.Event) -> None:
        self.scope, self.name = scope, name
        # Its hold and rate have been read from the database: until then it lets nothing
        # by, so a hold stored before this processor first looked is honoured too.
        self.known = False
        self.rate: float | None = None
        self.tokens = 0
        self.expires_at = 0.0  # monotonic: claimed tokens lapse then
        self.blocked_until = 0.0  # monotonic: the handler's Retry-After hold
        self.unmet = 0  # calls refused for want of tokens since the last claim
        self.held = 0  # calls refused by a hold since they were last reported
        self.used = 0  # calls let through since the last claim
        self._demand = demand
        self._waiting = Waiters()

    @property
    def refill_at(self) -> int:
        """Free tokens worth waking a partition for: one, when a rate limits the pool."""
        return UNLIMITED if self.rate is None else 1

    def free(self, now: float) -> int:
        if now < self.blocked_until or not self.known:
            return 0
        if self.rate is None:
            return UNLIMITED
        return self.tokens if now < self.expires_at else 0

    def take(self, wanted: int, now: float) -> int:
        taken = max(0, min(wanted, self.free(now)))
        if self.rate is not None and taken:
            self.tokens -= taken
        self.used += taken
        if taken < wanted:
            if now < self.blocked_until:
                self.held += wanted - taken
            else:
                self.unmet += wanted - taken
                if self.rate is not None or not self.known:
                    self._demand.set()
        return taken

    def untake(self, count: int) -> None:
        """Return tokens just taken and not used (another limit refused the calls)."""
        if self.rate is not None:
            self.tokens += count
        self.used -= count

    def give_back(self, count: int) -> None:
        """Calls ended: tokens are spent, nothing comes back."""

    def pass_turn(self, now: float) -> None:
        """Nothing to pass on: every waiting partition is woken when tokens arrive."""

    def want(self) -> int:
        """Tokens to claim: enough to hold the calls refused and those made since the
        last claim (at least one interval's worth of the rate, at most a burst); 0 when
        nothing waited or ran since the last claim. Asked once the tokens held are
        surrendered (:meth:`surrender`), so a claim replaces them."""
        assert self.rate is not None
        if self.unmet == 0 and self.used == 0:
            return 0
        interval = max(1, math.ceil(self.rate * CLAIM_INTERVAL))
        burst = max(1, math.floor(self.rate * BURST_SECONDS))
        return min(burst, max(interval, self.unmet + self.used))

    def surrender(self) -> int:
        """Give up every token held, to return them to the bucket with the next claim.

        A claim's tokens then live one :data:`TOKEN_LIFETIME` at most. Carried into
        each claim instead, tokens held would live on while the bucket refilled as
        if they were spent: every processor could keep a burst of its own, and the
        fleet's calls briefly run over its rate."""
        count, self.tokens = self.tokens, 0
        return count

    def claimed(self, tokens: int, now: float) -> None:
        """``tokens`` more were claimed: they last until :data:`TOKEN_LIFETIME` from
        ``now`` (the claim surrendered those held before it: :meth:`surrender`)."""
        self.tokens += tokens
        self.expires_at = now + TOKEN_LIFETIME
        self.unmet = self.used = 0
        self._waiting.wake()

    def learned(self) -> None:
        """Its hold (and rate) have been read: wake the partitions waiting to know them."""
        if not self.known:
            self.known = True
            self._waiting.wake()

    def block(self, until: float) -> None:
        """Hold every call until ``until`` (monotonic); a later hold wins."""
        self.blocked_until = max(self.blocked_until, until)

    def unblock_due(self, now: float) -> bool:
        """Whether a hold has just ended (its waiters are woken)."""
        if self.blocked_until and now >= self.blocked_until:
            self.blocked_until = 0.0
            self._waiting.wake()
            return True
        return False

    def notify_when_free(self, event: asyncio.Event) -> None:
        self._waiting.add(event)

    def leave(self, event: asyncio.Event) -> None:
        self._waiting.remove(event)


class RateLimiter:
    """This processor's token pools, the loop that claims their tokens, and the
    handler's ``Retry-After`` holds."""

    def __init__(self, store: Store, config: WatcherConfig, hooks: Hooks | SafeHooks,
                 clock: Callable[[], float] = time.monotonic,
                 db_round: asyncio.Lock | None = None) -> None:
        self.store = store
        self.config = config
        self.hooks = hooks
        self._clock = clock
        # Held while the loop talks to the database: a stop waits for it (FlowControl.stop).
        self._db_round = db_round or asyncio.Lock()
        self._demand = asyncio.Event()
        self.handler = TokenPool(FlowScope.HANDLER, config.handler_name, self._demand)
        self.handler.rate = config.rate_limit
        self._demand.set()  # read its hold at once: one may be on already
        self.keys: dict[str, TokenPool] = {}
        # The pools of the services a routing processor calls (docs/how-to/pipelines.md),
        # each named by its URL without secrets: a rate and a Retry-After hold per service.
        self.services: dict[str, TokenPool] = {}
        self._outage = OutageLatch()
        self._pending_blocks: dict[str, float] = {}  # holds to tell the fleet of, in seconds
        self._throttles = 0  # Retry-After holds begun since the last line about them
        self._next_throttle_line = 0.0  # monotonic: when the next line may be written

    def key_pool(self, key: str) -> TokenPool:
        pool = self.keys.get(key)
        if pool is None:
            pool = self.keys[key] = TokenPool(FlowScope.KEY, key, self._demand)
            self._demand.set()  # its rate is read at the loop's next pass
        return pool

    def service_pool(self, service: str | None) -> TokenPool:
        """The pool of ``service`` (its URL without secrets), made at its first call;
        ``None``: the handler's (:attr:`handler`). A pool just made lets no call by
        until the service's hold has been read (at once): another processor may have
        stored one before this one ever called the service."""
        if service is None:
            return self.handler
        pool = self.services.get(service)
        if pool is None:
            pool = self.services[service] = TokenPool(FlowScope.HANDLER, service, self._demand)
            pool.rate = self.config.rate_limit
            self._demand.set()
        return pool

    def throttled(self, seconds: float, service: str | None = None) -> None:
        """The handler (``service``; ``None``: the one handler) answered ``Retry-After:
        seconds``: hold every call to it here at once, and tell the fleet (at the next
        claim loop pass). Calls to other services go on."""
        now = self._clock()
        seconds = max(seconds, CLAIM_INTERVAL)  # "Retry-After: 0" still pauses a moment
        pool = self.service_pool(service)
        pool.block(now + seconds)
        self._pending_blocks[pool.name] = max(self._pending_blocks.get(pool.name, 0.0), seconds)
        self.hooks.handler_blocked(seconds)
        self._demand.set()
        self._throttles += 1
        if now >= self._next_throttle_line:
            log.warning("action=handler_throttled handler=%s seconds=%.1f holds=%d (the "
                        "handler answered Retry-After: every processor holds its calls to "
                        "it that long; the items spend no attempt, up to "
                        "--max-unpaid-retries each; at most one line a minute)",
                        pool.name, seconds, self._throttles)
            self._throttles = 0
            self._next_throttle_line = now + THROTTLE_LOG_INTERVAL

    async def run(self, held_keys: Callable[[], Iterable[str]]) -> None:
        """Claim tokens while calls wait on a rate (every :data:`CLAIM_INTERVAL`),
        publish and read the handler's holds (every poll), until cancelled."""
        next_read = 0.0
        while True:
            await wait_event(self._demand, self._next_wait())
            self._demand.clear()
            now = self._clock()
            try:
                async with self._db_round:
                    await self._publish_block()
                    if now >= next_read or any(not pool.known for pool in self._pools()):
                        next_read = now + self.config.poll_interval
                        await self._read_holds_and_rates(held_keys)
                    await self._claim(now)
            except SQLAlchemyError as error:
                if self._outage.fail():
                    log.warning("action=rate_limits_failed owner=%s error=%s",
                                self.config.owner_id, type(error).__name__)
                await asyncio.sleep(self.config.poll_interval)
                continue
            if self._outage.recover():
                log.info("action=rate_limits_recovered owner=%s", self.config.owner_id)
            await asyncio.sleep(CLAIM_INTERVAL)

    async def learn(self, held_keys: Callable[[], Iterable[str]]) -> None:
        """Read now the holds and rates of the pools not known yet, which let no call by
        until then: for a watcher driven by its ``run_once`` alone, with no :meth:`run`
        loop to read them. Nothing when every pool is known.

        Raises the database's error when a read fails.
        """
        if any(not pool.known for pool in self._pools()):
            async with self._db_round:
                await self._read_holds_and_rates(held_keys)

    def _pools(self) -> tuple[TokenPool, ...]:
        return (self.handler, *self.services.values(), *self.keys.values())

    def _next_wait(self) -> float:
        """Until the next poll, or sooner when a hold ends then."""
        wait = self.config.poll_interval
        for pool in (self.handler, *self.services.values()):
            if pool.blocked_until:
                wait = min(wait, max(0.0, pool.blocked_until - self._clock()))
        return wait

    async def _publish_block(self) -> None:
        pending, self._pending_blocks = self._pending_blocks, {}
        for name, seconds in pending.items():
            await self.store.flow_block(FlowScope.HANDLER, name, seconds)

    async def _read_holds_and_rates(self, held_keys: Callable[[], Iterable[str]]) -> None:
        """The holds of the handler and of each service called (a read each), and the
        rates set for the held keys. A pool is dropped only when no held partition has
        its key, decided after the reads: a partition leased meanwhile may have made its
        pool. A pool made during the reads is read at the next pass."""
        now = self._clock()
        for pool in (self.handler, *self.services.values()):
            pool.unblock_due(now)
            left = await self.store.flow_blocked_for(FlowScope.HANDLER, pool.name)
            if left > 0:
                pool.block(now + left)
            pool.learned()
        keys = sorted(self.keys)
        rates = await self.store.key_rates(keys) if keys else {}
        held = set(held_keys())
        for key in [key for key in self.keys if key not in held]:
            del self.keys[key]
        read = set(keys)
        for key, pool in self.keys.items():
            if key not in read:
                continue  # made during the read: its rate is read at the next pass
            pool.rate = rates.get(key, self.config.rate_limit_per_key)
            if not pool.known:
                pool.known = True
                pool.claimed(0, now)  # wakes the partitions waiting to learn it

    async def _claim(self, now: float) -> None:
        """Claim tokens for each pool whose calls wait (or that used its tokens)."""
        for pool in (self.handler, *self.services.values(), *self.keys.values()):
            pool.unblock_due(now)
            if pool.held:
                self.hooks.calls_throttled(pool.scope.value, "block", pool.held)
                pool.held = 0
            if pool.rate is None:
                continue
            returned = pool.surrender()  # back to the bucket: claimed again if needed
            want = 0 if now < pool.blocked_until else pool.want()
            if want == 0 and returned == 0:
                continue
            if pool.unmet:
                self.hooks.calls_throttled(pool.scope.value, "rate", pool.unmet)
            asked = self._clock()
            granted = await self.store.flow_tokens_claim(
                pool.scope, pool.name, rate=pool.rate, want=want, returned=returned)
            if want:
                # Their lifetime counts from before the claim, as a grant's does: a slow
                # answer (a busy machine) does not let them start calls later.
                pool.claimed(granted, asked)
