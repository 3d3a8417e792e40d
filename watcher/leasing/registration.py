"""This processor's row in the ``processors`` table: what it serves, and until when it
counts as live (:mod:`watcher.store.registry.processors`).

The lease keeper writes the row at its first lease cycle, again every renew interval
(until a lease duration ahead, by the database clock, as a lease's until), and at once
when what the watcher serves changes (:meth:`watcher.watcher.Watcher.serve`: a routes
file reloaded). A clean stop deletes it; a processor that crashed leaves it to expire.
The row is what lets ``processor status``, the console and the
``statefeed_partitions_unserved`` gauge tell a partition that waits at a place no live
processor serves (:func:`watcher.rules.served.places.unserved`).

Writing it is not a condition of leasing: a write that fails is logged once (and once
when one succeeds again) and tried at the next lease cycle, and the lease cycle goes on.
"""

from __future__ import annotations

import logging

from sqlalchemy.exc import SQLAlchemyError

from watcher.config import WatcherConfig
from watcher.outages import OutageLatch
from watcher.store import Store

log = logging.getLogger(__name__)

# What the row was last written with, before any write.
_NEVER = object()


class Registration:
    """Keeps this processor's row in the ``processors`` table."""

    def __init__(self, store: Store, owner: str) -> None:
        self.store = store
        self.owner = owner
        self._due = 0.0  # time.monotonic() of the next write (0: at the first cycle)
        self._written: object = _NEVER  # the ServedPipelines (or None) the row says
        self._outage = OutageLatch()

    async def keep(self, now: float, config: WatcherConfig) -> None:
        """Write the row when it is due (``now``, :func:`time.monotonic`, past a renew
        interval since the last write) or ``config`` serves other places than it says.
        Never raises a database error: one is logged, and the write is tried again at
        the next call."""
        if now < self._due and config.pipelines is self._written:
            return
        pipelines = config.pipelines
        try:
            await self.store.processors_register(
                self.owner, None if pipelines is None else pipelines.routes,
                config.lease_duration)
        except SQLAlchemyError as error:
            if self._outage.fail():
                log.warning("action=processor_register_failed owner=%s error=%s; tried again "
                            "at the next lease cycle (until then, the places it serves may "
                            "show as not served)", self.owner, type(error).__name__)
            return
        if self._outage.recover():
            log.info("action=processor_registered owner=%s", self.owner)
        self._written = pipelines
        self._due = now + config.renew_interval

    async def withdraw(self) -> None:
        """Delete the row (a clean stop). A database error is logged, and the row is left
        to expire within a lease duration."""
        try:
            await self.store.processors_unregister(self.owner)
        except SQLAlchemyError as error:
            log.debug("action=processor_unregister_failed owner=%s error=%s", self.owner,
                      type(error).__name__)
