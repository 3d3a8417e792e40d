"""The reduce of a leased partition's current gate: read a page, call, write, one step a time.

:class:`GateReducer` is the supervisor's collaborator at a reduce gate. Each
:meth:`GateReducer.run_once` reads the stored progress and the next page, makes one
call to the reducer, and writes what :func:`watcher.rules.reduce.reduce_step`
says in one guarded transaction: the partition's lease (owner, version, live
``until``) and every item's version. A reducer that lost its lease writes
nothing. Failed calls are counted on the partition, retried with backoff, and
after ``max_retries`` fail the partition with the reduce's last error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from functools import partial

from watcher.dispatch.context import PartitionContext
from watcher.dispatch.failures import partition_failed_at_reduce
from watcher.dispatch.unpaid import UnpaidAction, charged_error, decide_unpaid
from watcher.flow.slots import Slots
from watcher.models import Status
from watcher.protocol import (
    HandlerUnavailableError,
    NonRetryableError,
    ReduceCall,
    ReduceCallable,
    ReduceShapeCall,
    RetryableError,
)
from watcher.rules.decisions import RetryPolicy, describe_error, storable_text
from watcher.rules.reduce import (
    PageLimits,
    ReduceAnswerError,
    ReducePlan,
    ReduceSpawnError,
    ReduceWrite,
    page_problem,
    plan_reduce,
    reduce_call,
    reduce_step,
)
from watcher.rules.spawn import SpawnConflictError, SpawnLimits
from watcher.store.db.refusals import is_refusal, write_or_refuse

log = logging.getLogger(__name__)

MAX_REDUCE_ERROR_LENGTH = 2000


class LeaseGoneError(Exception):
    """The lease ended (lost, or the partition stopped by a client) during a reduce call."""


class ReduceOutcomeKind(Enum):
    """What one reduce step did."""

    NOTHING = "nothing"  # no item waits at the gate and no reduce is under way
    WROTE = "wrote"  # a page (or the whole gate) was applied: go on at once
    RETRY = "retry"  # the call failed: try again after ``wait``
    BUSY = "busy"  # no dispatch slot free: try again when one frees
    CONFLICT = "conflict"  # the guarded write lost: re-read the lease
    FAILED = "failed"  # the reduce failed for good: the partition failed
    PAUSED = "paused"  # a client paused the partition: call nothing, let the lease go


@dataclass(frozen=True, slots=True)
class ReduceOutcome:
    """A :class:`ReduceOutcomeKind`, with the delay before the next step for ``RETRY``."""

    kind: ReduceOutcomeKind
    wait: float = 0.0


class GateReducer:
    """Runs the reduce of one leased partition's reduce gates.

    ``reduce`` is the reducer (``None``: this watcher has none, and a reduce
    gate fails its partition with an error that says so).
    """

    def __init__(self, context: PartitionContext, *, reduce: ReduceCallable | None,
                 slots: Slots, shape: ReduceShapeCall | None = None,
                 on_unavailable: Callable[[str], None] | None = None) -> None:
        lease = context.lease
        self.lease = lease
        self.store = context.store
        self.reduce = reduce
        self.slots = slots
        self.keeper = context.keeper
        self.config = config = context.config
        self.hooks = context.hooks
        self.pipeline = lease.settings.pipeline  # in its hooks and log lines
        self.limits = PageLimits(config.reduce_page_items, config.reduce_page_bytes)
        self.shape = shape
        # Whether the reducer's shape is still to be checked against this partition
        # (once per lease, before any item work): see :meth:`check_shape`.
        self.unchecked = shape is not None and bool(lease.settings.reduce_gates)
        # Told that the handler's service gave no answer (watcher.flow.handler_hold); the
        # reduce calls since the last write that it did not answer, unpaid
        # (watcher.dispatch.unpaid).
        self.on_unavailable = on_unavailable
        self.unpaid = 0

    @property
    def partition_id(self) -> str:
        """The partition whose gates this reducer reduces."""
        return self.lease.partition_id

    def _report(self, gate: int, pass_: str, outcome: str, started: float) -> float:
        """Report a reduce call's ``outcome`` to the hooks; returns its seconds."""
        seconds = time.monotonic() - started
        self.hooks.reduce_outcome(self.partition_id, gate, pass_, outcome, seconds,
                                  pipeline=self.pipeline)
        return seconds

    async def check_shape(self) -> bool:
        """Before any item work: ask the reducer what it takes, and fail the partition at
        once when its gates cannot be reduced so (a reducer that takes a whole gate in
        one call, and more items than one page holds). A smaller request limit the
        reducer names becomes the page limit. Returns whether the partition failed.

        Raises the database's error when a read or write fails (checked again then).
        """
        lease, pid = self.lease, self.partition_id
        assert self.shape is not None
        if lease.gate > max(lease.settings.reduce_gates):
            self.unchecked = False
            return False
        shape = await self.shape()
        if shape is None:  # the reducer does not say: its calls will tell
            self.unchecked = False
            return False
        taken = shape.max_request_bytes
        if taken is not None and taken < self.limits.request_bytes:
            self.limits = PageLimits(self.limits.items, taken)
        if shape.pages:
            self.unchecked = False
            return False
        # The items that may still reach a reduce gate: before any item work, every
        # item (one that will complete before the gate cannot be told yet).
        info = await self.store.partition_get(pid)
        counts = {} if info is None else info.counts
        items = counts.get(Status.AVAILABLE.value, 0) + (
            counts.get(Status.FAILED.value, 0) if lease.settings.continue_on_failure else 0)
        self.unchecked = False
        if items <= self.limits.items:
            return False
        gates = ", ".join(str(gate) for gate in sorted(lease.settings.reduce_gates))
        error = NonRetryableError(
            f"partition {pid!r} has {items} items and reduce gate {gates}: a gate of more "
            f"than {self.limits.items} items (--reduce-page-items) is reduced in pages, but "
            "the handler's reduce takes a whole gate in one call (a plain function); serve "
            "it with handlers.Reduce(fold=..., apply=...), or raise --reduce-page-items to "
            f"{items} or more, then retry the partition (processor retry). No item was "
            "dispatched for it by this processor.")
        log.warning("action=reduce_shape_mismatch partition=%s pipeline=%s items=%d "
                    "page_items=%d", pid, self.pipeline, items, self.limits.items)
        outcome = await self._failed(1, error, "all", time.monotonic())
        return outcome.kind is ReduceOutcomeKind.FAILED

    async def run_once(self) -> ReduceOutcome:
        """Make one reduce call at the lease's current gate and write its answer.

        Raises the database's error when a read or write fails.
        """
        planned = await self._plan()
        if isinstance(planned, ReduceOutcome):
            return planned
        plan, call = planned
        pid, gate = self.partition_id, self.lease.gate
        too_large = page_problem(call, self.limits)
        if too_large is not None:  # no handler would take it: fail before calling
            return await self._failed(call.attempt, NonRetryableError(
                f"partition {pid!r} gate {gate} reduce {plan.pass_} page {plan.page}: "
                f"{too_large}"), plan.pass_, time.monotonic())
        if self.slots.take(1) == 0:
            self.slots.notify_when_free(self.lease.wake, self.lease.settings.queue_order)
            return ReduceOutcome(ReduceOutcomeKind.BUSY)
        started = time.monotonic()
        answered = await self._answer(plan, call, started)
        if isinstance(answered, ReduceOutcome):
            return answered
        return await self._write(plan, call, answered, started)

    async def _plan(self) -> tuple[ReducePlan, ReduceCall] | ReduceOutcome:
        """The next call at the lease's gate, read from the stored progress and the next
        page; or why there is none (the gate moved, a pause, nothing left, the lease
        outlasted by the reads)."""
        lease, pid = self.lease, self.partition_id
        gate = lease.gate
        state = await self.store.reduce_state_read(pid)
        if state is None or state.gate != gate:
            return ReduceOutcome(ReduceOutcomeKind.CONFLICT)
        if state.paused:
            return ReduceOutcome(ReduceOutcomeKind.PAUSED)
        if state.pass_ is None:
            summary = await self.store.gate_summary(pid, gate)
            if summary.pending == 0:
                return ReduceOutcome(ReduceOutcomeKind.NOTHING)
        entries = await self.store.reduce_entries(
            pid, gate, after=state.after, limit=self.limits.items + 1,
            include_failed=lease.settings.continue_on_failure)
        plan = plan_reduce(state, entries, self.limits, pid, self.config.max_item_bytes)
        call = reduce_call(pid, gate, plan, attempt=state.attempts + 1, pipeline=(
            lease.settings.pipeline, lease.settings.pipeline_version))
        if self.keeper.expired(lease):  # the reads outlasted the lease: call nothing
            return ReduceOutcome(ReduceOutcomeKind.CONFLICT)
        return plan, call

    async def _answer(self, plan: ReducePlan, call: ReduceCall, started: float
                      ) -> ReduceWrite | ReduceOutcome:
        """Make ``call`` on the slot taken for it (given back here) and decode its answer
        into the step to write; a failed, malformed or fenced-off call is an outcome."""
        pid, gate = self.partition_id, self.lease.gate
        try:
            if self.reduce is None:
                raise NonRetryableError(
                    f"partition {pid!r} has reduce gate {gate}, but this processor has no "
                    "reducer: give the Watcher a reduce function (library mode) or serve "
                    "POST /reduce in the handler")
            self.slots.calls_started(1)
            try:
                answer = await self._call(call)
            finally:
                self.slots.calls_ended(1)
            return reduce_step(pid, gate, plan, answer, self.config.max_item_bytes,
                               spawn_limits=SpawnLimits.of(self.config))
        except asyncio.CancelledError:
            raise
        except LeaseGoneError:
            self._report(gate, plan.pass_, "stale", started)
            return ReduceOutcome(ReduceOutcomeKind.CONFLICT)
        except ReduceSpawnError as bad_spawn:  # as an item's bad spawn: failed at once
            return await self._failed(call.attempt, NonRetryableError(
                f"partition {pid!r} gate {gate} reduce {plan.pass_} page {plan.page} "
                f"(attempt {call.attempt}): the reduce answer's spawn cannot be written, "
                f"and it is not retried: {bad_spawn}"), plan.pass_, started)
        except ReduceAnswerError as malformed:
            error: Exception = RetryableError(
                f"partition {pid!r} gate {gate} reduce {plan.pass_} page {plan.page} "
                f"(attempt {call.attempt}): malformed reduce answer: {malformed}")
            return await self._failed(call.attempt, error, plan.pass_, started)
        except HandlerUnavailableError as failure:
            if self.on_unavailable is None:
                return await self._failed(call.attempt, failure, plan.pass_, started)
            if decide_unpaid(failure, self.unpaid, self.config.max_unpaid_retries
                             ) is UnpaidAction.CHARGE:
                return await self._failed(call.attempt, charged_error(
                    failure, self.unpaid, self.config.max_unpaid_retries), plan.pass_, started)
            self.unpaid += 1  # no attempt counted: made again once the hold ends
            self.on_unavailable(failure.message)
            self._report(gate, plan.pass_, "held", started)
            return ReduceOutcome(ReduceOutcomeKind.RETRY, 0.0)
        except Exception as failure:  # the reducer's error, or a bug in it
            return await self._failed(call.attempt, failure, plan.pass_, started)
        finally:
            self.slots.give_back(1)

    async def _write(self, plan: ReducePlan, call: ReduceCall, step: ReduceWrite,
                     started: float) -> ReduceOutcome:
        """Write ``step`` under the lease; a value the database refuses fails the
        partition, a lost lease fences the write off.

        Raises the database's error on an outage (the step is made again once the
        database answers).
        """
        lease, pid, gate = self.lease, self.partition_id, self.lease.gate
        try:
            async with lease.lock:
                version = None if lease.lost else await write_or_refuse(
                    self.store, partial(self.store.reduce_write, pid, lease.version,
                                        self.keeper.owner, step))
        except Exception as error:
            if not is_refusal(self.store, error):
                raise
            return await self._failed(call.attempt, self._refused(plan, step, error),
                                      plan.pass_, started)
        if version is None:  # the lease was lost (or the guard failed): fenced off
            self._report(gate, plan.pass_, "stale", started)
            log.debug("action=reduce_stale partition=%s pipeline=%s gate=%d", pid,
                      self.pipeline, gate)
            return ReduceOutcome(ReduceOutcomeKind.CONFLICT)
        lease.wrote(version)
        self.unpaid = 0
        self._report(gate, plan.pass_, "applied", started)
        if step.spawn:
            self.hooks.items_spawned(pid, len(step.spawn), pipeline=self.pipeline)
        if step.pass_ is None:
            log.info("action=gate_reduced partition=%s pipeline=%s gate=%d pages=%d", pid,
                     self.pipeline, gate, plan.page + 1)
        else:
            log.debug("action=reduce_page partition=%s pipeline=%s gate=%d pass=%s page=%d",
                      pid, self.pipeline, gate, plan.pass_, plan.page)
        return ReduceOutcome(ReduceOutcomeKind.WROTE)

    def _refused(self, plan: ReducePlan, step: ReduceWrite, error: BaseException
                 ) -> NonRetryableError:
        """The final error of a reduce answer the database refused to store (logged once:
        the partition fails with it, so nothing makes the call again by itself)."""
        pid, gate = self.partition_id, self.lease.gate
        if isinstance(error, SpawnConflictError):
            return NonRetryableError(
                f"partition {pid!r} gate {gate} reduce {plan.pass_} page {plan.page}: {error}")
        sizes = {"result": len(step.result or b""), "accumulator": len(step.accumulator or b""),
                 "largest item data": max((len(write.data or b"") for write in step.writes),
                                          default=0)}
        shown = ", ".join(f"{name} {size} bytes" for name, size in sizes.items())
        # The database's own words: SQLAlchemy's text would add the statement and its values.
        reason = str(getattr(error, "orig", None) or error)
        log.warning("action=reduce_unstorable partition=%s pipeline=%s gate=%d pass=%s "
                    "page=%d error=%s", pid, self.pipeline, gate, plan.pass_, plan.page,
                    type(error).__name__)
        return NonRetryableError(
            f"partition {pid!r} gate {gate} reduce {plan.pass_} page {plan.page}: the "
            f"database refused to store the reduce answer ({shown}): "
            f"{type(error).__name__}: {reason}; make the answer smaller, or raise the "
            "database's limit, then retry the partition (processor retry)")

    async def _call(self, call: ReduceCall) -> object:
        """Make the reduce call, abandoning it once the lease is lost or stopped (a
        client cancelled the partition): its answer could not be written, and a
        page of a big gate may take long. Raises :class:`LeaseGoneError` then,
        and what the reducer raises otherwise."""
        assert self.reduce is not None
        calling = asyncio.ensure_future(self.reduce(call))
        watching = asyncio.ensure_future(self.lease.ended.wait())
        try:
            await asyncio.wait({calling, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watching.cancel()
            if not calling.done():
                calling.cancel()
                await asyncio.gather(calling, return_exceptions=True)
                raise LeaseGoneError(f"partition {call.partition_id!r}: the lease ended "
                                     "while its reduce call ran")
        return calling.result()

    async def _failed(self, attempt: int, error: BaseException, pass_: str,
                      started: float) -> ReduceOutcome:
        """Count a failed reduce call; fail the partition once retries are spent."""
        lease, pid = self.lease, self.partition_id
        policy = RetryPolicy.of(self.config)
        final = isinstance(error, NonRetryableError) or attempt > policy.max_retries
        message = storable_text(describe_error(error))[:MAX_REDUCE_ERROR_LENGTH]
        self._report(lease.gate, pass_, "failed" if final else "retry", started)
        async with lease.lock:
            if lease.lost:
                return ReduceOutcome(ReduceOutcomeKind.CONFLICT)
            version = await self.store.reduce_failed(
                pid, lease.version, self.keeper.owner, attempts=attempt, error=message,
                fail=final, notify_default=self.config.notify_default)
        if version is None:
            return ReduceOutcome(ReduceOutcomeKind.CONFLICT)
        if final:
            lease.wrote(version)
            lease.mark_closed()
            self.keeper.forget(lease)
            self.hooks.partition_closed(pid, Status.FAILED.value, pipeline=self.pipeline)
            partition_failed_at_reduce(pid, lease.gate, attempt, message,
                                       pipeline=self.pipeline)
            return ReduceOutcome(ReduceOutcomeKind.FAILED)
        lease.wrote(version)
        delay = policy.delay(attempt)
        if isinstance(error, RetryableError) and error.retry_after:
            delay = max(delay, error.retry_after)
        log.debug("action=reduce_retry partition=%s pipeline=%s gate=%d attempt=%d "
                  "wait=%.2f", pid, self.pipeline, lease.gate, attempt, delay)
        return ReduceOutcome(ReduceOutcomeKind.RETRY, delay)
