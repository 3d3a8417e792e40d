"""Partition leases: reading free partitions and taking them (each row guarded by its
version, by the database clock), and the guarded transitions a holder makes (advance a
gate, close, fail). Renewals and releases live in :mod:`watcher.store.renewals`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import select
from sqlalchemy.sql.expression import CompoundSelect, Select

from watcher.models import AVAILABLE
from watcher.records import LeaseRow, LeaseStats, PartitionState
from watcher.store.codecs import IN_CHUNK, LEASE_CHUNK, chunks, to_lease_row
from watcher.store.renewals import RenewalsStore
from watcher.store.sql.leases import FREE_COUNT_CAP, Served


class LeasesStore(RenewalsStore):
    """Reading and taking leases; a holder's partition transitions."""

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

    async def leases_read_free(self, limit: int, served: Served = None) -> list[LeaseRow]:
        """Read up to ``limit`` available partitions that are unleased or expired and
        not paused, first in the lease queue first (``rank_at``: start time less a head
        start for priority, :mod:`watcher.rules.priority`); with ``served`` (the routes
        of :class:`~watcher.pipelines.ServedPipelines`), only those at a place they
        serve: a processor never leases what it cannot call a handler for.

        The walk follows ``ix_partitions_rank`` (status, rank_at, id), in the order
        asked, partitions at one place included; it passes over the leased and the
        paused partitions ranked ahead, and the scheduled ones rank at their start,
        so it stops at ``limit`` long before the queue's end."""
        return await self._lease_rows("leases_read_free",
                                      self.lease_statements.free(limit, served), {})

    async def leases_of_owner(self, owner: str, limit: int,
                              served: Served = None) -> list[LeaseRow]:
        """Read up to ``limit`` partitions that ``owner`` holds with a live lease (with
        ``served``, only those at a place they serve: the ones a steal may take)."""
        return await self._lease_rows("leases_of_owner",
                                      self.lease_statements.of_owner(limit, served),
                                      {"holder": owner})

    async def partitions_pin_version(self, pins: Sequence[tuple[str, str]],
                                     owner: str) -> list[str]:
        """Pin a pipeline version on each (partition, version) of ``pins`` that ``owner``
        holds and no version is pinned on yet (:meth:`LeaseStatements.pin_version`), in
        one transaction. Returns the partitions pinned; the others had one already (a
        client or an operator set it), or are no longer held.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed (nothing was written).
        """
        pinned: list[str] = []
        if not pins:
            return pinned
        statement = self.lease_statements.pin_version
        async with self._write() as conn:
            for partition_id, version in pins:
                result = await conn.execute(statement, {"pid": partition_id, "holder": owner,
                                                        "pinned": version})
                if result.rowcount == 1:
                    pinned.append(partition_id)
        return pinned

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
                but on a driver that takes in one statement per 128 rows, whose
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
        """:meth:`leases_take` as one statement per 128 rows on the driver's direct path
        (:meth:`LeaseStatements.take`), which returns the ids it took.

        Raises:
            sqlalchemy.exc.DBAPIError: the database failed or could not be reached
                (a chunk taken before the failure stays taken, and expires unrenewed).
        """
        won: list[LeaseRow] = []
        statements = self.statements
        for chunk in chunks(sorted(rows, key=lambda row: row.id), LEASE_CHUNK):
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

    async def partition_timeline(self, partition_id: str) -> tuple[bool, str | None]:
        """One partition's stored timeline (:mod:`watcher.rules.timeline`): whether the
        partition exists, and its timeline's text (``None`` while it has none). One
        read of the partition's key joined to its timeline row."""
        p, t = self.tables.partitions, self.tables.timelines
        async with self._read() as conn:
            row = (await conn.execute(
                select(t.c.timeline).select_from(p.outerjoin(t, t.c.partition_id == p.c.id))
                .where(p.c.id == partition_id))).first()
        return (False, None) if row is None else (True, row[0])

    async def partition_state(self, partition_id: str) -> PartitionState | None:
        """Re-read one partition's version, gate, status, owner and lease liveness."""
        async with self._read() as conn:
            return (await self._states(conn, [partition_id])).get(partition_id)

    async def partition_states(self, partition_ids: Sequence[str]) -> dict[str, PartitionState]:
        """Re-read the version, gate, status, owner and lease liveness of each partition of
        ``partition_ids`` (unknown ids left out): one statement per 500 ids, whatever
        their number. The live feed's poller reads every watched partition with it.
        """
        async with self._read() as conn:
            return await self._states(conn, list(dict.fromkeys(partition_ids)))

    async def partition_transition(self, partition_id: str, version: int, owner: str, *,
                                   gate: int | None = None, status: str | None = None,
                                   timeline: str | None = None,
                                   last_error: str | None = None,
                                   notify: bool = False,
                                   notify_default: str | None = None) -> int | None:
        """Advance a leased partition's gate, or close it as ``complete``/``failed``.

        Guarded by version and owner. Closing also releases the lease. A
        ``timeline`` (:func:`watcher.rules.timeline.encode_timeline`) replaces the stored
        one with the move, atomically, in the timeline's own row
        (:meth:`_move_with_timeline`), and a ``last_error`` the partition's error (why it
        failed). With ``notify`` (the partition names a URL:
        :attr:`~watcher.records.PartitionSettings.notify`) a close writes its event to
        the outbox in the same transaction (:mod:`watcher.store.sql.outbox`), to its URL
        or else ``notify_default`` (the processor's ``--notify-url``). Returns the
        new version, or ``None`` when the
        write lost (re-read to see why).

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed (nothing was written).
        """
        statement = self.statements.partition_transition(
            gate=gate is not None, status=status, error=last_error is not None)
        params: dict[str, Any] = {"pid": partition_id, "seen": version, "holder": owner}
        if gate is not None:
            params["new_gate"] = gate
        if last_error is not None:
            params["error"] = last_error
        if notify and status is not None and status != AVAILABLE:
            return await self._end_with_event(statement, params, version, timeline,
                                              notify_default)
        # With its timeline, atomically (see _move_with_timeline): one statement on the
        # driver's own connections where it chains writes, else one engine transaction;
        # without, one statement, on the driver's own connections where it has them.
        matched = await self._move_with_timeline("partition_transition", statement, params,
                                                 partition_id, timeline)
        if matched != 1:
            return None
        return version + 1
