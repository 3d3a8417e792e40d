"""One supervisor per leased partition: dispatch its gate, write results, move the gate.

``run_once()`` does one pass and says how long to wait; ``run()`` only waits, wakes and
stops. A pass dispatches the ready items at the current gate up to the free slots; a gate
with nothing ready or in flight is moved (or reduced) in one guarded write (``GateMover``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Sequence

from sqlalchemy.exc import SQLAlchemyError

from watcher.dispatch.batch_calls import CallOutcome, call_items
from watcher.dispatch.context import PartitionContext
from watcher.dispatch.gate_moves import GateMover, Pass
from watcher.dispatch.in_hand import ItemsInHand
from watcher.dispatch.item_reports import ItemReports
from watcher.dispatch.oversize import oversize_error
from watcher.dispatch.ready_reads import ReadyReads
from watcher.dispatch.reducer import GateReducer
from watcher.dispatch.tracing import CallTracer, PartitionCalls
from watcher.dispatch.unpaid import UNPAID_KINDS, UnpaidRetries, unpaid_label
from watcher.dispatch.writer import ResultWriter, WriterClosedError
from watcher.flow.slots import ReadAheadPool, Slots, wait_event
from watcher.leasing.closing import CloseWithWrite
from watcher.models import AVAILABLE
from watcher.outages import OutageLatch
from watcher.protocol import ReduceShapeCall, Result, WorkItem
from watcher.records import ItemWrite, ReadyItem
from watcher.rules.completions import settles_at
from watcher.rules.decisions import (
    ReadChoice,
    RetryPolicy,
    decide_read,
    outcome_name,
    write_for_outcome,
)
from watcher.rules.spawn import SpawnLimits

log = logging.getLogger(__name__)


class PartitionSupervisor:
    """Drives one leased partition until it closes, the lease is lost, or it is drained."""

    def __init__(self, context: PartitionContext, calls: PartitionCalls, *,
                 writer: ResultWriter, slots: Slots,
                 reduce_shape: ReduceShapeCall | None = None,
                 tracer: CallTracer | None = None,
                 on_throttled: Callable[[float], None] | None = None,
                 on_unavailable: Callable[[str], None] | None = None,
                 read_ahead: ReadAheadPool | None = None) -> None:
        lease, config, hooks = context.lease, context.config, context.hooks
        if tracer is not None:  # once per lease: each call a span, linked to the creator
            calls = tracer.wrap(lease.settings.trace_context, calls)
        self.lease = lease
        self.store = context.store
        self.process = calls.process
        self.process_batch = calls.process_batch
        self.writer = writer
        self.slots = slots
        self.keeper = context.keeper
        self.config = config
        self.hooks = hooks
        self.in_hand = ItemsInHand()
        self._policy = RetryPolicy.of(config)
        self.reads = ReadyReads(context, writer=writer, in_hand=self.in_hand,
                                policy=self._policy,
                                room=read_ahead or ReadAheadPool(config.concurrency))
        self.reducer = GateReducer(context, reduce=calls.reduce, slots=slots,
                                   shape=reduce_shape, on_unavailable=on_unavailable)
        self.gates = GateMover(context, reducer=self.reducer)
        self.draining = False
        self._unpaid = UnpaidRetries(lease.partition_id, config.max_unpaid_retries,
                                     on_throttled=on_throttled, on_unavailable=on_unavailable,
                                     pipeline=lease.settings.pipeline)
        self._check_lease = False
        self._quorum_written = False  # a written answer may have met the gate's quorum
        self._spawn_limits = SpawnLimits.of(config)
        self._db_outage = OutageLatch()
        self.reports = ItemReports(context)  # the items' hooks and log lines

    @property
    def partition_id(self) -> str:
        """The partition this supervisor drives."""
        return self.lease.partition_id

    @property
    def in_flight(self) -> int:
        """How many of this partition's items are dispatched and not yet written."""
        return len(self.in_hand)

    async def run(self) -> str:
        """Run passes until finished. Returns why it ended: lost, closed or drained."""
        try:
            while True:
                self.lease.wake.clear()
                try:
                    outcome = await self.run_once()
                except SQLAlchemyError as error:
                    # The watcher loop reports outages once per process; here it
                    # would be once per partition, so keep it at debug level.
                    if self._db_outage.fail():
                        log.debug("action=partition_db_error partition=%s pipeline=%s "
                                  "error=%s", self.partition_id, self.reports.pipeline,
                                  type(error).__name__)
                    outcome = Pass(wait=self.config.poll_interval)
                else:
                    self._db_outage.recover()
                # Woken for a turn at freed slots, or not: whatever is still free
                # goes to the next partition in line.
                self.slots.pass_turn()
                if outcome.wait is None:
                    break
                if outcome.wait > 0:
                    await wait_event(self.lease.wake, outcome.wait)
        finally:
            self.reads.close()
            self.slots.leave(self.lease.wake)
            if self.lease.lost or not self.draining:
                await self.in_hand.cancel_calls()
        if self.lease.lost:
            return "lost"
        return "closed" if self.lease.closed else "drained"

    async def run_once(self) -> Pass:
        """One pass: check the lease, dispatch what is ready, or step the gate.

        Raises the database's error when a read or write fails.
        """
        lease = self.lease
        if lease.lost or lease.closed:
            return Pass(wait=None)
        if self.draining:
            return Pass(wait=None if not self.in_hand else self.config.poll_interval)
        if self._check_lease and not await self._confirm_lease():
            return Pass(wait=None)
        written, self._quorum_written = self._quorum_written, False
        if lease.settings.quorum and await self.gates.quorum_met(
                written, in_flight=bool(self.in_hand)):
            given_up = await self.in_hand.cancel_calls()  # the items in flight were skipped
            await self.store.waits_never_begun(self.partition_id, given_up)
        now = time.monotonic()
        if self.keeper.expired(lease, now):
            # Renewals failed or hang past the lease's until: it is lost.
            return Pass(wait=None)
        if self.reducer.unchecked and await self.reducer.check_shape():
            return Pass(wait=None)  # the reduce cannot take this partition: failed at once
        if lease.gate in lease.settings.reduce_gates:
            return await self.gates.reduce(now)
        step = self._read_step(now)
        if step is ReadChoice.MOVE_GATE:
            return await self._step_gate()
        if step is not ReadChoice.READ:
            return Pass(wait=self.config.poll_interval)
        dispatched = await self._dispatch()
        if dispatched or self.in_hand or self.in_hand.ahead:
            return Pass(dispatched, wait=self.config.poll_interval)
        if self.slots.free == 0:
            return Pass(wait=self.config.poll_interval)
        return await self._step_gate()

    async def _step_gate(self) -> Pass:
        """Move, close or wait at the drained gate; whatever it did, the gate's items are
        read before its summary is asked again. Nothing is in flight: the results let go
        are written, and the next read (maybe at the next gate) need not leave them out."""
        self.in_hand.settled()
        outcome = await self.gates.run_once()
        self.in_hand.gate_looked_empty = False
        return outcome

    def _read_step(self, now: float) -> ReadChoice:
        """Whether to read ready items now (:func:`~watcher.rules.decisions.decide_read`).

        When too few slots are free, asks to be woken for a turn at freed ones.
        """
        in_hand, slots = self.in_hand, self.slots
        step = decide_read(free_slots=slots.free, refill_at=slots.refill_at,
                           slots_in_use=slots.in_use, in_flight=len(in_hand),
                           notified=self.lease.notified,
                           gate_looked_empty=in_hand.gate_looked_empty,
                           since_last_read=now - in_hand.last_read,
                           poll_interval=self.config.poll_interval,
                           read_ahead=len(in_hand.ahead))
        if step is ReadChoice.WAIT_FOR_SLOTS:
            slots.notify_when_free(self.lease.wake, self.lease.settings.queue_order,
                                   ready=bool(in_hand.ahead))
        return step

    async def _dispatch(self) -> int:
        """Start calls for ready items at the gate, up to the free slots: rows read ahead
        first; without any, read ready items (and up to a round more to hold ahead).

        Returns how many were started. Raises the database's error when the
        read fails (the slots taken are given back).
        """
        taken = self.slots.take(self.config.concurrency)
        if taken == 0:
            self.slots.notify_when_free(self.lease.wake, self.lease.settings.queue_order,
                                        ready=bool(self.in_hand.ahead))
            return 0
        reads = self.reads
        fresh = reads.take_ahead(taken)
        if not fresh:
            try:
                fresh = await reads.read(taken)
            except BaseException:
                self.slots.give_back(taken)
                raise
        if taken > len(fresh):
            self.slots.give_back(taken - len(fresh))
        if fresh:
            self._start(fresh)
        if self.in_hand.ahead:  # first in line for the slots these calls free
            self.slots.notify_when_free(self.lease.wake, self.lease.settings.queue_order,
                                        ready=True)
        return len(fresh)

    def _start(self, items: list[ReadyItem]) -> None:
        """Call the processor for ``items`` (one read's) in one task; they are in hand
        from here until their results are written."""
        pid = self.partition_id
        self.reports.dispatched(items)
        self.in_hand.started(items, asyncio.create_task(
            self._run_batch(items), name=f"batch-{pid}-{items[0].id}"))

    async def _run_batch(self, items: list[ReadyItem]) -> None:
        """Call the processor for a batch and queue the results' writes as calls finish.

        Items over the size limit fail without a call. Cancelled (the lease was
        lost, the watcher stops): the items whose calls had not ended are let go
        unwritten, and run again.
        """
        started = time.monotonic()
        limit = self.config.max_item_bytes
        if any(len(item.data) > limit for item in items):
            oversize = [item for item in items if len(item.data) > limit]
            errors: list[CallOutcome] = [oversize_error(self.partition_id, item, limit)
                                         for item in oversize]
            self._finish(oversize, errors, started)
            items = [item for item in items if len(item.data) <= limit]
            if not items:
                return
        pid, on = self.partition_id, self.lease.settings  # its pipeline routes the calls
        works = [WorkItem(pid, item.id, item.gate, item.attempts + 1, item.data, item.version,
                          pipeline=on.pipeline, pipeline_version=on.pipeline_version)
                 for item in items]
        try:
            await call_items(self.process, self.process_batch, works, self.slots,
                             lambda positions, outcomes: self._finish(
                                 [items[position] for position in positions], outcomes, started,
                                 works, positions))
        except asyncio.CancelledError:
            self._let_go(self.in_hand.given_up(items, works), abandoned=True)
            raise
        except Exception:  # a bug: never strand the items (and their slots) in hand
            log.exception("action=batch_error partition=%s pipeline=%s items=%d", pid,
                          on.pipeline, len(items))
            self._let_go(self.in_hand.calling(items))

    def _finish(self, items: list[ReadyItem], outcomes: list[CallOutcome],
                started: float, works: Sequence[WorkItem] = (),
                positions: Sequence[int] = ()) -> None:
        """Turn finished calls into item writes and queue them as one writer entry.

        While the writer's buffer has room, the calls' slots are free at once: the
        next calls start while these results wait for the writer (the items stay in
        hand, so no read takes them again). Once it is full (writes are slow or
        fail), the slots stay taken until the writes are done (or dropped). A call
        that cancelled itself is not written: its item runs again. Nor is one throttled
        or unanswered (:mod:`watcher.dispatch.unpaid`, within the item's bound): the
        hold on the handler's calls begins, and the item runs again once it ends, with
        the same attempt and idempotency key. The gate's last results (as far as it
        knows) take the partition's close with them (:meth:`GateMover.close_with`).
        """
        writes: list[ItemWrite] = []
        written: list[ReadyItem] = []
        for n, (item, outcome) in enumerate(zip(items, outcomes, strict=True)):
            if isinstance(outcome, UNPAID_KINDS):
                charged = self._unpaid.settle(item, outcome)
                if charged is None:  # held, unpaid: it runs again as it was
                    self.reports.outcome(item, unpaid_label(outcome),
                                         time.monotonic() - started)
                    self._let_go([item])
                    continue
                outcome = charged
            if isinstance(outcome, asyncio.CancelledError):
                self._let_go([item], abandoned=True)
                continue
            work = (works[positions[n]]  # items[n]'s call: a wait keeps its token and span
                    if positions and isinstance(outcome, Result) and outcome.wait else None)
            token, span = (work.completion_token, work.call_traceparent) if work else (None, None)
            writes.append(write_for_outcome(
                self.partition_id, item, outcome, self.lease.gate, self._policy,
                max_data_bytes=self.config.max_item_bytes, max_snooze=self.config.max_snooze,
                spawn_limits=self._spawn_limits, completion_token=token, traceparent=span))
            written.append(item)
        if not writes:
            return
        self.gates.mark_quorum(writes)
        self.in_hand.results_queued(written)
        freed = self.writer.has_room()
        close = self.gates.close_with(writes, self.in_hand)  # the gate's last results?
        try:
            self.writer.enqueue_many(writes, functools.partial(
                self._written, written, writes, started, freed, self.in_hand.read_mark(),
                close), close)
        except WriterClosedError:
            self._let_go(written)  # not written: the items stay available and run again
            return
        if freed:
            self.slots.give_back(len(written))
            self.lease.wake.set()

    def _written(self, items: list[ReadyItem], writes: list[ItemWrite], started: float,
                 freed: bool, read_mark: int | None, close: CloseWithWrite | None,
                 outcomes: list[bool | BaseException]) -> None:
        """The writer's answer for a batch's writes: report the outcomes, let the items go
        (their slots too, unless ``freed`` when the writes were queued; ``read_mark``:
        :meth:`_spawned`); the partition is complete if ``close`` went with them."""
        ready_again = False  # an item may be ready at this gate again
        left = 0  # items that left the gate: the partition's timeline counts them
        try:
            seconds = time.monotonic() - started
            gate = self.lease.gate
            for item, write, outcome in zip(items, writes, outcomes, strict=True):
                if outcome is not True or (write.status == AVAILABLE
                                           and write.gate in (None, gate)):
                    ready_again = True
                else:
                    left += 1
                if outcome is True:
                    if write.quorum is not None and settles_at(write, write.quorum[0]):
                        self._quorum_written = True
                    # Its outcome, and one line when it failed for good or parked.
                    self.reports.written(item, write, outcome_name(item, write), seconds)
                    if write.spawn:
                        self._spawned(write, read_mark)
                elif outcome is False:
                    self.reports.stale(item, seconds)
                    self._check_lease = True
                elif not isinstance(outcome, WriterClosedError):
                    # The database refused even the failure: the item runs again.
                    self.reports.not_written(item, outcome)
        finally:
            self.lease.done.add(left, started)
            self.lease.results_written(writes, outcomes)
            self._let_go(items, ready_again=ready_again, slots_held=not freed)
            if close is not None and close.closed:
                self.gates.closed_with_write(close)

    def _spawned(self, write: ItemWrite, read_mark: int | None) -> None:
        """A written result inserted items: count them; those ready at this gate start
        without a read (held as read ahead) unless a read ran since the write was queued
        (``read_mark``: it may have dispatched them already); else they are read at once."""
        self.reports.spawned(len(write.spawn))
        here = [child for child in write.spawn if child.gate == self.lease.gate]
        ready = [ReadyItem(child.id, 1, self.lease.gate, child.data, 0) for child in here
                 if child.not_before is None]  # new rows: version 1, no attempt yet
        if here and (len(ready) < len(here) or not self.reads.hold_spawned(ready, read_mark)):
            self.lease.notify()

    def _let_go(self, items: list[ReadyItem], *, ready_again: bool = True,
                abandoned: bool = False, slots_held: bool = True) -> None:
        """``items`` are no longer in hand: free their slots (those ``slots_held``), wake
        the supervisor.

        ``ready_again`` (the default, for items let go unwritten) says one of them may
        be ready at the gate: it is read again before the gate is taken as drained.
        ``abandoned``: their calls were cancelled (the lease was lost, the processor
        stops), and a handler may go on running a request its caller hung up on, so
        the limits that count calls at the handler (a key's) keep them for a lease
        duration more.
        """
        if not items:
            return
        if ready_again:
            self.in_hand.gate_looked_empty = False
        self.in_hand.let_go(items)
        if abandoned:
            self.slots.give_back_later(len(items), self.config.lease_duration)
        elif slots_held:
            self.slots.give_back(len(items))
        self.lease.wake.set()

    async def _confirm_lease(self) -> bool:
        """Re-read the partition after a fenced write: still ours, or lost?"""
        self._check_lease = False
        return await self.gates.confirm_lease()

    async def drain(self, grace: float) -> None:
        """Stop dispatching; let in-flight items finish and write (up to ``grace`` s)."""
        self.draining = True
        self.lease.wake.set()
        await self.in_hand.finish_calls(grace)
