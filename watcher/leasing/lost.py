"""Progress of lost leases: what their items did since their partitions' timelines
were last written, kept until the next renewal writes it into those timelines, so
that a steal does not drop it from a partition's rate and ETA."""

from __future__ import annotations

import logging
import time

from sqlalchemy.exc import SQLAlchemyError

from watcher.leasing.lease import Lease, handed_over_progress
from watcher.store import Store

log = logging.getLogger(__name__)


class LostProgress:
    """The lost leases whose done items their timelines lack, at most ``bound`` of them."""

    def __init__(self, store: Store, owner: str, bound: int) -> None:
        self.store = store
        self.owner = owner
        self.bound = bound
        self.leases: list[Lease] = []

    def keep(self, lease: Lease) -> None:
        """Keep ``lease``'s progress for the next hand-over, if its items did anything."""
        if lease.done.items:
            self.leases.append(lease)

    async def hand_over(self) -> int:
        """Write the kept progress into the partitions' timelines
        (:meth:`Store.timelines_hand_over`). Returns how many were written.

        Raises the database's error when the write fails; the leases stay kept for the
        next try, the oldest dropped beyond ``bound`` (a write that keeps failing must
        not grow the list for ever).
        """
        if not self.leases:
            return 0
        handing, self.leases = self.leases, []
        try:
            return await self.store.timelines_hand_over(
                handed_over_progress(handing, time.monotonic()))
        except BaseException:
            self.leases = (handing + self.leases)[-self.bound:]
            raise

    async def hand_over_or_keep(self) -> None:
        """:meth:`hand_over`; a database error is logged and the progress kept: a
        timeline is an estimate, and its write must not stop a renewal or a release."""
        try:
            await self.hand_over()
        except SQLAlchemyError as error:
            log.warning("action=timeline_hand_over_failed owner=%s partitions=%d error=%s",
                        self.owner, len(self.leases), type(error).__name__)
