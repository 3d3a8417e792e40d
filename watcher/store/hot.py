"""The hot path: the ready read, the oversize check, the gate summary and the batch of
guarded item results, each sent through the driver's own path for its database.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Collection, Sequence

from sqlalchemy import (
    select,
)
from sqlalchemy.sql.expression import Update

from watcher.models import AVAILABLE
from watcher.records import (
    GateSummary,
    ItemWrite,
    PartitionClose,
    ReadyItem,
)
from watcher.rules.completions import settles_at
from watcher.store.drivers.sql import data_size
from watcher.store.spawns import SpawnsStore
from watcher.store.sql.closing import close_when_done


class HotPathStore(SpawnsStore):
    """What every dispatch pass reads and writes."""

    async def items_ready(self, partition_id: str, gate: int, limit: int,
                          exclude: Collection[str] = ()) -> list[ReadyItem]:
        """Read up to ``limit`` available items at ``gate`` whose retry time has passed.

        ``exclude`` names items the caller already has in hand (in flight), so
        they are not read again. Ordered by (retry time, id), which the index
        on (partition, status, gate, retry_at, id) returns in order: the read
        stops at ``limit`` rows and never touches completed items.
        """
        rows = await self.round_trips.call(
            "items_ready", self.driver.items_ready(partition_id, gate, limit, exclude))
        return [ReadyItem(row[0], row[1], row[2], bytes(row[3]), row[4], error_history=row[5],
                          wait_key=row[6])
                for row in rows]

    async def items_oversize(self, partition_id: str, gate: int, max_bytes: int,
                             limit: int) -> list[ReadyItem]:
        """Read up to ``limit`` ready items at ``gate`` whose data is over ``max_bytes``,
        without their data (``data`` is empty): items too large to read or dispatch,
        inserted around the client's limit. Their sizes are read from the stored
        values' headers, so even a value too large to fetch is found."""
        i = self.tables.items
        size = data_size(i.c.data)
        query = (
            select(i.c.id, i.c.version, i.c.gate, i.c.attempts, size, i.c.error_history,
                   i.c.wait_key)
            .where(i.c.partition_id == partition_id, i.c.status == AVAILABLE,
                   i.c.gate == gate, i.c.retry_at <= self.statements.now, size > max_bytes)
            .order_by(i.c.retry_at, i.c.id).limit(limit))
        async with self._read() as conn:
            return [ReadyItem(row.id, row.version, row.gate, b"", row.attempts, size=row[4],
                              error_history=row.error_history, wait_key=row.wait_key)
                    for row in await conn.execute(query)]

    async def gate_summary(self, partition_id: str, gate: int) -> GateSummary:
        """Summarise what is left at ``gate``: pending and failed items, and the next gate."""
        row = (await self.round_trips.call("gate_summary", self.driver.fetch(
            self.statements.gate_summary, {"pid": partition_id, "gate": gate}, read=True)))[0]
        pending_count, earliest, failed_count, lowest, now, paused, waiting, deadline = row
        self.clock_reading.observe(now, time.monotonic())
        wait = to_deadline = None
        if pending_count and earliest is not None:
            wait = max(0.0, (earliest - now).total_seconds())
        if waiting and deadline is not None:
            to_deadline = max(0.0, (deadline - now).total_seconds())
        return GateSummary(pending=pending_count, failed=failed_count, next_gate=lowest,
                           seconds_to_next_retry=wait, now=now, paused=bool(paused),
                           waiting=waiting or 0, seconds_to_deadline=to_deadline)

    @functools.cached_property
    def _closes_when_done(self) -> tuple[Update, Update]:
        return (close_when_done(self.statements, failures_allowed=False),
                close_when_done(self.statements, failures_allowed=True))

    async def partition_close_when_done(self, partition_id: str, version: int, owner: str, *,
                                        gate: int, failures_allowed: bool,
                                        timeline: str, notify: bool = False,
                                        notify_default: str | None = None) -> int | None:
        """Complete the partition ``owner`` holds at ``version`` and ``gate`` when its gate
        summary would close it (:mod:`watcher.store.sql.closing`), ending the lease and,
        when it closes, writing ``timeline`` in the timeline's own row, atomically
        (:meth:`_move_with_timeline`). Returns the new version, or ``None``
        when it did not close (something is left, it is paused, or the lease moved:
        read the summary to see which). With ``notify`` the close writes its event to
        the outbox in the same transaction (to the partition's URL or else
        ``notify_default``), as :meth:`partition_transition` does.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed (nothing was written).
        """
        statement = self._closes_when_done[failures_allowed]
        params = {"pid": partition_id, "seen": version, "holder": owner, "at_gate": gate}
        if notify:
            return await self._end_with_event(statement, params, version, timeline,
                                              notify_default)
        matched = await self._move_with_timeline("partition_close_when_done", statement,
                                                 params, partition_id, timeline)
        return version + 1 if matched == 1 else None

    async def items_apply(self, writes: Sequence[ItemWrite], owner: str) -> list[bool]:
        """Write attempt outcomes in one transaction; each write guarded and fenced.

        A write counts only if the item still has the version that was read
        (so it is still available: every item write bumps the version) and
        ``owner`` still holds a live lease on its partition
        (:meth:`Statements.item_guard`). Returns, per write, whether it was
        applied. A parking write's wait is written in its item's row. How the batch
        travels is the driver's choice, and so is how the keys that applied parking
        writes replace are kept in ``waits`` (in the batch's transaction, or its one
        statement), unless a write spawns items
        or counts toward a quorum: then the batch is one transaction here, and each
        applied write's items are inserted in it (:meth:`items_apply_spawning`). The key
        of a parking write that was not applied is kept, so its token is told the wait
        is over (:meth:`~watcher.store.spawns.SpawnsStore._fenced_waits`).

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed or refused a write
                (then none of the batch is written).
            SpawnConflictError: a write spawns an id its partition holds already
                (none of the batch is written).
        """
        if not writes:
            return []
        if any(write.spawn or write.quorum for write in writes):
            applied = await self.items_apply_spawning(writes, owner)
        else:
            applied = await self.round_trips.call("items_apply",
                                                  self.driver.items_apply(writes, owner))
        await self._fenced_waits(writes, applied)
        return applied

    @property
    def closes_with_writes(self) -> bool:
        """Whether a partition's close can travel with item results
        (:meth:`items_apply_closing`): where the driver chains writes (PostgreSQL)."""
        return self.driver.chains_writes

    async def items_apply_closing(self, writes: Sequence[ItemWrite], owner: str,
                                  closes: Sequence[PartitionClose]
                                  ) -> tuple[list[bool], list[bool]]:
        """:meth:`items_apply`, then each of ``closes`` (a holder's
        :meth:`partition_close_when_done` with its timeline), in the same round trip
        and transaction, so that a partition's last results and its close travel
        together. Returns, per write, whether it was applied, and per close, whether
        it closed its partition. Where the driver cannot send them together (it does
        not chain writes, or the batch spawns or counts toward a quorum) the writes
        go as :meth:`items_apply` says and no close is tried (each is ``False``).

        Raises:
            sqlalchemy.exc.SQLAlchemyError: as :meth:`items_apply` (nothing is
                written, no partition closed).
            SpawnConflictError: as :meth:`items_apply`.
        """
        if not closes or not self.driver.chains_writes or any(
                write.spawn or write.quorum for write in writes):
            return await self.items_apply(writes, owner), [False] * len(closes)
        then = [(self.timeline_statements.after(
                    self._closes_when_done[close.failures_allowed]),
                 {"pid": close.partition_id, "seen": close.version, "holder": owner,
                  "at_gate": close.gate, "tl_text": close.timeline})
                for close in closes]
        applied, rows = await self.round_trips.call(
            "items_apply", self.driver.items_apply_then(writes, owner, then))
        await self._fenced_waits(writes, applied)
        closed = []
        for close, result in zip(closes, rows, strict=True):
            moved, written = result[0]
            if moved == 1 and not written:  # no timeline row yet: an older processor's
                await self._timeline_write(close.partition_id, close.timeline)
            closed.append(moved == 1)
        return applied, closed

    async def items_apply_spawning(self, writes: Sequence[ItemWrite], owner: str) -> list[bool]:
        """Write ``writes``, each guarded and fenced as :meth:`items_apply` says, and insert
        the items each applied write spawns (a write that is fenced off spawns nothing);
        returns, per write, whether it was applied. Without a quorum, in one statement
        where the driver can (:meth:`~watcher.store.spawns.SpawnsStore._spawn_at_once`);
        else in one transaction: the writes as the driver batches them
        (:meth:`~watcher.store.drivers.base.Driver.items_write_each`), the inserts in a few
        statements for the whole batch, the key each applied parking write replaces (one
        statement, kept in ``waits``), and, where an applied write completed an item at a
        gate with a quorum that is now met, the gate's other items settled as skipped.
        Under a quorum, the partition is locked and its gate counted before any write,
        and of the writes that would settle items at the gate only as many as it has
        passes left are written (:meth:`_quorum_keep_in`): the others are not applied,
        and their items are skipped with the rest, so exactly ``k`` pass.

        Raises:
            SpawnConflictError: as :meth:`items_apply` says.
            sqlalchemy.exc.SQLAlchemyError: the database failed or refused a write.
        """
        if not any(write.quorum for write in writes):
            at_once = await self._spawn_at_once(writes, owner)
            if at_once is not None:
                return at_once
        async with self._write() as conn:
            keep = await self._quorum_keep_in(conn, writes)
            written = iter(await self.driver.items_write_each(
                conn, [write for write, kept in zip(writes, keep, strict=True) if kept],
                owner))
            applied = [kept and next(written) for kept in keep]
            await self._spawn_in(conn, [(write.partition_id, write.item_id, write.spawn)
                                        for write, ok in zip(writes, applied, strict=True)
                                        if ok and write.spawn])
            await self._replaced_waits_in(conn, [
                write for write, ok in zip(writes, applied, strict=True)
                if ok and write.wait is not None])
            await self._quorums_in(conn, {
                (write.partition_id, *write.quorum)
                for write, ok in zip(writes, applied, strict=True)
                if ok and write.quorum is not None and settles_at(write, write.quorum[0])})
        return applied
