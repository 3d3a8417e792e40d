"""Hand-overs: how a processor below its fair share gets partitions from a busy one
without calling any item twice.

A steal takes a lease from under its holder, whose calls in flight can then not be
written and run again under the thief. So a processor that would steal *asks*
instead: it holds the leader lease :func:`~watcher.store.fleet.handover_duty` (by the
database clock, renewed while it asks). Every processor reads who asks at each
balance cycle and counts the askers in the fair share
(:func:`watcher.rules.balance.with_askers`); the one an asker would steal from hands the
partitions over as a graceful stop does: it starts no new call on them, writes what
is in flight, and releases them (:meth:`watcher.watcher.Watcher.run_once`); the
asker takes them as free partitions. A holder that does not answer within
:func:`patience` (a processor of an older version, or one stalled) has them stolen
as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from sqlalchemy.exc import SQLAlchemyError

from watcher.config import WatcherConfig
from watcher.leasing.lease import Lease
from watcher.rules.balance import hand_over_count
from watcher.store import Store
from watcher.store.fleet import handover_duty

log = logging.getLogger(__name__)


def grace(config: WatcherConfig) -> float:
    """How long a hand-over waits for its calls in flight to finish and be written: a
    lease, or ``shutdown_timeout`` if less. A call that runs longer is cancelled (and
    runs again under the next holder, as after a steal): a partition whose calls never
    end must still move."""
    return min(config.shutdown_timeout, config.lease_duration)


def patience(config: WatcherConfig) -> float:
    """How long an asker waits for a hand-over before it steals: the holder's next
    balance cycle, its :func:`grace`, and a lease."""
    return config.renew_interval + grace(config) + config.lease_duration


class HandOverAsks:
    """The asks for hand-overs: who asks (read once a renew interval), which leases this
    processor hands over to them, and its own ask: made, renewed and withdrawn."""

    def __init__(self, store: Store, config: WatcherConfig) -> None:
        self.store = store
        self.config = config
        self.since: float | None = None  # when this processor's ask began (monotonic)
        self.askers: list[str] = []  # the other processors asking, as last read
        self._due = 0.0

    async def hand_over_due(self, now: float, leases: Iterable[Lease]) -> tuple[str, ...]:
        """Once a renew interval: read which processors ask for a hand-over, and choose
        which of ``leases`` this processor hands over to them
        (:func:`watcher.rules.balance.hand_over_count`); those are marked ``handing_over``
        (the watcher drains and releases them). Returns their partitions.

        Raises the database's error when a read fails.
        """
        if now < self._due:
            return ()
        self._due = now + self.config.renew_interval
        owner = self.config.owner_id
        self.askers = [asker for asker in await self.store.handover_askers()
                       if asker != owner]
        held = [lease for lease in leases if not (lease.lost or lease.closed)]
        if not self.askers or not held:
            return ()
        handing = sum(lease.handing_over for lease in held)
        count = hand_over_count(owner, await self.store.lease_stats(), self.askers,
                                handing=handing, max_steal=self.config.steal_batch)
        # The latest taken first: the longest held are nearest their end.
        chosen = [lease for lease in reversed(held) if not lease.handing_over][:count]
        for lease in chosen:
            lease.handing_over = True
            log.info("action=lease_handing_over partition=%s pipeline=%s owner=%s to=%s",
                     lease.partition_id, lease.settings.pipeline, owner, ",".join(self.askers))
        return tuple(lease.partition_id for lease in chosen)

    async def ask(self, victim: str) -> bool:
        """Ask (or go on asking) for partitions, which ``victim`` should hand over.
        Returns whether the ask has waited past :func:`patience`: then steal.

        Raises the database's error when the write fails.
        """
        now = time.monotonic()
        if self.since is None:
            self.since = now
            log.info("action=hand_over_asked owner=%s from=%s", self.config.owner_id, victim)
        await self.store.leader_take(handover_duty(self.config.owner_id),
                                     self.config.owner_id, self.config.lease_duration)
        if now - self.since < patience(self.config):
            return False
        log.warning("action=hand_over_unanswered owner=%s from=%s waited=%.1fs; stealing "
                    "(calls in flight there may run again)", self.config.owner_id, victim,
                    now - self.since)
        self.since = now
        return True

    async def withdraw(self) -> None:
        """Stop asking (this processor has its share, or free partitions to take).

        Raises the database's error when the write fails.
        """
        if self.since is None:
            return
        self.since = None
        await self.store.leader_release(handover_duty(self.config.owner_id),
                                        self.config.owner_id)

    async def withdraw_or_expire(self) -> None:
        """:meth:`withdraw`, or, when the database fails, leave the ask to expire within
        a lease (a stopping processor's last writes must not fail on it)."""
        try:
            await self.withdraw()
        except SQLAlchemyError as error:
            log.debug("action=hand_over_withdraw_failed owner=%s error=%s",
                      self.config.owner_id, type(error).__name__)
