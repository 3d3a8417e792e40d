"""A processor's side of per-key limits: its key pools, and the loop that keeps their
grants (:mod:`watcher.flow.key_pools`) in step with the database.

Each lease cycle, or at once when a partition finds its key's pool empty, the
limiter reads the limits set for the keys it holds (one statement) and, for each
limited key, writes its grant (one short transaction per key). Keys without a
limit, and processors without keyed partitions, cost one read per cycle at most.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from sqlalchemy.exc import SQLAlchemyError

from watcher.config import WatcherConfig
from watcher.flow.key_pools import KeyPool
from watcher.flow.slots import wait_event
from watcher.hooks import Hooks, SafeHooks
from watcher.outages import OutageLatch
from watcher.store import Store

log = logging.getLogger(__name__)


class KeyLimiter:
    """The key pools of one processor, and their grants."""

    def __init__(self, store: Store, config: WatcherConfig, hooks: Hooks | SafeHooks,
                 clock: Callable[[], float] = time.monotonic,
                 db_round: asyncio.Lock | None = None) -> None:
        self.store = store
        self.config = config
        self.hooks = hooks
        # Held while the loop talks to the database: a stop waits for it (FlowControl.stop).
        self._db_round = db_round or asyncio.Lock()
        self.pools: dict[str, KeyPool] = {}
        self._clock = clock
        self._wanted = asyncio.Event()  # a pool has demand it cannot meet
        self._outage = OutageLatch()

    def pool(self, key: str) -> KeyPool:
        """Key ``key``'s pool (made on first use, and its limit read at the loop's next
        pass rather than at the next renewal: it lets nothing by until then)."""
        pool = self.pools.get(key)
        if pool is None:
            pool = self.pools[key] = KeyPool(key, self._wanted)
            self._wanted.set()
        return pool

    async def run(self, held_keys: Callable[[], Iterable[str]]) -> None:
        """Refresh grants every renew interval, and at once when demand goes unmet,
        until cancelled. ``held_keys`` gives the keys of the partitions held now."""
        while True:
            await wait_event(self._wanted, self.config.renew_interval)
            self._wanted.clear()
            try:
                async with self._db_round:
                    await self.refresh(set(held_keys()))
            except SQLAlchemyError as error:
                # Grants lapse by themselves: a key's calls stop when its grant's until
                # passes (KeyPool.free), so an outage can only under-use a limit.
                if self._outage.fail():
                    log.warning("action=key_grants_failed owner=%s error=%s",
                                self.config.owner_id, type(error).__name__)
                await asyncio.sleep(self.config.poll_interval)
            else:
                if self._outage.recover():
                    log.info("action=key_grants_recovered owner=%s", self.config.owner_id)
            # Demand that a grant cannot meet (the limit is in use elsewhere) comes back
            # at every poll of every waiting partition: ask the database at most once a
            # poll interval.
            await asyncio.sleep(self.config.poll_interval)

    async def refresh(self, held: set[str]) -> None:
        """Read the limits of the pools' keys, and write each limited key's grant.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed.
        """
        for key in [key for key, pool in self.pools.items() if key not in held and pool.idle]:
            del self.pools[key]
        if not self.pools:
            return
        keys = list(self.pools)
        set_limits = await self.store.key_limits(keys)
        default = self.config.max_inflight_per_key
        for key in keys:
            pool = self.pools.get(key)
            if pool is None:
                continue
            # Only the keys whose limits were just read: a pool made during the read
            # (a partition of a new key leased meanwhile) lets nothing by until the
            # next pass reads its limit. Taken as unlimited instead, a limited key
            # ran as many calls as this processor's slots at once.
            limit = set_limits.get(key, default)
            if limit is None:
                if pool.granted:  # a limit was lifted: give the grant back
                    await self._grant(pool, limit=0, wanted=0)
                pool.unlimited()
                continue
            await self._grant(pool, limit=limit, wanted=pool.wanted(limit))

    async def _grant(self, pool: KeyPool, *, limit: int, wanted: int) -> None:
        started = self._clock()
        in_use = pool.freeze()
        try:
            decision = await self.store.flow_grant(
                pool.key, self.config.owner_id, limit=limit, wanted=wanted, in_use=in_use,
                duration=self.config.lease_duration)
        finally:
            pool.frozen_at = None
        # The grant's until is a lease duration from the write, by the database clock;
        # counting from before the write, the pool lets it lapse no later than that.
        pool.granted_now(limit, decision, started + self.config.lease_duration)
        self.hooks.key_grant(pool.key, pool.in_use, decision.slots, limit)

    async def release(self) -> None:
        """Give back every grant (the processor stops)."""
        try:
            await self.store.flow_grants_release(self.config.owner_id)
        except SQLAlchemyError as error:
            log.warning("action=key_grants_release_failed owner=%s error=%s; they lapse in "
                        "%s s", self.config.owner_id, type(error).__name__,
                        self.config.lease_duration)
