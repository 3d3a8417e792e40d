"""One supervisor per leased partition: dispatch its gate, write results, move the gate.

``run_once()`` does one pass and says how long to wait; ``run()`` only waits,
wakes and stops. A pass dispatches the ready items at the current gate up to
the free slots; when the gate has nothing ready or in flight it asks
:func:`watcher.decisions.decide_gate` what to do and does it in one guarded write.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from watcher.config import WatcherConfig
from watcher.decisions import (
    GateStep,
    decide_gate,
    idempotency_step,
    outcome_name,
    result_problem,
    write_for_error,
    write_for_result,
)
from watcher.hooks import Hooks
from watcher.leases import Lease, LeaseKeeper
from watcher.models import Status
from watcher.protocol import NonRetryableError, Result, WorkItem
from watcher.records import ItemWrite, ReadyItem
from watcher.slots import SlotPool, wait_event
from watcher.store import Store
from watcher.writer import ResultWriter, WriterClosedError

log = logging.getLogger(__name__)

ProcessCall = Callable[[WorkItem], Awaitable[Result]]

# Shortest wait between passes, so a partition never spins on the database.
MIN_WAIT = 0.005
# Items in hand up to this many are excluded by id in the read query; beyond it
# the read fetches extra rows and filters them here.
MAX_EXCLUDED = 1000


@dataclass(frozen=True, slots=True)
class Pass:
    """What one supervisor pass did and what comes next."""

    dispatched: int = 0
    wait: float | None = 0.0  # None: the supervisor is finished
    step: GateStep | None = None


def idempotency_key(partition_id: str, item: ReadyItem) -> str:
    """A key stable for one logical step of one item, safe to send as a header."""
    raw = f"{len(partition_id)}:{partition_id}{item.id}:{idempotency_step(item)}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


class PartitionSupervisor:
    """Drives one leased partition until it closes, the lease is lost, or it is drained."""

    def __init__(self, lease: Lease, *, store: Store, process: ProcessCall,
                 writer: ResultWriter, slots: SlotPool, keeper: LeaseKeeper,
                 config: WatcherConfig, hooks: Hooks) -> None:
        self.lease = lease
        self.store = store
        self.process = process
        self.writer = writer
        self.slots = slots
        self.keeper = keeper
        self.config = config
        self.hooks = hooks
        self.in_flight: dict[str, asyncio.Task[None] | None] = {}
        # Items whose result was written while a read of ready items may have
        # been running: that read can still return the old row, which must not
        # be dispatched again. id -> (version handled, read sequence when written).
        self._handled: dict[str, tuple[int, int]] = {}
        self._reads = 0
        self._gate_looked_empty = False
        self._last_read = 0.0
        self.draining = False
        self._check_lease = False
        self._policy = config.retry_policy
        self._db_failing = False

    @property
    def partition_id(self) -> str:
        """The partition this supervisor drives."""
        return self.lease.partition_id

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
        """One pass: check the lease, dispatch what is ready, or settle the gate.

        Raises the database's error when a read or write fails.
        """
        lease = self.lease
        if lease.lost or lease.closed:
            return Pass(wait=None)
        if self.draining:
            return Pass(wait=None if not self.in_flight else self.config.poll_interval)
        if self._check_lease and not await self._confirm_lease():
            return Pass(wait=None)
        if time.monotonic() - lease.renewed_at > self.config.lease_duration:
            # The lease may have expired while renewals failed: dispatch nothing
            # until a renewal confirms it (or finds it lost).
            return Pass(wait=self.config.poll_interval)
        if not self._worth_reading():
            return Pass(wait=self.config.poll_interval)
        dispatched = await self._dispatch()
        if dispatched or self.in_flight:
            return Pass(dispatched, wait=self.config.poll_interval)
        if self.slots.free == 0:
            return Pass(wait=self.config.poll_interval)
        return await self._settle_gate()

    def _worth_reading(self) -> bool:
        """Whether to read ready items now.

        Reading after every single completion would cost one query per item.
        Instead, while calls are in flight (of this partition or, the slots
        being shared, of any other), read once a quarter of the slots are
        free; partitions take turns at the freed slots in the order they began
        waiting. After a read that found the gate empty, wait for the next
        poll (new items come only from clients or retries) unless nothing of
        this partition is in flight anymore: then its gate may be settled.
        """
        idle = not self.in_flight
        if (self.slots.free < self.slots.refill_at and self.slots.in_use > 0
                and not (idle and self._gate_looked_empty)):
            self.slots.notify_when_free(self.lease.wake)
            return False
        if idle:
            return True
        if self.lease.notified:
            return True
        return not (self._gate_looked_empty
                    and time.monotonic() - self._last_read < self.config.poll_interval)

    async def _dispatch(self) -> int:
        taken = self.slots.take(self.config.concurrency)
        if taken == 0:
            self.slots.notify_when_free(self.lease.wake)
            return 0
        gate = self.lease.gate
        self._reads += 1
        read = self._reads
        self.lease.notified = False
        handled = self._handled
        in_hand = set(self.in_flight) | set(handled)
        try:
            if len(in_hand) <= MAX_EXCLUDED:
                ready = await self.store.items_ready(self.partition_id, gate, taken, in_hand)
            else:  # too many to name in a query: read more and filter here
                ready = await self.store.items_ready(
                    self.partition_id, gate, taken + len(in_hand))
        except BaseException:
            self.slots.give_back(taken)
            raise
        self._last_read = time.monotonic()
        fresh = [
            item for item in ready
            if item.id not in self.in_flight
            and handled.get(item.id, (None, 0))[0] != item.version
        ][:taken]
        self._gate_looked_empty = len(fresh) < taken
        # Results written before this read started are visible to it: forget them.
        self._handled = {key: value for key, value in handled.items() if value[1] >= read}
        if taken > len(fresh):
            self.slots.give_back(taken - len(fresh))
        for item in fresh:
            self._start(item)
        self.hooks.in_flight(self.slots.in_use)
        return len(fresh)

    def _start(self, item: ReadyItem) -> None:
        """Call the processor for ``item`` in a task of its own.

        ``in_flight`` holds the item from here until its result is written:
        with the task while the call runs, with ``None`` once its write is queued.
        """
        pid = self.partition_id
        work = WorkItem(pid, item.id, item.gate, item.attempts + 1, item.data, item.version,
                        idempotency_key(pid, item))
        self.hooks.item_dispatched(pid, item.id, item.gate)
        self.in_flight[item.id] = asyncio.create_task(
            self._call(item, work), name=f"item-{pid}-{item.id}")

    async def _call(self, item: ReadyItem, work: WorkItem) -> None:
        started = time.monotonic()
        try:
            result = await self.process(work)
        except asyncio.CancelledError:
            self.slots.give_back(1)
            self._forget(item)
            raise
        except Exception as error:
            self._settle(item, started, None, error)
        else:
            self._settle(item, started, result, None)

    def _settle(self, item: ReadyItem, started: float, result: Any,
                error: Exception | None) -> None:
        """Turn a finished call into its item write, free its slot, and queue the write."""
        pid = self.partition_id
        self.slots.give_back(1)
        write: ItemWrite | None = None
        if error is None:
            try:
                problem = result_problem(result)
                if problem is None:
                    write = write_for_result(pid, item, result, self.lease.gate, self._policy)
                else:
                    error = NonRetryableError(f"item {item.id!r}: {problem}")
            except Exception as bug:  # recorded on the item like a processor error
                error = bug
        if write is None:
            assert error is not None
            write = write_for_error(pid, item, error, self._policy)
        self.in_flight[item.id] = None
        try:
            self.writer.enqueue(write, functools.partial(self._written, item, write, started))
        except WriterClosedError:
            self._forget(item)  # not written: the item stays available and runs again

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
        finally:
            self._forget(item)

    def _forget(self, item: ReadyItem) -> None:
        """``item`` is no longer in hand; a read still running may return its old row."""
        self._handled[item.id] = (item.version, self._reads)
        self.in_flight.pop(item.id, None)
        self.lease.wake.set()

    async def _confirm_lease(self) -> bool:
        """Re-read the partition after a fenced write: still ours, or lost?"""
        self._check_lease = False
        async with self.lease.lock:
            state = await self.store.partition_state(self.partition_id)
            if (state is not None and state.owner == self.keeper.owner
                    and state.status == Status.AVAILABLE and state.lease_live):
                self.lease.adopt(state.version, state.gate)
                return True
        self.keeper.mark_lost(self.lease)
        return False

    async def _settle_gate(self) -> Pass:
        lease = self.lease
        summary = await self.store.gate_summary(self.partition_id, lease.gate)
        action = decide_gate(summary, auto_close=self.config.auto_close,
                             manual_checkpoint=self.config.manual_checkpoint)
        if action.step is GateStep.WAIT:
            wait = self.config.poll_interval
            if summary.seconds_to_next_retry is not None:
                wait = min(wait, summary.seconds_to_next_retry)
            return Pass(wait=max(MIN_WAIT, wait), step=action.step)
        if action.step is GateStep.IDLE:
            return Pass(wait=self.config.poll_interval, step=action.step)
        status = {GateStep.FAIL: Status.FAILED.value,
                  GateStep.CLOSE: Status.COMPLETE.value}.get(action.step)
        from_gate = lease.gate
        async with lease.lock:
            if lease.lost:
                return Pass(wait=None)
            version = await self.store.partition_transition(
                self.partition_id, lease.version, self.keeper.owner, gate=action.gate,
                status=status)
        if version is None:
            # Someone wrote the partition: a client added items or moved the gate
            # (re-evaluate), or another watcher took it (stop).
            self.hooks.lease_conflict(self.partition_id)
            confirmed = await self._confirm_lease()
            return Pass(wait=0.0 if confirmed else None, step=action.step)
        lease.version = version
        if action.step is GateStep.ADVANCE:
            assert action.gate is not None
            lease.gate = action.gate
            self.hooks.gate_advanced(self.partition_id, from_gate, action.gate)
            log.info("action=gate_advanced partition=%s from=%d to=%d", self.partition_id,
                     from_gate, action.gate)
            return Pass(wait=0.0, step=action.step)
        self.keeper.forget(lease)
        self.hooks.partition_closed(self.partition_id, status or "")
        log.info("action=partition_closed partition=%s status=%s gate=%d", self.partition_id,
                 status, from_gate)
        return Pass(wait=None, step=action.step)

    async def drain(self, grace: float) -> None:
        """Stop dispatching; let in-flight items finish and write (up to ``grace`` s)."""
        self.draining = True
        self.lease.wake.set()
        tasks = [task for task in self.in_flight.values() if task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace)
            for task in pending:
                task.cancel()

    async def _cancel_in_flight(self) -> None:
        tasks = [task for task in self.in_flight.values() if task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
