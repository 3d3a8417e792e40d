"""Reduce gates: the stored progress, the page reads, and the guarded write of one
reduce step (its item answers, the accumulator and the result) in one transaction.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Integer, and_, bindparam, case, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.expression import ColumnElement, Select

from watcher.models import AVAILABLE, FAILED
from watcher.records import (
    ItemWrite,
    ReduceEntry,
    ReduceState,
)
from watcher.rules.reduce import ReduceWrite
from watcher.store.codecs import (
    INSERT_CHUNK,
    GuardLost,
    chunks,
)
from watcher.store.spawns import SpawnsStore


class ReduceStore(SpawnsStore):
    """A reduce gate's reads and its guarded step writes."""

    @functools.cached_property
    def _reduce_state_query(self) -> Select[Any]:
        """A partition's gate, reduce progress and pause (``:pid``), built once."""
        p = self.tables.partitions
        return (select(p.c.version, p.c.gate, p.c.reduce_pass, p.c.reduce_page,
                       p.c.reduce_after, p.c.reduce_acc, p.c.reduce_attempts,
                       case((or_(p.c.paused_at.is_not(None),
                                 self.statements.flow_paused(p.c.flow_key)), 1), else_=0))
                .where(p.c.id == bindparam("pid", type_=p.c.id.type)))

    async def reduce_state_read(self, partition_id: str) -> ReduceState | None:
        """Read a partition's gate and stored reduce progress, or ``None`` if it is gone:
        one statement, built once, on the driver's hot path.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed.
        """
        rows = await self.round_trips.call("reduce_state_read", self.driver.fetch(
            self._reduce_state_query, {"pid": partition_id}, read=True))
        if not rows:
            return None
        version, gate, pass_, page, after, accumulator, attempts, paused = rows[0]
        return ReduceState(version, gate, pass_, page, after,
                           None if accumulator is None else bytes(accumulator), attempts,
                           paused=bool(paused))

    def _reduce_entries_query(self, *, after: bool, limit: int,
                              include_failed: bool) -> Select[Any]:
        """The page read of :meth:`reduce_entries` (``:pid``, ``:gate``, and ``:after``
        when ``after``), built once per shape: the limit is a literal (SQL Server's
        ``TOP n``), and a reducer's page size does not change."""
        shape = (after, limit, include_failed)
        query = self._reduce_entries_queries.get(shape)
        if query is None:
            i = self.tables.items
            gate = bindparam("gate", type_=Integer())
            wanted: ColumnElement[Any] = and_(i.c.status == AVAILABLE, i.c.gate == gate)
            if include_failed:
                wanted = or_(wanted, and_(i.c.status == FAILED, i.c.gate <= gate))
            built: Select[Any] = select(
                i.c.id, i.c.version, i.c.gate, i.c.status, i.c.data, i.c.last_error).where(
                i.c.partition_id == bindparam("pid", type_=i.c.partition_id.type), wanted)
            if after:
                built = built.where(i.c.id > bindparam("after", type_=i.c.id.type))
            query = self._reduce_entries_queries[shape] = built.order_by(i.c.id).limit(limit)
        return query

    @functools.cached_property
    def _reduce_entries_queries(self) -> dict[tuple[bool, int, bool], Select[Any]]:
        return {}

    async def reduce_entries(self, partition_id: str, gate: int, *, after: str | None,
                             limit: int, include_failed: bool) -> list[ReduceEntry]:
        """Read up to ``limit`` items of a reduce at ``gate`` after the id ``after``, by id.

        The items are the available ones at ``gate`` and, with
        ``include_failed``, those that failed at ``gate`` or before. The read
        walks the partition's primary key from ``after``, so each page of a
        paged reduce costs one range read: one statement, built once per shape, on
        the driver's hot path.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed.
        """
        query = self._reduce_entries_query(after=after is not None, limit=limit,
                                           include_failed=include_failed)
        params: dict[str, Any] = {"pid": partition_id, "gate": gate}
        if after is not None:
            params["after"] = after
        rows = await self.round_trips.call("reduce_entries",
                                           self.driver.fetch(query, params, read=True))
        return [ReduceEntry(item_id, version, at_gate, status, bytes(data), error)
                for item_id, version, at_gate, status, data, error in rows]

    async def reduce_write(self, partition_id: str, version: int, owner: str,
                           step: ReduceWrite) -> int | None:
        """Apply one answered reduce step in one transaction: the stored progress, the
        partition result (when the step has one), the item answers and the items the
        step spawned (recorded as the reduce's at ``step.gate``).

        Guarded by the partition's version, owner and live lease, and by each
        item's version: if any guard fails nothing is written. Returns the
        partition's new version, or ``None`` when a guard failed (re-read).

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed or refused a value
                (nothing was written).
            ValueRefusedError: a statement is over MariaDB/MySQL's packet, or
                (SpawnConflictError) the step spawns an id the partition holds
                (nothing was written).
        """
        p = self.tables.partitions
        values: dict[str, Any] = {  # no indexed column: a HOT update on PostgreSQL
            "version": p.c.version + 1,
            "reduce_pass": step.pass_, "reduce_page": step.page,
            "reduce_after": step.after, "reduce_acc": step.accumulator,
            "reduce_attempts": 0, "last_error": None,
        }
        try:
            async with self._write() as conn:
                guard = self.statements.lease_held(partition_id, owner, version=version)
                touched = await conn.execute(update(p).where(*guard).values(**values))
                if touched.rowcount != 1:
                    return None
                if step.result is not None:
                    # A statement of its own: with the accumulator, a statement could hold
                    # two values at the item size limit, more than MariaDB's default packet.
                    await conn.execute(update(p).where(p.c.id == partition_id)
                                       .values(result=step.result))
                await self._reduce_items_write(conn, step.writes, owner)
                await self._spawn_in(conn, [(partition_id, None, step.spawn)],
                                     reduce_gate=step.gate)
        except GuardLost:
            return None
        return version + 1

    async def _reduce_items_write(self, conn: AsyncConnection, writes: Sequence[ItemWrite],
                                  owner: str) -> None:
        """Write a reduce page's item answers; raises :class:`GuardLost` (rolling the
        transaction back) when an item moved since it was read."""
        for chunk in chunks(writes, INSERT_CHUNK):
            if await self.driver.items_write_in(conn, chunk, owner) != len(chunk):
                raise GuardLost

    async def reduce_failed(self, partition_id: str, version: int, owner: str, *,
                            attempts: int, error: str, fail: bool,
                            notify_default: str | None = None) -> int | None:
        """Record a failed reduce call: its count and error; with ``fail``, the
        partition fails (and its lease is released), and its event is written to the
        notifications' outbox in the same transaction when it names a URL or there is a
        ``notify_default`` (the processor's ``--notify-url``). Guarded
        like :meth:`reduce_write`; returns the new version or ``None``.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed (nothing was written).
        """
        p = self.tables.partitions
        values: dict[str, Any] = {"version": p.c.version + 1,
                                  "reduce_attempts": attempts, "last_error": error}
        if fail:
            values.update(status=FAILED, owner="", until=self.statements.now,
                          updated_at=self.statements.now)
        async with self._write() as conn:
            touched = await conn.execute(
                update(p).where(*self.statements.lease_held(partition_id, owner, version=version))
                .values(**values))
            if fail and touched.rowcount == 1:
                await self._outbox_in(conn, partition_id, notify_default)
        return version + 1 if touched.rowcount == 1 else None
