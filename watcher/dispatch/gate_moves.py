"""A leased partition's moves between gates: wait, advance, fail or close it in one
guarded write (:func:`watcher.rules.decisions.decide_gate`), the steps of a reduce gate
(:class:`~watcher.dispatch.reducer.GateReducer`), and re-reading the lease after a write was
fenced off. The partition's supervisor (:mod:`watcher.dispatch.supervisor`) calls it once the
gate has nothing ready or in flight.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from watcher.dispatch.context import PartitionContext
from watcher.dispatch.failures import GateFailure, read_failed_item
from watcher.dispatch.in_hand import ItemsInHand
from watcher.dispatch.reducer import GateReducer, ReduceOutcomeKind
from watcher.leasing.closing import CloseWithWrite, close_request
from watcher.models import Status
from watcher.protocol import NonRetryableError, RetryableError
from watcher.records import GateSummary, ItemWrite
from watcher.rules.completions import (
    QuorumMove,
    decide_quorum,
    quorum_look_due,
    summary_under_quorum,
)
from watcher.rules.decisions import GateMove, RetryPolicy, decide_gate, write_for_error
from watcher.rules.timeline import Progress, decode_timeline, encode_timeline, record_move
from watcher.waits import fails_on_timeout, timeout_message

log = logging.getLogger(__name__)

# Shortest wait between passes, so a partition never spins on the database.
MIN_WAIT = 0.005
# A partition in one of these was stopped by a client: its holder lets it go.
STOPPED_BY_CLIENT = (Status.CANCELLED.value, Status.DELETING.value)


@dataclass(frozen=True, slots=True)
class Pass:
    """What one supervisor pass did and what comes next."""

    dispatched: int = 0
    wait: float | None = 0.0  # None: the supervisor is finished
    move: GateMove | None = None


class GateMover:
    """Moves one leased partition between gates, and confirms its lease."""

    def __init__(self, context: PartitionContext, *, reducer: GateReducer) -> None:
        self.lease = context.lease
        self.store = context.store
        self.keeper = context.keeper
        self.config = context.config
        self.hooks = context.hooks
        self.pipeline = context.lease.settings.pipeline  # in its hooks and log lines
        self.reducer = reducer
        self._reduce_not_before = 0.0
        self._quorum_looked = float("-inf")  # monotonic time of the last quorum count
        self._close_sent: CloseWithWrite | None = None  # the last close sent with results

    @property
    def partition_id(self) -> str:
        """The partition it moves."""
        return self.lease.partition_id

    @property
    def notifies(self) -> bool:
        """Whether the partition's end writes an event: it names a notify URL, or the
        processor has a default one."""
        return (self.lease.settings.notify is not None
                or self.config.notify_default is not None)

    async def confirm_lease(self) -> bool:
        """Re-read the partition after a fenced write: still ours, or lost?"""
        async with self.lease.lock:
            state = await self.store.partition_state(self.partition_id)
            if (state is not None and state.owner == self.keeper.owner
                    and state.status == Status.AVAILABLE and state.lease_live):
                self.lease.adopt(state.version, state.gate)
                return True
        if state is not None and state.status in STOPPED_BY_CLIENT:
            self.keeper.stop_lease(self.lease)
        else:
            self.keeper.mark_lost(self.lease)
        return False

    async def reduce(self, now: float) -> Pass:
        """One call of the reduce at the current gate
        (:class:`~watcher.dispatch.reducer.GateReducer`); when nothing is left to reduce,
        the gate moves on as any other.

        Raises the database's error when a read or write fails.
        """
        if now < self._reduce_not_before:  # woken early during a retry's backoff
            return Pass(wait=self._reduce_not_before - now)
        outcome = await self.reducer.run_once()
        kind = outcome.kind
        if kind is ReduceOutcomeKind.NOTHING:
            return await self.run_once()
        if kind is ReduceOutcomeKind.WROTE:
            return Pass(wait=0.0)
        if kind is ReduceOutcomeKind.RETRY:
            self._reduce_not_before = time.monotonic() + outcome.wait
            return Pass(wait=max(MIN_WAIT, outcome.wait))
        if kind is ReduceOutcomeKind.BUSY:
            return Pass(wait=self.config.poll_interval)
        if kind is ReduceOutcomeKind.PAUSED:
            await self.keeper.release(self.lease, reason="paused")
            return Pass(wait=None)
        if kind is ReduceOutcomeKind.FAILED or self.lease.lost:
            return Pass(wait=None)
        self.hooks.lease_conflict(self.partition_id)
        return Pass(wait=0.0 if await self.confirm_lease() else None)

    async def run_once(self) -> Pass:
        """The gate has nothing ready or in flight: wait, move it, fail or close the partition.

        Raises the database's error when a read or write fails.
        """
        lease = self.lease
        if self.config.auto_close and lease.may_close_at_once:
            closed = await self._close_at_once()
            if closed is not None:
                return closed
        # What the summary decides is written guarded by the version it was read at: a
        # completion after the read moves the version on, and a renewal would adopt it.
        seen = lease.version
        read = await self.store.gate_summary(self.partition_id, lease.gate)
        summary, short = await self._under_quorum(read)
        action = decide_gate(summary, auto_close=self.config.auto_close,
                             manual_checkpoint=self.config.manual_checkpoint,
                             continue_on_failure=lease.settings.continue_on_failure)
        if action.move is GateMove.WAIT and await self._park(summary, seen):
            return Pass(wait=None, move=action.move)
        if action.move is GateMove.WAIT:
            wait = self.config.poll_interval
            for seconds in (summary.seconds_to_next_retry, summary.seconds_to_deadline):
                if seconds is not None:
                    wait = min(wait, seconds)
            return Pass(wait=max(MIN_WAIT, wait), move=action.move)
        if action.move is GateMove.EXPIRE:
            await self._expire_waits()
            return Pass(wait=0.0, move=action.move)
        if action.move is GateMove.IDLE:
            return Pass(wait=self.config.poll_interval, move=action.move)
        if action.move is GateMove.RELEASE:
            await self.keeper.release(lease, reason="paused")
            return Pass(wait=None, move=action.move)
        status = {GateMove.FAIL: Status.FAILED.value,
                  GateMove.CLOSE: Status.COMPLETE.value}.get(action.move)
        from_gate = lease.gate
        # A failure stores why (read before the write), and logs it once it is written.
        failure = GateFailure(
            self.partition_id, self.pipeline, from_gate, summary.failed,
            None if short else await read_failed_item(self.store, self.partition_id,
                                                    self.pipeline, from_gate),
            short, read.failed,
        ) if action.move is GateMove.FAIL else None
        error = failure.error if failure else None
        async with lease.lock:
            if lease.lost:
                return Pass(wait=None)
            progress = lease.progress(time.monotonic())
            timeline = await self._timeline_after_move(
                summary.now, progress, action.gate if status is None else None)
            version = await self.store.partition_transition(
                self.partition_id, seen, self.keeper.owner, gate=action.gate,
                status=status, timeline=timeline, last_error=error,
                notify=self.notifies, notify_default=self.config.notify_default)
            if version is not None and timeline is not None:
                lease.timeline_written(timeline, progress)
        if version is None:
            # Someone wrote the partition since the summary: a client added items or
            # moved the gate, a completion moved an item (re-evaluate), or another
            # watcher took it (stop).
            self.hooks.lease_conflict(self.partition_id)
            confirmed = await self.confirm_lease()
            return Pass(wait=0.0 if confirmed else None, move=action.move)
        lease.wrote(version, action.gate)
        if action.move is GateMove.ADVANCE:
            assert action.gate is not None
            self.hooks.gate_advanced(self.partition_id, from_gate, action.gate,
                                     pipeline=self.pipeline)
            log.info("action=gate_advanced partition=%s pipeline=%s from=%d to=%d",
                     self.partition_id, self.pipeline, from_gate, action.gate)
            return Pass(wait=0.0, move=action.move)
        if failure is not None:
            self._ended(Status.FAILED.value)
            failure.log()
        else:
            self._ended(Status.COMPLETE.value, from_gate)
        return Pass(wait=None, move=action.move)

    def close_with(self, writes: Sequence[ItemWrite], in_hand: ItemsInHand
                   ) -> CloseWithWrite | None:
        """The close to send with ``writes`` when they are the gate's last results as far
        as the supervisor knows (``in_hand`` holds only queued results:
        :meth:`~watcher.dispatch.in_hand.ItemsInHand.only_results`;
        :func:`~watcher.leasing.closing.close_request`), or ``None``: also while the last
        close sent waits for its writer's answer (items read since were not in it: one
        close at a time), where the partition closes by hand, its end writes an event, or
        the store cannot send a close with results (:attr:`~watcher.store.Store.
        closes_with_writes`)."""
        sent = self._close_sent
        if (not self.config.auto_close or self.notifies or not self.store.closes_with_writes
                or not in_hand.only_results() or (sent is not None and not sent.answered)):
            return None
        self._close_sent = close_request(self.lease, writes, len(in_hand),
                                         self.store.time_to_record(), time.monotonic())
        return self._close_sent

    def closed_with_write(self, request: CloseWithWrite) -> None:
        """``request``'s close went through with its results: the partition is complete."""
        self.lease.timeline_written(request.timeline, request.progress)
        self._ended(Status.COMPLETE.value, request.gate)

    def mark_quorum(self, writes: list[ItemWrite]) -> None:
        """Tell each of ``writes`` (answers at the current gate) the gate's quorum, if it
        has one: the write that meets it skips the gate's other items in its transaction."""
        k = self.lease.settings.quorum_at(self.lease.gate)
        if k:
            for write in writes:
                write.quorum = (self.lease.gate, k)

    async def quorum_met(self, written: bool, *, in_flight: bool) -> bool:
        """Whether the current gate has a quorum and enough of its items are complete
        (the others are then skipped, if a racing write did not already). Counted when
        ``written`` (an answer that may have met it was written) or, with calls
        ``in_flight``, once a poll interval (a completion by token may have met it: the
        calls are then given up instead of awaited) (:func:`~watcher.rules.completions.
        quorum_look_due`); otherwise False without a read.

        Raises the database's error when the count or the skip fails.
        """
        k = self.lease.settings.quorum_at(self.lease.gate)
        if not k:
            return False
        now = time.monotonic()
        if not quorum_look_due(written, in_flight=in_flight,
                               since_last_look=now - self._quorum_looked,
                               poll_interval=self.config.poll_interval):
            return False
        self._quorum_looked = now
        return await self.store.quorum_settle(self.partition_id, self.lease.gate, k) >= k

    async def _under_quorum(self, summary: GateSummary
                            ) -> tuple[GateSummary, tuple[int, int] | None]:
        """The summary as the gate's quorum has it (:func:`~watcher.rules.completions.
        decide_quorum`): with ``k`` items complete, the others are settled as skipped
        (if a racing answer's transaction did not already) and the gate passes. Without
        a quorum at the gate, ``summary`` as it is. Beside it, ``(k, complete)`` when the
        quorum is unreachable (else ``None``), for the partition's error.

        Raises the database's error when the count or the skip fails.
        """
        k = self.lease.settings.quorum_at(self.lease.gate)
        if not k:
            return summary, None
        complete = await self.store.quorum_settle(self.partition_id, self.lease.gate, k)
        move = decide_quorum(summary, k, complete)
        if move is not QuorumMove.UNREACHABLE:
            return summary_under_quorum(summary, move), None
        log.warning("action=quorum_unreachable partition=%s pipeline=%s gate=%d k=%d "
                    "complete=%d", self.partition_id, self.pipeline, self.lease.gate, k,
                    complete)
        return summary_under_quorum(summary, move), (k, complete)

    async def _park(self, summary: GateSummary, seen: int) -> bool:
        """Let the lease go when every open item at the gate waits for a completion
        and the earliest deadline is more than a poll away: the partition then holds
        no lease, no slot and no poll until a completion or that deadline brings it
        back (:meth:`~watcher.store.Store.partition_park`), guarded by ``seen``, the
        version ``summary`` was read at. Returns whether it let go (``False``:
        something moved meanwhile; the gate is looked at again).

        Raises the database's error when the write fails.
        """
        deadline = summary.seconds_to_deadline
        if (summary.pending or not summary.waiting or deadline is None
                or deadline <= self.config.poll_interval):
            return False
        lease = self.lease
        async with lease.lock:
            if lease.lost or lease.closed:
                return False
            parked = await self.store.partition_park(self.partition_id, seen,
                                                     self.keeper.owner)
        if not parked:
            return False
        self.keeper.forget(lease)
        self.hooks.lease_released(self.partition_id)
        log.info("action=lease_released partition=%s pipeline=%s owner=%s reason=waiting "
                 "waiting=%d", self.partition_id, self.pipeline, self.keeper.owner,
                 summary.waiting)
        return True

    async def _expire_waits(self) -> None:
        """Time out the items waiting at the gate whose deadline passed: each gets the
        error ``timed out waiting after <n> s``, which spends an attempt (it is called
        again with a new token) or, with the ``fail`` policy, fails it. Written as any
        result, guarded by the item's version: a completion that won first makes the
        timeout miss.

        Raises the database's error when the read or the write fails.
        """
        lease, config = self.lease, self.config
        expired = await self.store.items_wait_expired(self.partition_id, lease.gate,
                                                      config.result_batch)
        policy = RetryPolicy.of(config)
        writes = []
        for wait in expired:
            message = timeout_message(wait.timeout)
            error = (NonRetryableError(message)
                     if fails_on_timeout(wait.on_timeout, config.wait_timeout_policy)
                     else RetryableError(message))
            writes.append(write_for_error(self.partition_id, wait.item, error, policy))
            log.warning("action=wait_timed_out partition=%s pipeline=%s item=%s gate=%d "
                        "timeout=%s", self.partition_id, self.pipeline, wait.item.id,
                        lease.gate, wait.timeout)
        if writes:
            await self.store.items_apply(writes, self.keeper.owner)

    async def _close_at_once(self) -> Pass | None:
        """Close the partition in one guarded write, before its summary is read
        (:mod:`watcher.store.sql.closing`); ``None`` when it did not close, and then
        this lease does not try again (the summary says what comes next).

        The timeline's time is the store clock's without a round trip
        (:meth:`~watcher.store.base.StoreBase.time_to_record`); with none recent
        enough, the summary is read instead, and its time is the next reading.

        Raises the database's error when the write fails.
        """
        lease = self.lease
        now = self.store.time_to_record()
        if now is None:
            return None
        from_gate = lease.gate
        async with lease.lock:
            if lease.lost:
                return Pass(wait=None)
            progress = lease.progress(time.monotonic())
            timeline = await self._timeline_after_move(now, progress, None)
            assert timeline is not None  # a move's timeline, with its time known
            version = await self.store.partition_close_when_done(
                self.partition_id, lease.version, self.keeper.owner, gate=from_gate,
                failures_allowed=lease.settings.continue_on_failure, timeline=timeline,
                notify=self.notifies, notify_default=self.config.notify_default)
            if version is None:
                lease.close_refused = True
                return None
            lease.timeline_written(timeline, progress)
        lease.wrote(version)
        self._ended(Status.COMPLETE.value, from_gate)
        return Pass(wait=None, move=GateMove.CLOSE)

    def _ended(self, status: str, from_gate: int | None = None) -> None:
        """The partition closed with ``status`` (its lease with it); logged here but
        for a failure, whose line names a failed item."""
        self.keeper.forget(self.lease)
        self.hooks.partition_closed(self.partition_id, status, pipeline=self.pipeline)
        if from_gate is not None:
            log.info("action=partition_closed partition=%s pipeline=%s status=%s gate=%d",
                     self.partition_id, self.pipeline, status, from_gate)

    async def _timeline_after_move(self, now: datetime | None, progress: Progress,
                                   to_gate: int | None) -> str | None:
        """The timeline the move writes (:func:`watcher.rules.timeline.record_move`): the stay
        at the gate left ends at ``now`` (the gate summary's time, by the store's
        clock), one at ``to_gate`` begins (``None``: the partition closes).

        The stored timeline is read once when the lease's renewals have not read it
        yet (a gate that drains within seconds of the take). ``None`` (the move leaves
        the timeline as it is) without ``now``.

        Raises the database's error when that read fails.
        """
        lease = self.lease
        if now is None:
            return None
        if not lease.timeline_known:
            _, lease.timeline = await self.store.partition_timeline(self.partition_id)
            lease.timeline_known = True
        return encode_timeline(record_move(decode_timeline(lease.timeline), now, progress,
                                           to_gate))
