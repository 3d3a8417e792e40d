"""Rewind: an operator moves a partition back to a gate, in one transaction that locks the
partition row first. What goes back and what is removed is decided by
:mod:`watcher.rules.operator.rewind`; this module reads what it needs and writes the outcome.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.expression import ColumnElement, Select

from watcher.errors import GateError, ItemNotFoundError, PartitionChangedError
from watcher.models import AVAILABLE, COMPLETE, FAILED
from watcher.reports import RewindReport
from watcher.rules.operator.rewind import (
    ItemPlace,
    RewindChoice,
    chosen_removed,
    named_problem,
    nothing_problem,
    partition_problem,
    rearmed_gates,
    reduces_again,
    removed_items,
)
from watcher.rules.timeline import RewindMark, decode_timeline, encode_timeline, record_rewind
from watcher.store.base import StoreBase
from watcher.store.codecs import IN_CHUNK, chunks, settings_of
from watcher.store.drivers.conflicts import is_lock_conflict
from watcher.store.sql.schema import Tables

# Tries of a rewind that loses a lock conflict (a deadlock with a holder's write), and the
# pause before the next (times the try's number), in seconds.
CONFLICT_TRIES = 5
CONFLICT_PAUSE = 0.02


class RewindsStore(StoreBase):
    """Rewinding a partition to a gate."""

    async def partition_rewind(self, partition_id: str, gate: int, *,
                               failed_only: bool = False,
                               items: Collection[str] | None = None,
                               version: int | None = None) -> RewindReport:
        """Move a partition back to ``gate``, re-opening it if it stopped.

        The chosen items (every item at ``gate`` or later; only the failed ones with
        ``failed_only``; only those named in ``items``) go back to ``gate``:
        available, attempts reset, version bumped (so a result or a completion token
        of theirs from before is refused); their error history stays. The items a
        chosen item spawned at ``gate`` or later are removed, and so are the items a
        reduce at ``gate`` or later spawned (whatever items are chosen), with their
        descendants (:func:`watcher.rules.operator.rewind.removed_items`); the
        partition's spawned count drops by as many. Every reduce at ``gate`` or
        later runs again: the reduce progress is dropped, the result is cleared when
        there is such a reduce, and, when only some items were chosen, the items a
        reduce from ``gate`` up to the partition's gate had completed go back to
        available at that reduce gate, so it sees the whole gate. The rest of the items
        keep what they have.

        The partition becomes ``available`` at ``gate``, its lease ends (a holder's
        writes are fenced off from now on and it lets the partition go; any processor
        takes it again at once), a pause stays, and its timeline records the rewind.
        With ``version``, it is done only while the partition is at that version.

        A transaction the database aborts to break a lock conflict with a holder's
        write (a deadlock) is run again, up to :data:`CONFLICT_TRIES` times.

        Raises:
            PartitionNotFoundError: no partition has this id (or it is being deleted).
            PartitionChangedError: ``version`` was given and the partition is at another.
            GateError: ``gate`` is negative or above the partition's gate, or it
                chooses no item at ``gate`` or later (none to send back, none that
                what runs again spawns afresh).
            ItemNotFoundError: a named item is not in the partition.
            InvalidInputError: a named item is before ``gate`` or, with
                ``failed_only``, not failed.
            sqlalchemy.exc.SQLAlchemyError: the database failed (or lost every try).
        Nothing is written when it raises.
        """
        choice = RewindChoice(gate, failed_only,
                              None if items is None else frozenset(items))
        for attempt in range(1, CONFLICT_TRIES + 1):
            try:
                return await self._rewind(partition_id, choice, version)
            except SQLAlchemyError as error:
                if attempt == CONFLICT_TRIES or not is_lock_conflict(error):
                    raise
            await asyncio.sleep(CONFLICT_PAUSE * attempt)  # let the other writer finish
        raise AssertionError("unreachable")

    async def _rewind(self, partition_id: str, choice: RewindChoice,
                      version: int | None) -> RewindReport:
        gate = choice.gate
        p, i, t = self.tables.partitions, self.tables.items, self.tables.timelines
        mine = i.c.partition_id == partition_id
        now = self.statements.now
        async with self._write() as conn:
            await self._touch_partition(conn, partition_id)  # locks the row first
            row = (await conn.execute(
                select(p.c.status, p.c.gate, p.c.version, p.c.reduce_gates, t.c.timeline,
                       p.c.result.is_not(None).label("has_result"))
                .select_from(p.outerjoin(t, t.c.partition_id == p.c.id))
                .where(p.c.id == partition_id))).one()
            moment = (await conn.execute(select(now))).scalar_one()
            before = row.version - 1  # the touch bumped it
            if version is not None and version != before:
                raise PartitionChangedError(partition_id, version, before)
            problem = partition_problem(partition_id, gate, current_gate=row.gate)
            if problem is not None:
                raise GateError(problem)
            if choice.named is not None:
                await self._check_named(conn, partition_id, choice)
            reduce_gates = settings_of(row.reduce_gates, None).reduce_gates
            again = reduces_again(reduce_gates, gate)
            places = await self._spawn_places(conn, partition_id,
                                              reduced_from=gate if again else None)
            removed = removed_items(places, choice, again)
            for chunk in chunks(sorted(removed), IN_CHUNK):
                # Its other keys stay in ``waits``, whose rows then name no item: 409 too.
                await conn.execute(self.statements.waits.item_keys_removed(
                    mine, i.c.id.in_(chunk)))
                await conn.execute(delete(i).where(mine, i.c.id.in_(chunk)))
            reset = {"version": i.c.version + 1, "status": AVAILABLE, "attempts": 0,
                     "retry_at": now, "updated_at": now}
            reset_count = 0
            for chosen in self._chosen(choice):
                reset_count += (await conn.execute(
                    update(i).where(mine, i.c.gate >= gate, *chosen)
                    .values(gate=gate, **reset))).rowcount
            if reset_count == 0 and not chosen_removed(places, removed, choice):
                raise GateError(nothing_problem(partition_id, choice))
            rerun = 0
            rearmed = rearmed_gates(reduce_gates, choice, current_gate=row.gate)
            if rearmed:
                rerun = (await conn.execute(update(i).where(
                    mine, i.c.status == COMPLETE, i.c.gate.in_(rearmed)).values(**reset)
                )).rowcount
            values: dict[str, Any] = {
                "status": AVAILABLE, "gate": gate, "owner": "", "until": now,
                "updated_at": now, "reduce_pass": None, "reduce_page": 0,
                "reduce_after": None, "reduce_acc": None, "reduce_attempts": 0,
                "last_error": None, "spawned": p.c.spawned - len(removed)}
            if again:
                values["result"] = None
            await conn.execute(update(p).where(p.c.id == partition_id).values(**values))
            await self._timeline_set_in(conn, partition_id, _rewound(  # its own row (0013)
                row.timeline, moment, RewindMark(moment, row.gate, gate, reset_count,
                                                 len(removed))))
            await self._notify(conn, partition_id)
        return RewindReport(partition_id, str(row.status), int(row.gate), before, gate,
                            items_reset=reset_count, items_removed=len(removed),
                            items_rerun=rerun, reduces_again=tuple(again),
                            result_cleared=bool(again and row.has_result))

    def _chosen(self, choice: RewindChoice) -> list[tuple[Any, ...]]:
        """The extra conditions of the chosen items' update, one statement per chunk of
        named ids (none named: one statement)."""
        i = self.tables.items
        status = (i.c.status == FAILED,) if choice.failed_only else ()
        if choice.named is None:
            return [status]
        return [(*status, i.c.id.in_(chunk))
                for chunk in chunks(sorted(choice.named), IN_CHUNK)]

    async def _check_named(self, conn: AsyncConnection, partition_id: str,
                           choice: RewindChoice) -> None:
        """Raises ItemNotFoundError, or InvalidInputError, when a named item cannot go back."""
        i = self.tables.items
        found: dict[str, ItemPlace] = {}
        for chunk in chunks(sorted(choice.named or ()), IN_CHUNK):
            for item_id, item_gate, status in await conn.execute(
                    select(i.c.id, i.c.gate, i.c.status).where(
                        i.c.partition_id == partition_id, i.c.id.in_(chunk))):
                found[item_id] = ItemPlace(item_id, item_gate, status)
        problem = named_problem(partition_id, choice, found)
        if problem is None:
            return
        unknown = sorted((choice.named or frozenset()) - found.keys())
        if unknown:
            error = ItemNotFoundError(partition_id, unknown[0])
            error.args = (problem,)
            raise error
        raise GateError(problem)

    async def _spawn_places(self, conn: AsyncConnection, partition_id: str, *,
                            reduced_from: int | None) -> list[ItemPlace]:
        """The places of the partition's items that items spawned, of their parents,
        and (``reduced_from`` not ``None``) of those a reduce at that gate or later
        spawned: as many rows as the partition spawned, and their parents. The
        spawned ones are read as :func:`spawned_reads` says; the parents not among
        them by primary key, a chunk of ids a statement."""
        i = self.tables.items
        rows = [row for read in spawned_reads(self.tables, partition_id, reduced_from)
                for row in await conn.execute(read)]
        missing = sorted({row.parent for row in rows if row.parent is not None}
                         - {row.id for row in rows})
        for chunk in chunks(missing, IN_CHUNK):
            rows += await conn.execute(select(*_place_columns(self.tables)).where(
                i.c.partition_id == partition_id, i.c.id.in_(chunk)))
        return [ItemPlace(row.id, row.gate, row.status, row.parent, row.spawned_by_reduce)
                for row in rows]


def spawned_reads(tables: Tables, partition_id: str,
                  reduced_from: int | None) -> list[Select[Any]]:
    """The reads of a partition's spawned items a rewind makes: those an item spawned
    (``parent`` set) and, with ``reduced_from``, those a reduce at that gate or later
    spawned (``parent`` NULL, ``spawned_by_reduce`` from ``reduced_from``). Each is a
    range of ``ix_items_spawned`` (revision 0018): the partition's other items, however
    many completed, are not read."""
    i = tables.items
    mine = i.c.partition_id == partition_id
    columns = _place_columns(tables)
    reads = [select(*columns).where(mine, i.c.parent.is_not(None))]
    if reduced_from is not None:
        reads.append(select(*columns).where(mine, i.c.parent.is_(None),
                                            i.c.spawned_by_reduce >= reduced_from))
    return reads


def _place_columns(tables: Tables) -> tuple[ColumnElement[Any], ...]:
    i = tables.items
    return (i.c.id, i.c.gate, i.c.status, i.c.parent, i.c.spawned_by_reduce)


def _rewound(stored: str | None, now: datetime, mark: RewindMark) -> str:
    """The timeline text after a rewind (:func:`watcher.rules.timeline.record_rewind`)."""
    return encode_timeline(record_rewind(decode_timeline(stored), now, mark))
