"""What the fleet of processors shares: the leader leases of duties one processor
performs at a time (retention), and the backlog and throughput reads behind the
gauges and the console.
"""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import (
    and_,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.expression import ColumnElement, Select

from watcher.models import AVAILABLE, CANCELLED, COMPLETE, FAILED, PARTITION_STATUSES, WAITING
from watcher.reports import Backlog, Throughput
from watcher.store.base import StoreBase

# A processor below its fair share with nothing free to take asks the fleet to hand
# partitions over by holding the leader lease ``handover:<digest of its owner id>``.
HANDOVER_PREFIX = "handover:"
HANDOVER_END = "handover;"  # the next character: the prefix's range ends before it


def handover_duty(owner: str) -> str:
    """The name of the leader lease by which ``owner`` asks for a hand-over."""
    return HANDOVER_PREFIX + hashlib.sha256(owner.encode()).hexdigest()[:40]


class FleetStore(StoreBase):
    """Leader leases, the backlog and the finished-per-minute reads."""

    async def leader_take(self, name: str, owner: str, duration: float) -> bool:
        """Take or extend the lease on duty ``name`` (such as ``"retention"``) for ``owner``.

        It succeeds when ``owner`` holds it already or its lease has expired by
        the store's clock, so of processors trying at once exactly one wins.
        Returns whether ``owner`` holds it now, for ``duration`` seconds.
        """
        leaders = self.tables.leaders
        now = self.statements.now
        until = self.statements.now_plus(duration)
        async with self._write() as conn:
            taken = await conn.execute(
                update(leaders)
                .where(leaders.c.name == name,
                       or_(leaders.c.owner == owner, leaders.c.until <= now))
                .values(owner=owner, until=until, version=leaders.c.version + 1, updated_at=now))
            if taken.rowcount == 1:
                return True
            found = await conn.execute(select(leaders.c.name).where(leaders.c.name == name))
            if found.first() is not None:
                return False
        try:  # the duty's first holder makes its row
            async with self._write() as conn:
                await conn.execute(insert(leaders).values(
                    name=name, owner=owner, until=until, version=1, updated_at=now))
        except IntegrityError:
            return False  # another processor made it first, and holds it
        return True

    async def leader_release(self, name: str, owner: str) -> bool:
        """Give up ``owner``'s lease on duty ``name`` so another processor takes it at once.

        Returns whether ``owner`` held it.
        """
        leaders = self.tables.leaders
        now = self.statements.now
        async with self._write() as conn:
            released = await conn.execute(
                update(leaders).where(leaders.c.name == name, leaders.c.owner == owner)
                .values(owner="", until=now, version=leaders.c.version + 1, updated_at=now))
        return released.rowcount == 1

    async def handover_askers(self) -> list[str]:
        """The processors asking for a hand-over now (a live duty lease named
        :func:`handover_duty`): one range of the leaders' primary key."""
        leaders = self.tables.leaders
        async with self._read() as conn:
            rows = await conn.execute(
                select(leaders.c.owner).where(leaders.c.name >= HANDOVER_PREFIX,
                                              leaders.c.name < HANDOVER_END,
                                              leaders.c.until > self.statements.now,
                                              leaders.c.owner != ""))
        return sorted(row[0] for row in rows)

    async def backlog_read(self, cap: int) -> Backlog:
        """Count partitions per status, and available items at their open partition's
        current gate, each count stopping at ``cap``; and find how long the oldest of
        those items has been ready to run, by the store's clock.

        One statement of bounded reads: the status counts read the index on
        (status, updated_at), the items the ready index of each open partition
        at its gate; a count stops at ``cap`` rows whatever the tables hold. The
        oldest ready item is the first entry of each open partition's ready
        index range (at most ``cap`` partitions), so no completed item is read.
        """
        p, i = self.tables.partitions, self.tables.items
        now = self.statements.now

        def capped(query: Select[Any]) -> ColumnElement[Any]:
            return (select(func.count()).select_from(query.limit(cap).subquery())
                    .scalar_subquery())

        statuses = [status.value for status in PARTITION_STATUSES]
        counts = [capped(select(p.c.id).where(p.c.status == status)) for status in statuses]
        waiting = capped(
            select(i.c.id)
            .join(p, and_(p.c.id == i.c.partition_id, p.c.gate == i.c.gate))
            .where(p.c.status == AVAILABLE, i.c.status == AVAILABLE))
        # Per open partition, the ready index's first entry at its gate (retry_at order).
        first_ready = (
            select(i.c.retry_at)
            .where(i.c.partition_id == p.c.id, i.c.status == AVAILABLE, i.c.gate == p.c.gate,
                   i.c.retry_at <= now)
            .order_by(i.c.retry_at).limit(1).correlate(p).scalar_subquery())
        per_partition = (select(first_ready.label("ready_at")).select_from(p)
                         .where(p.c.status == AVAILABLE).limit(cap).subquery())
        oldest = select(func.min(per_partition.c.ready_at)).scalar_subquery()
        # Parked items: in open partitions only (a cancel ends their waits), through the
        # ready index's (partition, status) prefix; the longest-parked by the time its
        # parking answer was written (the item's updated_at: a heartbeat leaves it).
        parked = capped(select(i.c.id).join(p, p.c.id == i.c.partition_id)
                        .where(p.c.status == AVAILABLE, i.c.status == WAITING))
        first_parked = (
            select(func.min(i.c.updated_at))
            .where(i.c.partition_id == p.c.id, i.c.status == WAITING)
            .correlate(p).scalar_subquery())
        parked_per_partition = (select(first_parked.label("parked_at")).select_from(p)
                                .where(p.c.status == AVAILABLE).limit(cap).subquery())
        oldest_parked = select(func.min(parked_per_partition.c.parked_at)).scalar_subquery()
        async with self._read() as conn:
            row = (await conn.execute(select(*counts, waiting, oldest, parked, oldest_parked,
                                             now))).one()
        *by_status, items_waiting, ready_at, items_parked, parked_at, read_at = row
        age = 0.0 if ready_at is None else max(0.0, (read_at - ready_at).total_seconds())
        parked_age = (0.0 if parked_at is None
                      else max(0.0, (read_at - parked_at).total_seconds()))
        return Backlog(partitions=dict(zip(statuses, by_status, strict=True)),
                       items_waiting=items_waiting, oldest_waiting=age,
                       items_parked=items_parked, oldest_parked=parked_age)

    async def partitions_finished_per_minute(self, minutes: int, cap: int) -> Throughput:
        """Count the partitions that finished (complete, failed or cancelled) in each of
        the last ``minutes`` minutes by the store's clock, each count stopping at ``cap``.

        One statement of bounded reads: each count is a range of the index on
        (status, updated_at), stopped at ``cap`` rows, whatever the tables hold.
        A partition counts in the minute of its last update.
        """
        p = self.tables.partitions
        finished = (COMPLETE, FAILED, CANCELLED)

        def capped(status: str, minute: int) -> ColumnElement[Any]:
            # Minute 0 is the oldest; the last one runs up to now (and past it, should a
            # clock have moved back).
            wanted = select(p.c.id).where(
                p.c.status == status,
                p.c.updated_at >= self.statements.now_plus(-60.0 * (minutes - minute)))
            if minute < minutes - 1:
                wanted = wanted.where(
                    p.c.updated_at < self.statements.now_plus(-60.0 * (minutes - minute - 1)))
            return (select(func.count()).select_from(wanted.limit(cap).subquery())
                    .scalar_subquery())

        columns = [capped(status, minute) for status in finished for minute in range(minutes)]
        async with self._read() as conn:
            row = (await conn.execute(select(*columns))).one()
        return Throughput(minutes=minutes, finished={
            status: tuple(row[n * minutes:(n + 1) * minutes])
            for n, status in enumerate(finished)})
