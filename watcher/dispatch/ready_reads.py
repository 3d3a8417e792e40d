"""A partition's reads of ready items at its gate, and the rows it holds read ahead.

A read asks for the rows its slots can start now and for up to a round more, as the
watcher's read-ahead room (:class:`~watcher.flow.slots.ReadAheadPool`) allows. The rows
beyond the slots are held (:class:`~watcher.dispatch.in_hand.ItemsInHand`) and start as
slots free, before anything is read again, so a partition's next calls need no read
of their own: a small partition is read once, and a big one's next batch is in hand
while the last one's results are written. Rows held are a snapshot: they are dropped
when a client writes the partition (a notification), when the gate moves, and once a
poll interval has passed since their read (so a pause, which every read sees, stops
new calls within a poll, as it does without reading ahead). Dropping them loses
nothing: the items stay available in the database.

Items an answer spawned at the gate are held the same way once their write is done
(:meth:`ReadyReads.hold_spawned`): their rows are known (new, version 1, no attempt),
so the next level of a spawn tree starts without a read of its own.
"""

from __future__ import annotations

import time

from sqlalchemy.exc import SQLAlchemyError

from watcher.dispatch.context import PartitionContext
from watcher.dispatch.in_hand import ItemsInHand
from watcher.dispatch.oversize import fail_unreadable
from watcher.dispatch.writer import ResultWriter
from watcher.flow.slots import ReadAheadPool
from watcher.records import ReadyItem
from watcher.rules.decisions import RetryPolicy
from watcher.store.db.round_trips import DatabaseTimeoutError

# Items in hand up to this many are excluded by id in the read query; beyond it
# the read fetches extra rows and filters them here.
MAX_EXCLUDED = 1000


class ReadyReads:
    """Reads one leased partition's ready items, and keeps the rows it read ahead."""

    def __init__(self, context: PartitionContext, *, writer: ResultWriter,
                 in_hand: ItemsInHand, policy: RetryPolicy, room: ReadAheadPool) -> None:
        self.lease = context.lease
        self.store = context.store
        self.writer = writer
        self.keeper = context.keeper
        self.in_hand = in_hand
        self.config = context.config
        self.policy = policy
        self.room = room
        self.closed = False

    def take_ahead(self, count: int) -> list[ReadyItem]:
        """Up to ``count`` of the rows read ahead, to start now; none when they may not
        start (none held, a client wrote the partition, the gate moved, or they are a
        poll interval old: the caller reads instead)."""
        in_hand = self.in_hand
        if self.lease.notified or not in_hand.ahead_usable(
                self.lease.gate, time.monotonic(), self.config.poll_interval):
            return []
        rows = in_hand.take_ahead(count)
        self.room.give_back(len(rows))
        return rows

    def hold_spawned(self, rows: list[ReadyItem], mark: int | None) -> bool:
        """Hold ``rows``, items an answer spawned at the gate (just written), to start as
        slots free without a read; ``mark`` is the in-hand read mark from before the
        answer's write was sent (no read may have run since). Returns whether all of
        them are held; when not, none is, and a read finds them.
        """
        if self.closed or len(rows) > self.room.room:
            return False
        if not self.in_hand.add_ahead(rows, self.lease.gate, time.monotonic(), mark):
            return False
        self.room.hold(len(rows))
        return True

    def close(self) -> None:
        """The supervisor ends: give back what is held, and hold nothing more (answers
        written after it ended spawn nothing into its hands)."""
        self.closed = True
        self.drop_ahead()

    def drop_ahead(self) -> None:
        """Forget the rows read ahead, and give their room back to the watcher."""
        self.room.give_back(self.in_hand.drop_ahead())

    async def read(self, slots: int) -> list[ReadyItem]:
        """Read ready items at the lease's gate: the first ``slots`` to start now, and up
        to a round more (as the watcher's room allows) held to start as slots free.

        Any rows still held are dropped first: this read returns them again as they
        are now. Items it cannot read because one is too large are failed instead
        (:func:`~watcher.dispatch.oversize.fail_unreadable`), and nothing is returned.

        Raises the database's error when the read fails otherwise.
        """
        self.drop_ahead()
        in_hand, gate, pid = self.in_hand, self.lease.gate, self.lease.partition_id
        wanted = slots + min(self.config.concurrency, self.room.room)
        read = in_hand.begin_read()
        self.lease.read_started()
        exclude = in_hand.ids()
        in_hand.reading = True
        try:
            try:
                if len(exclude) <= MAX_EXCLUDED:
                    ready = await self.store.items_ready(pid, gate, wanted, exclude)
                else:  # too many to name in a query: read more and filter here
                    ready = await self.store.items_ready(pid, gate, wanted + len(exclude))
            finally:
                in_hand.reading = False
        except SQLAlchemyError as error:
            # A read that timed out says nothing of the items' sizes: skip the look-up.
            if (not isinstance(error, DatabaseTimeoutError)
                    and await fail_unreadable(self.store, self.writer, pid, gate,
                                              self.config.max_item_bytes, self.policy,
                                              limit_rows=MAX_EXCLUDED,
                                              pipeline=self.lease.settings.pipeline)):
                return []
            raise
        if self.keeper.expired(self.lease):  # the read outlasted the lease: start nothing
            in_hand.end_read(read, [], wanted, time.monotonic())
            return []
        fresh = in_hand.end_read(read, ready, wanted, time.monotonic())
        ahead = fresh[slots:]
        if ahead:
            kept = self.room.hold(len(ahead))
            in_hand.hold_ahead(ahead[:kept], gate)
            if kept < len(ahead):  # rows not kept are still ready: read them again
                in_hand.gate_looked_empty = False
        return fresh[:slots]
