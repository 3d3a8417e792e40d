"""One supervisor per leased partition: dispatch its gate, write results, move the gate.

``run_once()`` does one pass and says how long to wait; ``run()`` only waits,
wakes and stops. A pass dispatches the ready items at the current gate up to
the free slots; when the gate has nothing ready or in flight, its
:class:`~watcher.gate_steps.GateStepper` moves the gate (or reduces it) in one
guarded write.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from watcher.config import WatcherConfig
from watcher.decisions import (
    ReadStep,
    decide_read,
    idempotency_step,
    outcome_name,
    result_problem,
    write_for_error,
    write_for_result,
)
from watcher.gate_steps import GateStepper, Pass
from watcher.hooks import Hooks
from watcher.in_hand import ItemsInHand
from watcher.leases import Lease, LeaseKeeper
from watcher.protocol import (
    NonRetryableError,
    ProcessCall,
    ReduceCallable,
    ReduceShapeCall,
    WorkItem,
)
from watcher.records import ItemWrite, ReadyItem
from watcher.reducer import GateReducer
from watcher.round_trips import DatabaseTimeoutError
from watcher.slots import SlotPool, wait_event
from watcher.store import Store
from watcher.writer import ResultWriter, WriterClosedError

log = logging.getLogger(__name__)

# Items in hand up to this many are excluded by id in the read query; beyond it
# the read fetches extra rows and filters them here.
MAX_EXCLUDED = 1000


def idempotency_key(partition_id: str, item: ReadyItem) -> str:
    """A key stable for one logical step of one item, safe to send as a header."""
    raw = f"{len(partition_id)}:{partition_id}{item.id}:{idempotency_step(item)}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


class PartitionSupervisor:
    """Drives one leased partition until it closes, the lease is lost, or it is drained."""

    def __init__(self, lease: Lease, *, store: Store, process: ProcessCall,
                 writer: ResultWriter, slots: SlotPool, keeper: LeaseKeeper,
                 config: WatcherConfig, hooks: Hooks,
                 reduce: ReduceCallable | None = None,
                 reduce_shape: ReduceShapeCall | None = None) -> None:
        self.lease = lease
        self.store = store
        self.process = process
        self.writer = writer
        self.slots = slots
        self.keeper = keeper
        self.config = config
        self.hooks = hooks
        self.in_hand = ItemsInHand()
        self.reducer = GateReducer(lease, store=store, reduce=reduce, slots=slots,
                                   keeper=keeper, config=config, hooks=hooks,
                                   shape=reduce_shape)
        self.gates = GateStepper(lease, store=store, keeper=keeper, config=config, hooks=hooks,
                                 reducer=self.reducer)
        self.draining = False
        self._check_lease = False
        self._policy = config.retry_policy
        self._spawn_limits = config.spawn_limits
        self._db_failing = False

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
                    if not self._db_failing:
                        log.debug("action=partition_db_error partition=%s error=%s",
                                  self.partition_id, type(error).__name__)
                        self._db_failing = True
                    outcome = Pass(wait=self.config.poll_interval)
                else:
                    self._db_failing = False
                # Woken for a turn at freed slots, or not: whatever is still free
                # goes to the next partition in line.
                self.slots.pass_turn()
                if outcome.wait is None:
                    break
                if outcome.wait > 0:
                    await wait_event(self.lease.wake, outcome.wait)
        finally:
            self.slots.leave(self.lease.wake)
            if self.lease.lost or not self.draining:
                await self._cancel_in_flight()
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
        now = time.monotonic()
        if self.keeper.expired(lease, now):
            # Renewals failed or hang past the lease's until: it is lost.
            return Pass(wait=None)
        if self.reducer.unchecked and await self.reducer.check_shape():
            return Pass(wait=None)  # the reduce cannot take this partition: failed at once
        if lease.gate in lease.settings.reduce_gates:
            return await self.gates.reduce(now)
        if not self._read_now(now):
            return Pass(wait=self.config.poll_interval)
        dispatched = await self._dispatch()
        if dispatched or self.in_hand:
            return Pass(dispatched, wait=self.config.poll_interval)
        if self.slots.free == 0:
            return Pass(wait=self.config.poll_interval)
        return await self.gates.step()

    def _read_now(self, now: float) -> bool:
        """Whether to read ready items now (:func:`~watcher.decisions.decide_read`).

        When too few slots are free, asks to be woken for a turn at freed ones.
        """
        in_hand, slots = self.in_hand, self.slots
        step = decide_read(free_slots=slots.free, refill_at=slots.refill_at,
                           slots_in_use=slots.in_use, in_flight=len(in_hand),
                           notified=self.lease.notified,
                           gate_looked_empty=in_hand.gate_looked_empty,
                           since_last_read=now - in_hand.last_read,
                           poll_interval=self.config.poll_interval)
        if step is ReadStep.WAIT_FOR_SLOTS:
            slots.notify_when_free(self.lease.wake)
        return step is ReadStep.READ

    async def _dispatch(self) -> int:
        """Read ready items at the gate, up to the free slots, and start their calls.

        Returns how many were started. Raises the database's error when the
        read fails (the slots taken are given back).
        """
        taken = self.slots.take(self.config.concurrency)
        if taken == 0:
            self.slots.notify_when_free(self.lease.wake)
            return 0
        gate = self.lease.gate
        read = self.in_hand.begin_read()
        self.lease.read_started()
        exclude = self.in_hand.ids()
        try:
            if len(exclude) <= MAX_EXCLUDED:
                ready = await self.store.items_ready(self.partition_id, gate, taken, exclude)
            else:  # too many to name in a query: read more and filter here
                ready = await self.store.items_ready(
                    self.partition_id, gate, taken + len(exclude))
        except SQLAlchemyError as error:
            self.slots.give_back(taken)
            # A read that timed out says nothing of the items' sizes: skip the look-up.
            if (not isinstance(error, DatabaseTimeoutError)
                    and await self._fail_unreadable(gate)):
                return 0
            raise
        except BaseException:
            self.slots.give_back(taken)
            raise
        if self.keeper.expired(self.lease):  # the read outlasted the lease: start nothing
            self.in_hand.end_read(read, [], taken, time.monotonic())
            self.slots.give_back(taken)
            return 0
        fresh = self.in_hand.end_read(read, ready, taken, time.monotonic())
        if taken > len(fresh):
            self.slots.give_back(taken - len(fresh))
        for item in fresh:
            self._start(item)
        self.hooks.in_flight(self.slots.in_use)
        return len(fresh)

    async def _fail_unreadable(self, gate: int) -> bool:
        """After a failed read of ready items: fail the items too large to read or
        dispatch (stored around the client's limit), so that they cannot block their
        partition's reads. Returns whether any was found.

        Raises the database's error when the look-up fails.
        """
        oversize = await self.store.items_oversize(
            self.partition_id, gate, self.config.max_item_bytes, limit=MAX_EXCLUDED)
        for item in oversize:
            await self.writer.submit(write_for_error(
                self.partition_id, item, self._oversize_error(item), self._policy))
        if oversize:
            log.warning("action=items_unreadable partition=%s gate=%d count=%d",
                        self.partition_id, gate, len(oversize))
        return bool(oversize)

    def _oversize_error(self, item: ReadyItem) -> NonRetryableError:
        size = len(item.data) if item.size is None else item.size
        return NonRetryableError(
            f"item {item.id!r} of partition {self.partition_id!r} is {size} bytes, over the "
            f"item size limit of {self.config.max_item_bytes} bytes (max_item_bytes); it "
            "was stored around the client's limit and is not dispatched")

    def _start(self, item: ReadyItem) -> None:
        """Call the processor for ``item`` in a task of its own; the item is in hand
        from here until its result is written. An item over the size limit fails
        without a call."""
        if len(item.data) > self.config.max_item_bytes:
            self._finish_call(item, time.monotonic(), None, self._oversize_error(item))
            return
        pid = self.partition_id
        work = WorkItem(pid, item.id, item.gate, item.attempts + 1, item.data, item.version,
                        idempotency_key(pid, item))
        self.hooks.item_dispatched(pid, item.id, item.gate)
        self.in_hand.started(item.id, asyncio.create_task(
            self._call(item, work), name=f"item-{pid}-{item.id}"))

    async def _call(self, item: ReadyItem, work: WorkItem) -> None:
        started = time.monotonic()
        try:
            result = await self.process(work)
        except asyncio.CancelledError:
            self._let_go(item)
            raise
        except Exception as error:
            self._finish_call(item, started, None, error)
        else:
            self._finish_call(item, started, result, None)

    def _finish_call(self, item: ReadyItem, started: float, result: Any,
                     error: Exception | None) -> None:
        """Turn a finished call into its item write and queue the write.

        The call's slot stays taken until the write is done (or dropped), so
        the concurrency bounds calls in flight plus results not yet written: while
        writes fail, the slots fill up and no more calls are made whose results
        could not be stored.
        """
        pid = self.partition_id
        write: ItemWrite | None = None
        if error is None:
            try:
                problem = result_problem(result, self.config.max_item_bytes)
                if problem is None:
                    write = write_for_result(pid, item, result, self.lease.gate, self._policy,
                                             spawn_limits=self._spawn_limits)
                else:
                    error = NonRetryableError(f"item {item.id!r}: {problem}")
            except Exception as bug:  # recorded on the item like a processor error
                error = bug
        if write is None:
            assert error is not None
            write = write_for_error(pid, item, error, self._policy)
        self.in_hand.result_queued(item.id)
        try:
            self.writer.enqueue(write, functools.partial(self._written, item, write, started))
        except WriterClosedError:
            self._let_go(item)  # not written: the item stays available and runs again

    def _written(self, item: ReadyItem, write: ItemWrite, started: float,
                 outcome: bool | BaseException) -> None:
        """The writer's answer for ``item``: report the outcome and let the item go."""
        pid = self.partition_id
        try:
            if isinstance(outcome, WriterClosedError):
                return  # not written: the item stays available and runs again
            if isinstance(outcome, BaseException):  # the database refused even the failure
                log.error("action=result_not_written partition=%s item=%s error=%s "
                          "(the item stays available)", pid, item.id, type(outcome).__name__)
                return
            self.hooks.item_outcome(pid, item.id, item.gate,
                                    outcome_name(item, write) if outcome else "stale",
                                    time.monotonic() - started)
            if not outcome:
                self.hooks.stale_result(pid, item.id)
                log.debug("action=stale_result partition=%s item=%s", pid, item.id)
                self._check_lease = True
            elif write.spawn:
                self.hooks.items_spawned(pid, len(write.spawn))
                if any(child.gate == self.lease.gate for child in write.spawn):
                    self.lease.notify()  # spawned items at this gate: read them at once
        finally:
            self._let_go(item)

    def _let_go(self, item: ReadyItem) -> None:
        """``item`` is no longer in hand: free its slot, wake the supervisor to read again."""
        self.in_hand.let_go(item)
        self.slots.give_back(1)
        self.lease.wake.set()

    async def _confirm_lease(self) -> bool:
        """Re-read the partition after a fenced write: still ours, or lost?"""
        self._check_lease = False
        return await self.gates.confirm_lease()

    async def drain(self, grace: float) -> None:
        """Stop dispatching; let in-flight items finish and write (up to ``grace`` s)."""
        self.draining = True
        self.lease.wake.set()
        tasks = self.in_hand.calls()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace)
            for task in pending:
                task.cancel()

    async def _cancel_in_flight(self) -> None:
        tasks = self.in_hand.calls()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
