"""Operator verbs that change a partition: retry its failed items, move its gate,
cancel it. Each is one transaction that locks the partition row first.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    func,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from watcher.errors import (
    GateError,
    PartitionNotFoundError,
)
from watcher.models import AVAILABLE, CANCELLED, COMPLETE, DELETING, FAILED, WAITING
from watcher.reports import RetryReport
from watcher.rules.decisions import reduces_to_run_again
from watcher.store.base import StoreBase
from watcher.store.codecs import (
    NothingToDo,
    settings_of,
)


class OperationsStore(StoreBase):
    """Retry, set-gate and cancel."""

    async def items_retry_failed(self, partition_id: str) -> RetryReport:
        """Run a partition's failed items again, re-opening the partition if it stopped.

        A stopped partition (complete, failed or cancelled) re-opens at the
        lowest gate that holds a failed or available item: every failed item
        goes back to available at the gate where it failed, attempts reset.
        When that moves the gate back, each reduce gate the partition finished
        on the way (from the new gate up to where it stopped) runs again: the
        items it completed there go back to available at that gate, so the
        reduce sees them with the retried ones, and the stored reduce progress
        is dropped. A failed reduce whose gate does not move resumes from its
        stored page. A complete partition with nothing failed stays as it is.

        A running partition keeps its gate (its holder dispatches there): its
        failed items at or after the gate go back to available, and those below
        stay failed (counted in the report). Returns a :class:`RetryReport`.

        Raises:
            PartitionNotFoundError: no partition has this id (or it is being deleted).
        """
        try:
            return await self._retry_failed(partition_id)
        except NothingToDo as nothing:  # rolled back: a retry that does nothing writes nothing
            assert isinstance(nothing.value, RetryReport)
            return nothing.value

    async def _retry_failed(self, partition_id: str) -> RetryReport:
        p, i = self.tables.partitions, self.tables.items
        now = self.statements.now
        reset = {"version": i.c.version + 1, "status": AVAILABLE, "attempts": 0,
                 "retry_at": now, "updated_at": now}
        mine = i.c.partition_id == partition_id
        async with self._write() as conn:
            await self._touch_partition(conn, partition_id)  # locks the row first
            row = (await conn.execute(
                select(p.c.status, p.c.gate, p.c.reduce_gates, p.c.reduce_attempts,
                       p.c.last_error).where(p.c.id == partition_id))).one()
            values: dict[str, Any] = {"reduce_attempts": 0, "last_error": None}
            # A failed reduce counts its calls; an item's failure stores only its error.
            rearmed = bool(row.reduce_attempts)
            gate, rerun, left = row.gate, 0, 0
            if row.status == AVAILABLE:
                # Its gate cannot move back under the holder dispatching at it.
                items = await conn.execute(update(i).where(
                    mine, i.c.status == FAILED, i.c.gate >= gate).values(**reset))
                left = (await conn.execute(select(func.count()).where(
                    mine, i.c.status == FAILED, i.c.gate < gate))).scalar_one()
            else:
                lowest_failed, lowest = (await conn.execute(select(
                    select(func.min(i.c.gate)).where(mine, i.c.status == FAILED)
                    .scalar_subquery(),
                    select(func.min(i.c.gate)).where(mine, i.c.status == AVAILABLE)
                    .scalar_subquery()))).one()
                if lowest_failed is None and lowest is None and row.status == COMPLETE:
                    raise NothingToDo(RetryReport(partition_id, row.status, row.gate,
                                                   row.status, row.gate))
                # Neither may exist (a cancelled partition whose items all completed).
                gate = min([gate, *(low for low in (lowest_failed, lowest) if low is not None)])
                items = await conn.execute(update(i).where(
                    mine, i.c.status == FAILED).values(**reset))
                # Only retried items take a reduce back over its gate (an available item
                # left by a version before this fix goes on from where it waits).
                again = [] if lowest_failed is None else reduces_to_run_again(
                    settings_of(row.reduce_gates, None).reduce_gates, row.status,
                    reopen_at=gate, stopped_at=row.gate)
                if again:
                    rerun = (await conn.execute(update(i).where(
                        mine, i.c.status == COMPLETE, i.c.gate.in_(again)
                    ).values(**reset))).rowcount
                if gate != row.gate or again:
                    values.update(reduce_pass=None, reduce_page=0, reduce_after=None,
                                  reduce_acc=None)
                values.update(status=AVAILABLE, gate=gate, updated_at=self.statements.now)
            await conn.execute(update(p).where(p.c.id == partition_id).values(**values))
            await self._notify(conn, partition_id)
            return RetryReport(partition_id, row.status, row.gate, AVAILABLE, gate,
                               items_reset=items.rowcount, items_rerun=rerun,
                               items_left_failed=left, reduce_rearmed=rearmed)

    async def partition_set_gate(self, partition_id: str, gate: int) -> None:
        """Move an open partition's gate forward (a checkpoint, in manual-checkpoint mode
        or not); a move to the gate it is at changes nothing.

        Refused, with nothing written, when the move means nothing or strands
        work: on a partition that is not open (complete, failed or cancelled:
        nothing runs at any gate of it, and ``retry_failed`` re-opens it), below
        its gate, while an item below ``gate`` is still available (nothing
        dispatches below a partition's gate, so the item would be stranded and
        the partition could close over it; so a gate beyond every available item
        is refused too), and when no item of it is available (nothing would ever
        run at the new gate). An item waiting for a completion below ``gate`` counts as
        available here. Leaving a gate drops the reduce progress stored for
        it. The partition row is written first, which locks it: a processor's
        concurrent write on it conflicts and re-reads.

        Raises:
            PartitionNotFoundError: no partition has this id (or it is being deleted).
            GateError: the partition is not open, ``gate`` is below its current
                gate, items below ``gate`` are still available or waiting, or no item of
                it is available.
        """
        try:
            await self._set_gate(partition_id, gate)
        except NothingToDo:
            pass  # rolled back: a move to the gate it is at writes nothing

    async def _set_gate(self, partition_id: str, gate: int) -> None:
        p, i = self.tables.partitions, self.tables.items
        async with self._write() as conn:
            await self._touch_partition(conn, partition_id)
            status, current = (await conn.execute(
                select(p.c.status, p.c.gate).where(p.c.id == partition_id))).one()
            if status != AVAILABLE:
                raise GateError(
                    f"cannot move partition {partition_id!r} to gate {gate}: it is {status} "
                    f"(at gate {current}), and only an open partition's gate moves; "
                    + ("processor retry (retry_failed) re-opens it"
                       if status != COMPLETE else "add items to re-open it"))
            if gate < current:
                raise GateError(
                    f"cannot move partition {partition_id!r} back from gate {current} to gate "
                    f"{gate}; a checkpoint only moves forward")
            if gate == current:
                raise NothingToDo(None)
            # An item parked below the gate is open work as much as an available one: left
            # there, its wait would never end, and the partition could close over it.
            left = (await conn.execute(
                select(i.c.gate, i.c.status, func.count()).where(
                    i.c.partition_id == partition_id, i.c.status.in_((AVAILABLE, WAITING)),
                    i.c.gate < gate)
                .group_by(i.c.gate, i.c.status).order_by(i.c.gate, i.c.status).limit(1))
                ).first()
            if left is not None:
                state = ("still available" if left[1] == AVAILABLE
                         else "waiting for a completion")
                raise GateError(
                    f"cannot move partition {partition_id!r} to gate {gate}: {left[2]} "
                    f"item(s) at gate {left[0]} are {state} and would be stranded below it; "
                    "wait until they are done or failed (complete a parked one, or let its "
                    "wait time out), or move them with a handler answer")
            if (await conn.execute(select(i.c.id).where(
                    i.c.partition_id == partition_id, i.c.status == AVAILABLE).limit(1))
                    ).first() is None:
                raise GateError(
                    f"cannot move partition {partition_id!r} to gate {gate}: no item of it is "
                    "available, so nothing would ever run there; add items first (at the "
                    "gate you want)")
            await conn.execute(update(p).where(p.c.id == partition_id).values(
                gate=gate, reduce_pass=None, reduce_page=0, reduce_after=None,
                reduce_acc=None, reduce_attempts=0))
            await self._notify(conn, partition_id)

    async def partition_pause(self, partition_id: str, paused: bool) -> bool:
        """Pause (``paused``) or resume a partition; returns whether that changed it
        (``False``: it was paused, or running, already).

        A pause is durable: ``paused_at`` is set by the database clock. The lease
        scan passes a paused partition by; its holder's next ready read finds
        nothing, so it starts no new call, and once its calls in flight are written
        it lets the lease go. Neither the version nor the lease changes here, so
        those calls' results are written as usual. A resume clears it and wakes
        the processors (PostgreSQL notifies them; others find it within a lease
        cycle). Any status may be paused: a finished partition that a retry or new
        items re-open stays paused until resumed.

        Raises:
            PartitionNotFoundError: no partition has this id (or it is being deleted).
        """
        p = self.tables.partitions
        now = self.statements.now
        async with self._write() as conn:
            touched = await conn.execute(
                update(p).where(p.c.id == partition_id, p.c.status != DELETING,
                                p.c.paused_at.is_(None) if paused
                                else p.c.paused_at.is_not(None))
                .values(paused_at=now if paused else None, updated_at=now))
            if touched.rowcount == 1:
                if not paused:
                    await self._notify(conn, partition_id)
                return True
            seen = (await conn.execute(
                select(p.c.status).where(p.c.id == partition_id))).scalar_one_or_none()
            if seen is None or seen == DELETING:
                raise PartitionNotFoundError(partition_id)
            return False

    async def partition_cancel(self, partition_id: str,
                               notify_default: str | None = None) -> str:
        """Stop a partition for good: an open or failed partition becomes ``cancelled``.

        Its lease ends at once (``until`` becomes now; ``owner`` keeps the
        holder's id, so the holder finds the cancel under its own name, see
        :meth:`leases_stopped`), and every write its holder still makes on it is
        fenced off: result, reduce and gate writes all require an available
        partition. Its items stay as they are; ``retry_failed`` resumes it. A
        partition that names a URL (or, naming none, given a ``notify_default``) has its
        event written to the notifications' outbox in the same transaction. Returns
        the status it had: ``available`` or
        ``failed`` (it is cancelled now), or ``complete`` or ``cancelled`` (it is left as it was).

        Raises:
            PartitionNotFoundError: no partition has this id (or it is being deleted).
        """
        p = self.tables.partitions
        now = self.statements.now
        async with self._write() as conn:
            while True:
                seen = (await conn.execute(
                    select(p.c.status).where(p.c.id == partition_id))).scalar_one_or_none()
                if seen is None or seen == DELETING:
                    raise PartitionNotFoundError(partition_id)
                if seen not in (AVAILABLE, FAILED):
                    return str(seen)
                # Guarded on the status read, so the status returned is the one cancelled;
                # a processor closing the partition meanwhile makes it read again.
                touched = await conn.execute(
                    update(p).where(p.c.id == partition_id, p.c.status == seen)
                    .values(status=CANCELLED, until=now, version=p.c.version + 1,
                            updated_at=now))
                if touched.rowcount == 1:
                    await self._fence_off_items_in_flight(conn, partition_id)
                    await self._outbox_in(conn, partition_id, notify_default)
                    return str(seen)

    async def _fence_off_items_in_flight(self, conn: AsyncConnection,
                                         partition_id: str) -> None:
        """Bump the versions of the partition's items that may be in flight (the
        available ones at its current gate), in the stopping transaction.

        A result write checks the lease fence against the snapshot it started
        with, so one already running when the stop commits would still pass it;
        its item-version guard is checked again on the row it waited for, and a
        bumped version makes it miss: nothing of the partition is written after
        the stop returns. Items waiting there end their waits the same way (their
        tokens are refused from now on) and run again when the partition is resumed.
        The attempts move with the version, so the idempotency
        key of each item's step stays the same when the partition is resumed (the
        attempt a stop interrupts counts as one).
        """
        p, i = self.tables.partitions, self.tables.items
        gate = select(p.c.gate).where(p.c.id == partition_id).scalar_subquery()
        await conn.execute(
            update(i).where(i.c.partition_id == partition_id,
                            i.c.status.in_((AVAILABLE, WAITING)), i.c.gate == gate)
            .values(version=i.c.version + 1, attempts=i.c.attempts + 1, status=AVAILABLE))
