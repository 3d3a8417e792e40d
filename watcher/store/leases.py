"""Partition leases: reading free partitions, taking, renewing and releasing them (each
row guarded by its version, by the database clock), and the guarded transitions a
holder makes (advance a gate, close, fail).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import (
    bindparam,
    case,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.expression import CompoundSelect, Select

from watcher.drivers.sql import lock_unless_busy
from watcher.lease_statements import FREE_COUNT_CAP, LeaseStatements
from watcher.models import AVAILABLE, CANCELLED, DELETING
from watcher.records import (
    LeaseRenewal,
    LeaseRow,
    LeaseStats,
    PartitionState,
)
from watcher.store.base import StoreBase
from watcher.store.codecs import (
    IN_CHUNK,
    chunks,
    to_lease_row,
)
from watcher.timeline import (
    Progress,
    Timeline,
    decode_timeline,
    encode_timeline,
    record_done,
    record_handed_over,
)


class LeasesStore(StoreBase):
    """Taking, renewing and releasing leases; a holder's partition transitions."""

    @functools.cached_property
    def lease_statements(self) -> LeaseStatements:
        """The lease cycle's statements (its reads, and the take where the driver sends
        it as one statement), built once per shape."""
        return LeaseStatements(self.statements)

    async def _lease_read(self, name: str, statement: Select[Any] | CompoundSelect,
                          params: dict[str, Any]) -> Sequence[Any]:
        """Run one lease read on the driver's direct path, where it has one."""
        return await self.round_trips.call(name, self.driver.fetch(statement, params, read=True))

    async def _lease_rows(self, name: str, statement: Select[Any],
                          params: dict[str, Any]) -> list[LeaseRow]:
        """A lease read's rows (:meth:`LeaseStatements.free`, ``of_owner``); the clock's
        time they end with is the store's latest reading (:meth:`time_to_record`)."""
        rows = await self._lease_read(name, statement, params)
        if rows:
            self.clock_reading.observe(rows[0][-1], time.monotonic())
        return [to_lease_row(row) for row in rows]

    async def leases_stopped(self, owner: str, within: float) -> list[str]:
        """Partitions that clients cancelled, or began deleting, while ``owner`` held them,
        in the last ``within`` seconds.

        Cancelling or deleting a partition keeps its owner and sets ``until``
        to the moment it happened, so this is one read of the lease index
        (status, until, owner): a holder drops such partitions within a poll,
        without waiting for its next renewal to find them lost.
        """
        rows = await self._lease_read("leases_stopped", self.lease_statements.stopped,
                                      {"holder": owner, "back": -within})
        return [row[0] for row in rows]

    async def leases_read_free(self, limit: int) -> list[LeaseRow]:
        """Read up to ``limit`` available partitions that are unleased or expired and
        not paused, first in the lease queue first (``rank_at``: start time less a head
        start for priority, :mod:`watcher.priority`).

        The walk follows ``ix_partitions_rank`` (status, rank_at, id), in the order
        asked, partitions at one place included; it passes over the leased and the
        paused partitions ranked ahead, and the scheduled ones rank at their start,
        so it stops at ``limit`` long before the queue's end."""
        return await self._lease_rows("leases_read_free", self.lease_statements.free(limit), {})

    async def leases_of_owner(self, owner: str, limit: int) -> list[LeaseRow]:
        """Read up to ``limit`` partitions that ``owner`` holds with a live lease."""
        return await self._lease_rows("leases_of_owner", self.lease_statements.of_owner(limit),
                                      {"holder": owner})

    async def lease_stats(self, free_cap: int = FREE_COUNT_CAP) -> LeaseStats:
        """Count each owner's live leases and the partitions free to lease (unleased or
        expired, not scheduled for later), the free ones up to ``free_cap``, in one
        bounded read (:meth:`LeaseStatements.counts`)."""
        rows = await self._lease_read("lease_stats", self.lease_statements.counts(free_cap), {})
        owners = {holder: count for holder, count in rows if holder}
        free = sum(count for holder, count in rows if not holder)
        return LeaseStats(active=sum(owners.values()) + free, owners=owners,
                          free_at_cap=free >= free_cap)

    async def leases_take(self, rows: Sequence[LeaseRow], owner: str,
                          duration: float) -> list[LeaseRow]:
        """Take leases on ``rows`` for ``owner``; each take is guarded by the version read.

        Used for free partitions and for steals alike: if the version still
        matches, nobody renewed or moved the partition since it was read. The
        rows no other session holds locked are locked, then taken in one UPDATE
        (per 500). Returns the rows won, with their new versions.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed (nothing was taken,
                but on a driver that takes in one statement per 500 rows, whose
                chunks taken before the failure expire unrenewed).
        """
        if self.driver.takes_leases_in_one_statement:
            return await self._take_in_one_statement(rows, owner, duration)
        won: list[LeaseRow] = []
        statements = self.statements
        async with self._write() as conn:
            # Rows another session holds locked are passed by, not waited for.
            free = await self._lock_free(conn, [row.id for row in rows])
            wanted = sorted((row for row in rows if row.id in free), key=lambda row: row.id)
            for chunk in chunks(wanted, IN_CHUNK):
                shape = statements.lease_rewrite_shape(len(chunk))
                result = await conn.execute(
                    statements.lease_take(shape),
                    statements.lease_rewrite_params([(row.id, row.version) for row in chunk],
                                                    shape, owner, duration))
                if result.rowcount != len(chunk):
                    # Some had moved on since they were read: a re-read says which we won.
                    after = await self._states(conn, [row.id for row in chunk])
                    chunk = [row for row in chunk if row.id in after
                             and after[row.id].version == row.version + 1
                             and after[row.id].owner == owner]
                # The take moved only the version and the owner: the rest is as read.
                won.extend(replace(row, version=row.version + 1, owner=owner) for row in chunk)
        return won

    async def _take_in_one_statement(self, rows: Sequence[LeaseRow], owner: str,
                                     duration: float) -> list[LeaseRow]:
        """:meth:`leases_take` as one statement per 500 rows on the driver's direct path
        (:meth:`LeaseStatements.take`), which returns the ids it took.

        Raises:
            sqlalchemy.exc.DBAPIError: the database failed or could not be reached
                (a chunk taken before the failure stays taken, and expires unrenewed).
        """
        won: list[LeaseRow] = []
        statements = self.statements
        for chunk in chunks(sorted(rows, key=lambda row: row.id), IN_CHUNK):
            shape = statements.lease_rewrite_shape(len(chunk))
            taken = await self.round_trips.call("leases_take", self.driver.fetch(
                self.lease_statements.take(shape),
                statements.lease_rewrite_params([(row.id, row.version) for row in chunk],
                                                shape, owner, duration), read=False))
            ids = {row[0] for row in taken}
            # The take moved only the version and the owner: the rest is as read.
            won.extend(replace(row, version=row.version + 1, owner=owner)
                       for row in chunk if row.id in ids)
        return won

    async def leases_renew(self, leases: dict[str, int], owner: str,
                           duration: float, progress: Mapping[str, Progress] | None = None
                           ) -> LeaseRenewal:
        """Extend ``owner``'s leases, given as partition id -> version held, for
        ``duration`` seconds.

        One locked read and one UPDATE (per 500 leases) renew them all, the new
        ``until`` by the database clock. A partition ``owner`` still holds whose
        version moved on (a client write bumped it) is renewed at the version
        read, and its gate comes back re-read; one another owner holds now is
        lost. Partitions whose row another session holds locked are not
        waited for: they come back as ``busy``, so one stuck transaction
        cannot stall the renewal of every other lease. Partitions a client
        cancelled or began deleting come back as ``stopped``.

        ``progress`` (by partition id) is what each holder's items did since the
        last write: the same UPDATE adds it to the partitions' timelines
        (:func:`watcher.timeline.record_done`, by the database clock), read under
        the row lock first; the timelines stored then come back in ``timelines``.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed (nothing was renewed).
        """
        return await self._lease_rewrite(leases, owner, duration=duration,
                                         progress=progress or {})

    async def leases_release(self, leases: dict[str, int], owner: str,
                             progress: Mapping[str, Progress] | None = None) -> int:
        """Give up ``owner``'s leases at once, so another watcher can take them; the
        ``progress`` not yet written goes into their timelines as it does in
        :meth:`leases_renew`.

        Returns the number released.
        """
        renewal = await self._lease_rewrite(leases, owner, duration=None,
                                            progress=progress or {})
        return len(renewal.held)

    async def timelines_hand_over(self, progress: Mapping[str, Progress]) -> int:
        """Add to their partitions' timelines the items this processor did under leases
        it has lost since (:func:`watcher.timeline.record_handed_over`, by the database
        clock); returns how many timelines were written.

        A steal ends the victim's lease before the victim's renewal writes what its
        items did, and without this those items would never count in the partition's
        rate and ETA. The rows are locked first (a row another session holds locked is
        passed by, and its count dropped: a timeline is an estimate) and each timeline
        is rewritten with its version unchanged, so the new holder's lease stands. A
        gate move or close the new holder makes from a copy read before this write
        replaces it.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed (nothing was written).
        """
        wanted = {pid: done for pid, done in progress.items() if done.items > 0}
        if not wanted:
            return 0
        p = self.tables.partitions
        async with self._write() as conn:
            free = await self._lock_free(conn, list(wanted))
            timed = await self._timelines_after(conn, sorted(free), wanted,
                                                record=record_handed_over)
            texts = [{"handed_id": pid, "handed_timeline": text}
                     for pid, (text, changed) in timed.items() if changed]
            if texts:
                await conn.execute(update(p).where(p.c.id == bindparam("handed_id"))
                                   .values(timeline=bindparam("handed_timeline")), texts)
        return len(texts)

    async def partition_timeline(self, partition_id: str) -> tuple[bool, str | None]:
        """One partition's stored timeline (:mod:`watcher.timeline`): whether the
        partition exists, and its timeline's text (``None`` while it has none)."""
        p = self.tables.partitions
        async with self._read() as conn:
            row = (await conn.execute(
                select(p.c.timeline).where(p.c.id == partition_id))).first()
        return (False, None) if row is None else (True, row[0])

    async def _timelines_after(
            self, conn: AsyncConnection, ids: Sequence[str], progress: Mapping[str, Progress],
            record: Callable[[Timeline, datetime, Progress], Timeline] = record_done,
    ) -> dict[str, tuple[str | None, bool]]:
        """For the partitions ``ids`` (locked by this transaction): their timeline with
        ``progress`` added at the clock's time by ``record``, and whether it changed."""
        if not ids:
            return {}
        p = self.tables.partitions
        after: dict[str, tuple[str | None, bool]] = {}
        for chunk in chunks(sorted(ids), IN_CHUNK):
            rows = await conn.execute(select(p.c.id, p.c.timeline, self.statements.now)
                                      .where(p.c.id.in_(chunk)))
            for pid, stored, now in rows:
                done = progress[pid]
                if done.items <= 0:
                    after[pid] = (stored, False)
                    continue
                text = encode_timeline(record(decode_timeline(stored), now, done))
                after[pid] = (text, True)
        return after

    async def _lock_free(self, conn: AsyncConnection, ids: Sequence[str]) -> set[str]:
        """Lock the partition rows ``ids`` that no other session holds; return their ids.

        A session stopped inside a transaction (a frozen client, a paused
        processor) keeps its rows locked; lease writes pass them by instead of
        queueing behind them, so only that partition is held up.
        """
        p = self.tables.partitions
        free: set[str] = set()
        for chunk in chunks(sorted(ids), IN_CHUNK):
            rows = await conn.execute(
                lock_unless_busy(select(p.c.id).where(p.c.id.in_(chunk)), p))
            free.update(row[0] for row in rows)
        return free

    async def _lock_states(self, conn: AsyncConnection, ids: Sequence[str]
                           ) -> dict[str, Any]:
        """Lock the partition rows ``ids`` that no other session holds; return their
        rows (``id``, ``version``, ``gate``, ``status``, ``owner``) by id.

        Like :meth:`_lock_free`, rows locked elsewhere are passed by (absent from
        the answer), and so are partitions that no longer exist.
        """
        p = self.tables.partitions
        states: dict[str, Any] = {}
        for chunk in chunks(sorted(ids), IN_CHUNK):
            rows = await conn.execute(lock_unless_busy(
                select(p.c.id, p.c.version, p.c.gate, p.c.status, p.c.owner)
                .where(p.c.id.in_(chunk)), p))
            states.update((row.id, row) for row in rows)
        return states

    async def _lease_rewrite(self, leases: dict[str, int], owner: str, *,
                             duration: float | None,
                             progress: Mapping[str, Progress]) -> LeaseRenewal:
        """Renew for ``duration`` (or, given ``None``, release) all of ``leases`` in
        one guarded UPDATE per chunk.

        The rows are read and locked first, so the states read are the states
        the UPDATE meets: a partition ``owner`` still holds, still available, is
        rewritten at the version read (a client write that bumped the version
        is not a lost lease; its gate comes back re-read). Each row's guard is
        its id, that version, ``owner`` and ``available``. The partitions named in
        ``progress`` have their timelines read (still under the lock) and, where
        items were done, rewritten by the same UPDATE.
        """
        held: dict[str, tuple[int, int | None]] = {}
        timelines: dict[str, str | None] = {}
        async with self._write() as conn:
            states = await self._lock_states(conn, list(leases))
            ours = sorted((state for state in states.values()
                           if state.owner == owner and state.status == AVAILABLE),
                          key=lambda state: state.id)
            timed = await self._timelines_after(
                conn, [state.id for state in ours if state.id in progress], progress)
            for chunk in chunks(ours, IN_CHUNK):
                rows = self.statements.lease_rewrite_shape(len(chunk))
                params = self.statements.lease_rewrite_params(
                    [(state.id, state.version) for state in chunk], rows, owner, duration)
                changed = {state.id: timed[state.id][0] for state in chunk
                           if state.id in timed and timed[state.id][1]}
                if changed:
                    for n in range(rows):
                        params[f"tl{n}"] = changed.get(params[f"pid{n}"])
                result = await conn.execute(
                    self.statements.lease_rewrite(rows, release=duration is None,
                                                  timelines=bool(changed)), params)
                if result.rowcount != len(chunk):
                    # Locked rows cannot change under us; a short count means a
                    # database that does not lock as asked: believe only a re-read.
                    after = await self._states(conn, [state.id for state in chunk])
                    chunk = [state for state in chunk if state.id in after
                             and after[state.id].version == state.version + 1]
                for state in chunk:
                    gate = None if state.version == leases[state.id] else state.gate
                    held[state.id] = (state.version + 1, gate)
                    if state.id in timed:
                        timelines[state.id] = timed[state.id][0]
        stopped = frozenset(pid for pid, state in states.items()
                            if state.status in (CANCELLED, DELETING))
        # Not in ``states``: locked by another session, or deleted (then never free again).
        return LeaseRenewal(held, frozenset(leases) - states.keys(), stopped, timelines)

    async def _states(self, conn: AsyncConnection, ids: Sequence[str]
                      ) -> dict[str, PartitionState]:
        p = self.tables.partitions
        live = case((p.c.until > self.statements.now, True), else_=False)
        states: dict[str, PartitionState] = {}
        for chunk in chunks(list(ids), IN_CHUNK):
            rows = await conn.execute(
                select(p.c.id, p.c.version, p.c.gate, p.c.status, p.c.owner, live)
                .where(p.c.id.in_(chunk)))
            for row in rows:
                states[row[0]] = PartitionState(row[0], row[1], row[2], row[3], row[4],
                                                bool(row[5]))
        return states

    async def partition_state(self, partition_id: str) -> PartitionState | None:
        """Re-read one partition's version, gate, status, owner and lease liveness."""
        async with self._read() as conn:
            return (await self._states(conn, [partition_id])).get(partition_id)

    async def partition_transition(self, partition_id: str, version: int, owner: str, *,
                                   gate: int | None = None, status: str | None = None,
                                   timeline: str | None = None) -> int | None:
        """Advance a leased partition's gate, or close it as ``complete``/``failed``.

        Guarded by version and owner. Closing also releases the lease. A
        ``timeline`` (:func:`watcher.timeline.encode_timeline`) replaces the stored
        one in the same statement. Returns the new version, or ``None`` when the
        write lost (re-read to see why).
        """
        statement = self.statements.partition_transition(
            gate=gate is not None, status=status, timeline=timeline is not None)
        params: dict[str, Any] = {"pid": partition_id, "seen": version, "holder": owner}
        if gate is not None:
            params["new_gate"] = gate
        if timeline is not None:
            params["timeline"] = timeline
        # One statement, atomic by itself: on the driver's own connections where it has
        # them (SQLite's go through the engine, whose commits are synced).
        matched = await self.round_trips.call("partition_transition",
                                              self.driver.execute(statement, params))
        return version + 1 if matched == 1 else None
