"""The notifications' outbox as its delivery loop and its readers use it: claiming due
events under a lease, settling each attempt (delivered, again later, dead), listing,
counting, sending a dead one again, and purging delivered ones.

Rows are written by the transactions that end partitions (:mod:`watcher.store.sql.outbox`).
A claim takes the due ``pending`` rows that no earlier ``pending`` row of the same
partition precedes (a partition's events go out in order), locking them with
``FOR UPDATE SKIP LOCKED`` where the database has it (SQLite's write transaction locks
the whole database), and moves each one's ``next_at`` a lease ahead under the claimer's
name: a processor killed mid-delivery leaves its rows to be claimed again once that
passes. Every settling write is guarded by the version the claim left and the owner.
All times are the database clock's.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import delete, exists, func, select, update
from sqlalchemy.orm import aliased

from watcher.outbox import DeliveryState
from watcher.records import OutboxEvent
from watcher.store.base import StoreBase
from watcher.store.drivers.sql import lock_unless_busy

PENDING, DELIVERED, DEAD = (DeliveryState.PENDING.value, DeliveryState.DELIVERED.value,
                            DeliveryState.DEAD.value)
# The most rows one claim or one listing reads.
MAX_BATCH = 1000


def _event(row: Any, now: Any) -> OutboxEvent:
    body = row._mapping.get("body")
    return OutboxEvent(
        seq=row.seq, event_id=row.event_id, partition_id=row.partition_id,
        target=row.target, status=row.status, gate=row.gate, state=row.state,
        attempts=row.attempts, version=row.version, next_at=row.next_at,
        created_at=row.created_at, updated_at=row.updated_at, now=now,
        body=None if body is None else bytes(body), last_error=row.last_error)


class NotificationsStore(StoreBase):
    """The ``notifications`` table (the outbox)."""

    async def notifications_claim(self, owner: str, limit: int, lease: float, *,
                                  passing: Collection[int] = ()) -> list[OutboxEvent]:
        """Claim up to ``limit`` due events for ``owner`` for ``lease`` seconds, counting
        an attempt on each: the ``pending`` ones whose ``next_at`` has passed and that
        no earlier pending event of their partition precedes, oldest due first, but for
        the events numbered in ``passing`` (those ``owner`` leaves to other processors:
        :meth:`notification_leave`). Rows another session holds locked are passed by.
        The events come back with the version their settling write must name.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed (nothing was claimed).
        """
        n = self.tables.notifications
        earlier = aliased(n)
        now = self.statements.now
        query = (select(n.c.seq)
                 .where(n.c.state == PENDING, n.c.next_at <= now,
                        ~exists().where(earlier.c.partition_id == n.c.partition_id,
                                        earlier.c.seq < n.c.seq,
                                        earlier.c.state == PENDING))
                 .order_by(n.c.next_at, n.c.seq).limit(min(limit, MAX_BATCH)))
        if passing:
            query = query.where(n.c.seq.not_in(sorted(passing)))
        async with self._write() as conn:
            seqs = list((await conn.execute(lock_unless_busy(query, n))).scalars())
            if not seqs:
                return []
            await conn.execute(
                update(n).where(n.c.seq.in_(seqs), n.c.state == PENDING)
                .values(owner=owner, next_at=self.statements.now_plus(lease),
                        attempts=n.c.attempts + 1, version=n.c.version + 1,
                        updated_at=now))
            rows = (await conn.execute(
                select(n, now.label("now")).where(n.c.seq.in_(seqs), n.c.owner == owner)
                .order_by(n.c.seq))).all()
        return [_event(row, row.now) for row in rows]

    async def notification_settle(self, event: OutboxEvent, owner: str, state: DeliveryState,
                                  *, retry_in: float = 0.0, error: str | None = None,
                                  body: bytes | None = None) -> bool:
        """Settle ``owner``'s claim on ``event``: ``delivered``; ``pending`` again in
        ``retry_in`` seconds (by the database clock); or ``dead``. ``error`` is the
        attempt's (kept as the last error), ``body`` the bytes sent, stored when the
        event has none yet. Returns whether the claim was still ``owner``'s (its
        version unchanged); when not, nothing was written.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed (nothing was written).
        """
        n = self.tables.notifications
        now = self.statements.now
        values: dict[str, Any] = {"state": state.value, "owner": "", "version": n.c.version + 1,
                                  "updated_at": now, "last_error": error,
                                  "next_at": (self.statements.now_plus(retry_in)
                                              if state is DeliveryState.PENDING else now)}
        if body is not None and event.body is None:
            values["body"] = body
        async with self._write() as conn:
            done = await conn.execute(
                update(n).where(n.c.seq == event.seq, n.c.version == event.version,
                                n.c.owner == owner).values(**values))
        return done.rowcount == 1

    async def notification_leave(self, event: OutboxEvent, owner: str, *, error: str,
                                 body: bytes | None = None) -> bool:
        """Give ``owner``'s claim on ``event`` back unspent: it may not send it (another
        processor may). The event is ``pending`` and due again at once, its attempt not
        counted, ``error`` (why ``owner`` left it) kept as its last error, ``body``
        stored when it has none yet. Returns whether the claim was still ``owner``'s
        (its version unchanged); when not, nothing was written.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed (nothing was written).
        """
        n = self.tables.notifications
        now = self.statements.now
        values: dict[str, Any] = {"owner": "", "attempts": n.c.attempts - 1, "next_at": now,
                                  "version": n.c.version + 1, "updated_at": now,
                                  "last_error": error}
        if body is not None and event.body is None:
            values["body"] = body
        async with self._write() as conn:
            done = await conn.execute(
                update(n).where(n.c.seq == event.seq, n.c.version == event.version,
                                n.c.owner == owner, n.c.state == PENDING).values(**values))
        return done.rowcount == 1

    async def notifications_list(self, *, state: str | None = None, after: int | None = None,
                                 limit: int = 100,
                                 partition_id: str | None = None,
                                 newest_first: bool = False) -> list[OutboxEvent]:
        """Read events in ``seq`` order (``newest_first``: the other way), a page of
        ``limit`` after ``after``: all, those in ``state``, or those of
        ``partition_id``. Bodies are not read."""
        n = self.tables.notifications
        columns = [column for column in n.c if column.name != "body"]
        query = select(*columns, self.statements.now.label("now"))
        if state is not None:
            query = query.where(n.c.state == state)
        if partition_id is not None:
            query = query.where(n.c.partition_id == partition_id)
        if after is not None:
            query = query.where(n.c.seq > after)
        query = query.order_by(n.c.seq.desc() if newest_first else n.c.seq).limit(
            min(limit, MAX_BATCH))
        async with self._read() as conn:
            rows = (await conn.execute(query)).all()
        return [_event(row, row.now) for row in rows]

    async def notifications_counts(self, *, delivered: bool = False) -> dict[str, int]:
        """How many events are ``pending`` and ``dead`` (with ``delivered``, how many
        delivered ones are kept too), and how many pending ones are due now (``due``):
        reads of the ``(state, next_at)`` index."""
        n = self.tables.notifications
        states = (PENDING, DEAD, DELIVERED) if delivered else (PENDING, DEAD)
        async with self._read() as conn:
            rows = (await conn.execute(
                select(n.c.state, func.count()).where(n.c.state.in_(states))
                .group_by(n.c.state))).all()
            due = (await conn.execute(
                select(func.count()).where(n.c.state == PENDING,
                                           n.c.next_at <= self.statements.now))).scalar_one()
        counts = dict.fromkeys(states, 0)
        counts.update({state: count for state, count in rows})
        counts["due"] = due
        return counts

    async def notifications_redeliver(self, seqs: Sequence[int]) -> int:
        """Make the ``dead`` events ``seqs`` pending again, due now, with their attempts
        counted from zero. Returns how many were dead (the others are left as they are).

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed (nothing was written).
        """
        n = self.tables.notifications
        now = self.statements.now
        async with self._write() as conn:
            done = await conn.execute(
                update(n).where(n.c.seq.in_(list(seqs)), n.c.state == DEAD)
                .values(state=PENDING, attempts=0, next_at=now, updated_at=now,
                        version=n.c.version + 1, owner=""))
        return done.rowcount

    async def notifications_purge(self, older_than: float, limit: int) -> int:
        """Delete up to ``limit`` delivered events delivered more than ``older_than``
        seconds ago (read through the ``(state, next_at)`` index: a delivery sets
        ``next_at`` to its time). Returns how many were deleted.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed (nothing was deleted).
        """
        n = self.tables.notifications
        async with self._write() as conn:
            seqs = list((await conn.execute(
                select(n.c.seq).where(n.c.state == DELIVERED,
                                      n.c.next_at < self.statements.now_plus(-older_than))
                .order_by(n.c.next_at).limit(min(limit, MAX_BATCH)))).scalars())
            if not seqs:
                return 0
            gone = await conn.execute(delete(n).where(n.c.seq.in_(seqs),
                                                      n.c.state == DELIVERED))
        return gone.rowcount

