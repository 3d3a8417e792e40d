"""Lease renewals and releases (each row guarded, ``until`` by the database clock), and
the timelines they carry: what a holder's items did since the last write, and what a
former holder hands over after losing a lease.

Where the driver returns rows from an ``UPDATE`` and takes leases in one statement
(PostgreSQL, SQLite), a renewal or a release is one statement on its own path
(:meth:`LeaseStatements.rewrite`), and a second read follows only when some lease was
not renewed, to tell a busy row from a lost or stopped one. Elsewhere it is one engine
transaction that locks and reads the rows first.

The timelines live in their own rows (``partition_timelines``, revision 0013), apart
from the partition rows every renewal rewrites: a renewal writes one only for a lease
it kept whose items did something since the last write, and on the one-statement
path only where the stored timeline is still the holder's copy
(:meth:`~watcher.store.sql.timelines.TimelineStatements.swap`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import case, select
from sqlalchemy.ext.asyncio import AsyncConnection

from watcher.models import AVAILABLE, CANCELLED, DELETING
from watcher.records import LeaseRenewal, PartitionState
from watcher.rules.timeline import (
    Progress,
    Timeline,
    decode_timeline,
    encode_timeline,
    record_done,
    record_handed_over,
)
from watcher.store.base import StoreBase
from watcher.store.codecs import IN_CHUNK, LEASE_CHUNK, chunks
from watcher.store.drivers.sql import lock_unless_busy


class RenewalsStore(StoreBase):
    """Renewing and releasing a holder's leases; handing a lost lease's progress over."""

    async def leases_renew(self, leases: dict[str, int], owner: str,
                           duration: float, progress: Mapping[str, Progress] | None = None,
                           known: Mapping[str, str | None] | None = None) -> LeaseRenewal:
        """Extend ``owner``'s leases, given as partition id -> version held, for
        ``duration`` seconds.

        One statement per 128 leases renews them all where the driver takes leases in
        one statement (:meth:`_rewrite_in_one_statement`), otherwise one locked read
        and one UPDATE per 500; the new ``until`` is by the database clock. A
        partition ``owner`` still holds whose version moved on (a client write
        bumped it) is renewed at the version read, and its gate comes back
        re-read; one another owner holds now is lost. Partitions whose row another
        session holds locked are not waited for: they come back as ``busy``, so
        one stuck transaction cannot stall the renewal of every other lease. Partitions a client
        cancelled or began deleting come back as ``stopped``.

        ``progress`` (by partition id) is what each holder's items did since the
        last write: it is added to the timelines of the partitions the renewal kept
        (:func:`watcher.rules.timeline.record_done`, by the database clock), in their
        own rows, by a statement that follows the renewal's. The timelines
        stored then come back in ``timelines``. ``known`` holds the holder's copy of
        each timeline (as its lease read or last wrote it): on the one-statement path
        the progress is added to that copy, and written only where the copy is still
        what is stored; where it is not (or the holder has none), the timeline stored
        comes back in ``timelines_read`` and the progress waits for the next renewal.
        The engine path reads each timeline under the partition row's lock instead,
        and writes it in the renewal's transaction.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed (nothing was renewed).
        """
        if self.driver.takes_leases_in_one_statement:
            return await self._rewrite_in_one_statement(
                leases, owner, duration=duration, progress=progress or {}, known=known or {})
        return await self._lease_rewrite(leases, owner, duration=duration,
                                         progress=progress or {})

    async def leases_release(self, leases: dict[str, int], owner: str,
                             progress: Mapping[str, Progress] | None = None,
                             known: Mapping[str, str | None] | None = None) -> int:
        """Give up ``owner``'s leases at once, so another watcher can take them; the
        ``progress`` not yet written goes into their timelines as it does in
        :meth:`leases_renew` (where the holder's copy ``known`` is stale, a timeline
        being an estimate, that progress is dropped).

        Returns the number released.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed (nothing was released).
        """
        if self.driver.takes_leases_in_one_statement:
            renewal = await self._rewrite_in_one_statement(
                leases, owner, duration=None, progress=progress or {}, known=known or {})
        else:
            renewal = await self._lease_rewrite(leases, owner, duration=None,
                                                progress=progress or {})
        return len(renewal.held)

    async def _rewrite_in_one_statement(
            self, leases: dict[str, int], owner: str, *, duration: float | None,
            progress: Mapping[str, Progress], known: Mapping[str, str | None],
    ) -> LeaseRenewal:
        """:meth:`leases_renew` (or, with ``duration`` ``None``, a release) as one
        statement per 128 leases on the driver's own path
        (:meth:`LeaseStatements.rewrite`), then, only when some lease was not
        rewritten, one read of those to say which were busy, lost or stopped.

        A timeline is written (:meth:`_timelines_swap`) for a lease the rewrite kept
        where the holder's copy is known, has progress to add, and the store has a
        recent reading of the clock
        (:meth:`~watcher.store.base.StoreBase.time_to_record`; each rewrite returns
        the next one).

        Raises:
            sqlalchemy.exc.DBAPIError: the database failed or could not be reached (a
                chunk rewritten before the failure stays rewritten).
        """
        now = self.time_to_record()
        written: dict[str, tuple[str | None, str]] = {}  # partition: (copy, new text)
        if now is not None:
            written = {pid: (known[pid], encode_timeline(
                record_done(decode_timeline(known[pid]), now, done)))
                for pid, done in progress.items() if done.items > 0 and pid in known}
        statements = self.statements
        held: dict[str, tuple[int, int | None]] = {}
        for chunk in chunks(sorted(leases), LEASE_CHUNK):
            shape = statements.lease_rewrite_shape(len(chunk))
            params = statements.lease_rewrite_params([(pid, leases[pid]) for pid in chunk],
                                                     shape, owner, duration)
            rows = await self.round_trips.call("leases_renew", self.driver.fetch(
                self.lease_statements.rewrite(shape, release=duration is None), params,
                read=False))
            if rows:
                self.clock_reading.observe(rows[0][-1], time.monotonic())
            for pid, version, gate, _ in rows:
                held[pid] = (version, None if version == leases[pid] + 1 else gate)
        timelines, timelines_read = await self._timelines_swap(
            {pid: written[pid] for pid in held if pid in written},
            [pid for pid in held if pid in progress and pid not in written])
        missing = [pid for pid in leases if pid not in held]
        if not missing:
            return LeaseRenewal(held, timelines=timelines, timelines_read=timelines_read)
        async with self._read() as conn:
            states = await self._states(conn, missing)
        busy = frozenset(pid for pid in missing if pid not in states
                         or (states[pid].owner == owner and states[pid].status == AVAILABLE))
        stopped = frozenset(pid for pid, state in states.items()
                            if state.status in (CANCELLED, DELETING))
        return LeaseRenewal(held, busy, stopped, timelines, timelines_read)

    async def _timelines_swap(self, written: Mapping[str, tuple[str | None, str]],
                              unwritten: Sequence[str],
                              ) -> tuple[dict[str, str | None], dict[str, str | None]]:
        """Write each timeline of ``written`` (partition: (the holder's copy, the new
        text)) where the stored one is still the copy, on the driver's direct path
        (:meth:`~watcher.store.sql.timelines.TimelineStatements.swap`, one statement
        per 128), after the renewal that kept the leases; returns the timelines
        written, and the stored timelines of the others and of ``unwritten`` (read
        only when there are some: the holder's copies to write from next time).

        Raises:
            sqlalchemy.exc.DBAPIError: the database failed or could not be reached.
        """
        timelines: dict[str, str | None] = {}
        swap = self.timeline_statements.swap
        for chunk in chunks(sorted(written), LEASE_CHUNK):
            shape = self.statements.lease_rewrite_shape(len(chunk))
            params: dict[str, Any] = {}
            for n in range(shape):
                pid = chunk[n] if n < len(chunk) else None
                was, text = written[pid] if pid is not None else (None, None)
                params.update({f"pid{n}": pid, f"was{n}": was, f"tl{n}": text})
            rows = await self.round_trips.call("timelines_write", self.driver.fetch(
                swap(shape), params, read=False))
            timelines.update((row[0], written[row[0]][1]) for row in rows)
        stale = [pid for pid in written if pid not in timelines] + list(unwritten)
        if not stale:
            return timelines, {}
        async with self._read() as conn:
            stored = await self._timelines_stored(conn, stale)
        return timelines, {pid: stored.get(pid) for pid in stale}

    async def _timelines_stored(self, conn: AsyncConnection, ids: Sequence[str]
                                ) -> dict[str, str | None]:
        """The stored timeline of each partition of ``ids`` that has a timeline row."""
        t = self.tables.timelines
        stored: dict[str, str | None] = {}
        for chunk in chunks(sorted(ids), IN_CHUNK):
            rows = await conn.execute(select(t.c.partition_id, t.c.timeline)
                                      .where(t.c.partition_id.in_(chunk)))
            stored.update((row[0], row[1]) for row in rows)
        return stored

    async def _timelines_put(self, conn: AsyncConnection, texts: Mapping[str, str],
                             stored: Mapping[str, str | None]) -> None:
        """In ``conn``'s transaction, which holds the partitions' rows locked: write
        ``texts`` (partition: timeline) over their timeline rows, inserting those
        missing from ``stored`` (a partition an older processor created)."""
        if not texts:
            return
        statements = self.timeline_statements
        rows = [{"tl_pid": pid, "tl_text": text} for pid, text in sorted(texts.items())]
        present = [row for row in rows if row["tl_pid"] in stored]
        if present:
            await conn.execute(statements.set_one, present)
        absent = [row for row in rows if row["tl_pid"] not in stored]
        if absent:
            await conn.execute(statements.add_one, absent)

    async def timelines_hand_over(self, progress: Mapping[str, Progress]) -> int:
        """Add to their partitions' timelines the items this processor did under leases
        it has lost since (:func:`watcher.rules.timeline.record_handed_over`, by the database
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
        async with self._write() as conn:
            free = await self._lock_free(conn, list(wanted))
            timed, stored = await self._timelines_after(conn, sorted(free), wanted,
                                                        record=record_handed_over)
            texts = {pid: text for pid, (text, changed) in timed.items()
                     if changed and text is not None}
            await self._timelines_put(conn, texts, stored)
        return len(texts)

    async def _timelines_after(
            self, conn: AsyncConnection, ids: Sequence[str], progress: Mapping[str, Progress],
            record: Callable[[Timeline, datetime, Progress], Timeline] = record_done,
    ) -> tuple[dict[str, tuple[str | None, bool]], dict[str, str | None]]:
        """For the partitions ``ids`` (locked by this transaction): their timeline with
        ``progress`` added at the clock's time by ``record``, and whether it changed;
        then the timelines stored, by partition, for those with a timeline row."""
        if not ids:
            return {}, {}
        p, t = self.tables.partitions, self.tables.timelines
        after: dict[str, tuple[str | None, bool]] = {}
        stored: dict[str, str | None] = {}
        for chunk in chunks(sorted(ids), IN_CHUNK):
            rows = await conn.execute(
                select(p.c.id, t.c.partition_id, t.c.timeline, self.statements.now)
                .select_from(p.outerjoin(t, t.c.partition_id == p.c.id))
                .where(p.c.id.in_(chunk)))
            for pid, row_id, text, now in rows:
                if row_id is not None:
                    stored[pid] = text
                done = progress[pid]
                if done.items <= 0:
                    after[pid] = (text, False)
                    continue
                after[pid] = (encode_timeline(record(decode_timeline(text), now, done)), True)
        return after, stored

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
            timed, stored = await self._timelines_after(
                conn, [state.id for state in ours if state.id in progress], progress)
            for chunk in chunks(ours, IN_CHUNK):
                rows = self.statements.lease_rewrite_shape(len(chunk))
                params = self.statements.lease_rewrite_params(
                    [(state.id, state.version) for state in chunk], rows, owner, duration)
                result = await conn.execute(
                    self.statements.lease_rewrite(rows, release=duration is None), params)
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
                # The timelines of the leases kept, in their own rows (still under
                # the partitions' locks), where items were done.
                await self._timelines_put(conn, {
                    state.id: text for state in chunk if state.id in timed
                    for text, changed in [timed[state.id]] if changed and text is not None},
                    stored)
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
