"""Pure decisions: when a partition reads ready items, what it does when its gate has
nothing ready, and what an attempt's outcome does to an item. Plain values in, plain
values out. Which partitions to take or steal: :mod:`watcher.rules.balance`.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import Enum

from watcher.config import WatcherConfig
from watcher.models import MAX_GATE, Status
from watcher.protocol import (
    NonRetryableError,
    ProcessorError,
    Result,
    RetryableError,
)
from watcher.records import (
    GateSummary,
    ItemWrite,
    NewItem,
    ReadyItem,
)
from watcher.rules.delays import MAX_SNOOZE_SECONDS, snooze_problem
from watcher.rules.error_history import appended
from watcher.rules.spawn import (
    DEFAULT_SPAWN_LIMITS,
    SpawnConflictError,
    SpawnLimits,
    resolve_spawn,
    spawn_problem,
)
from watcher.waits import new_completion_token, wait_problem, wait_write

# -- gates -------------------------------------------------------------------


class GateMove(Enum):
    """What a partition whose current gate has nothing ready does next."""

    WAIT = "wait"  # items at the gate are in flight or waiting for their retry time
    FAIL = "fail"  # an item at the gate failed: the fan-in cannot complete
    ADVANCE = "advance"  # jump to the lowest gate holding available items
    CLOSE = "close"  # nothing left anywhere: the partition is complete
    IDLE = "idle"  # nothing to do until a client adds items or moves the gate
    EXPIRE = "expire"  # waiting items at the gate passed their deadline: time them out
    RELEASE = "release"  # a client paused the partition: let the lease go


@dataclass(frozen=True, slots=True)
class GateAction:
    """A :class:`GateMove`, with the gate to jump to for ``ADVANCE``."""

    move: GateMove
    gate: int | None = None


def decide_gate(summary: GateSummary, *, auto_close: bool, manual_checkpoint: bool,
                continue_on_failure: bool = False) -> GateAction:
    """Decide what a partition does when no item at its gate is ready to dispatch.

    With ``continue_on_failure`` (the partition's ``on_item_failure="continue"``)
    a failed item does not stop the fan-in: the partition goes on with the others.
    A paused partition lets its lease go (nothing is in flight when this is asked),
    so its processor's slots and lease room go to other work until it is resumed.
    Items waiting for a completion hold the gate until their deadline, which times
    them out (``EXPIRE``); a failed item fails the partition without waiting for them.
    """
    if summary.paused:
        return GateAction(GateMove.RELEASE)
    if summary.pending > 0:
        return GateAction(GateMove.WAIT)
    if summary.failed > 0 and not continue_on_failure:
        return GateAction(GateMove.FAIL)
    if summary.waiting > 0:
        if summary.seconds_to_deadline is not None and summary.seconds_to_deadline <= 0:
            return GateAction(GateMove.EXPIRE)
        return GateAction(GateMove.WAIT)
    if summary.next_gate is not None:
        if manual_checkpoint:
            return GateAction(GateMove.IDLE)
        return GateAction(GateMove.ADVANCE, summary.next_gate)
    return GateAction(GateMove.CLOSE if auto_close else GateMove.IDLE)


def reduces_to_run_again(reduce_gates: Collection[int], status: str, *, reopen_at: int,
                         stopped_at: int) -> list[int]:
    """The reduce gates that run again when ``retry_failed`` re-opens a partition that
    stopped at gate ``stopped_at`` with ``status``, at gate ``reopen_at`` (its lowest
    failed gate, at most ``stopped_at``).

    When the gate moves back, every reduce gate from ``reopen_at`` up to
    ``stopped_at``: the retried items will reach it again, and its reduce must see
    the whole gate, not only them (one under way at ``stopped_at`` starts over,
    its stored progress being dropped). When it does not, the one at
    ``stopped_at`` only if the partition completed it; a failed or cancelled
    partition's reduce there resumes from its stored page instead.
    """
    if reopen_at == stopped_at and status != Status.COMPLETE:
        return []
    return sorted(gate for gate in reduce_gates if reopen_at <= gate <= stopped_at)


# -- read pacing -------------------------------------------------------------


class ReadChoice(Enum):
    """Whether a partition's supervisor reads ready items now."""

    READ = "read"  # start calls: from rows read ahead, or else from a read of ready items
    WAIT_FOR_SLOTS = "wait_for_slots"  # too few slots free: wait for a turn at freed ones
    WAIT_FOR_POLL = "wait_for_poll"  # the gate looked empty: look again at the next poll
    MOVE_GATE = "move_gate"  # the gate is drained: its summary says what comes next


def decide_read(*, free_slots: int, refill_at: int, slots_in_use: int, in_flight: int,
                notified: bool, gate_looked_empty: bool, since_last_read: float,
                poll_interval: float, read_ahead: int = 0) -> ReadChoice:
    """Decide whether to read ready items now.

    Reading after every single completion would cost one query per item.
    Instead, while calls are in flight (of this partition or, the slots being
    shared, of any other), wait until ``refill_at`` slots are free; partitions
    take turns at the freed slots. After a read that found the gate empty,
    wait for the next poll (new items come only from clients, whose writes
    notify, or from retries), unless nothing of this partition is in flight
    anymore: then the gate is drained, and the gate's summary (not another
    read) says whether it moves, closes or waits. ``gate_looked_empty`` must
    be cleared whenever an item may have become ready at the gate since that
    read (a result that keeps its item there, an item let go unwritten, a
    gate step that waits); a notification reads at once.

    ``free_slots``, ``refill_at`` and ``slots_in_use`` describe the watcher's
    shared slot pool; ``in_flight`` counts this partition's calls;
    ``notified`` says a client wrote the partition since the last read;
    ``read_ahead`` counts the rows it holds from a read, not dispatched yet: they
    start before anything is read again, and the gate is not drained while any wait.
    """
    idle = in_flight == 0 and read_ahead == 0
    if idle and gate_looked_empty and not notified:
        return ReadChoice.MOVE_GATE
    if free_slots < refill_at and slots_in_use > 0 and not (idle and gate_looked_empty):
        return ReadChoice.WAIT_FOR_SLOTS
    if idle or notified or read_ahead:
        return ReadChoice.READ
    if gate_looked_empty and since_last_read < poll_interval:
        return ReadChoice.WAIT_FOR_POLL
    return ReadChoice.READ


# -- item outcomes -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with jitter; an item fails after ``max_retries`` retries."""

    max_retries: int = 5
    backoff: float = 1.0
    backoff_max: float = 300.0
    jitter: float = 0.5  # the delay is scaled by a random factor in [1 - jitter, 1 + jitter]

    @classmethod
    def of(cls, config: WatcherConfig) -> RetryPolicy:
        """The item retry policy ``config`` describes."""
        return cls(config.max_retries, config.retry_backoff, config.retry_backoff_max)

    def delay(self, attempts: int, rng: random.Random | None = None) -> float:
        """The wait before the next try, after ``attempts`` errors (1-based)."""
        base = min(self.backoff_max, self.backoff * 2 ** max(0, attempts - 1))
        spread = (rng or random).uniform(1 - self.jitter, 1 + self.jitter)
        return min(self.backoff_max, base * spread)


MAX_ERROR_LENGTH = 2000


def idempotency_step(item: ReadyItem) -> int:
    """A number that stays the same across the retries of one logical step.

    Every error bumps an item's version and attempts together, and every
    success resets attempts, so ``version - attempts`` only changes when the
    item makes progress (or a client resets it).
    """
    return item.version - item.attempts


def write_for_result(partition_id: str, item: ReadyItem, result: Result, partition_gate: int,
                     policy: RetryPolicy, rng: random.Random | None = None, *,
                     spawn_limits: SpawnLimits = DEFAULT_SPAWN_LIMITS,
                     completion_token: str | None = None,
                     traceparent: str | None = None) -> ItemWrite:
    """The item update a processor's result asks for, with the items it spawns.

    A gate below the partition's gate, and a spawn that cannot be written
    (:func:`~watcher.rules.spawn.spawn_problem`), are turned into a non-retryable
    error: the item fails and nothing of the answer is written. A result that
    waits parks the item (status ``waiting``, ready again at its deadline) and
    stores the key of ``completion_token``, the call's (a fresh one when ``None``:
    nobody can complete that wait, it can only time out), in place of its last
    wait's, with ``traceparent``, the span that received the answer (``None``:
    tracing off).
    """
    gate = item.gate if result.gate is None else result.gate
    if gate < partition_gate:
        return write_for_error(
            partition_id, item,
            NonRetryableError(
                f"the handler returned gate {gate}, but the partition is at gate "
                f"{partition_gate}; a result may not move an item below its partition's "
                "gate"),
            policy, rng)
    spawn: tuple[NewItem, ...] = ()
    if result.spawn:
        problem = spawn_problem(result.spawn, floor=partition_gate, limits=spawn_limits)
        if problem is not None:
            return write_for_error(
                partition_id, item,
                NonRetryableError(problem),
                policy, rng)
        spawn = resolve_spawn(result.spawn, item.gate)
    if result.wait is not None:
        # Its attempts stay: a wait that times out spends one, and a handler that parks
        # again on every call still runs out of retries.
        return ItemWrite(partition_id, item.id, item.version, Status.WAITING.value, gate,
                         attempts=item.attempts, data=result.data, spawn=spawn,
                         retry_delay=float(result.wait.timeout),
                         wait=wait_write(result.wait, completion_token or new_completion_token(),
                                        traceparent, item.wait_key))
    status = Status.COMPLETE if result.done else Status.AVAILABLE
    return ItemWrite(partition_id, item.id, item.version, status.value, gate, attempts=0,
                     data=result.data, last_error=None, spawn=spawn,
                     retry_delay=result.snooze)


def write_for_error(partition_id: str, item: ReadyItem, error: BaseException,
                    policy: RetryPolicy, rng: random.Random | None = None) -> ItemWrite:
    """The item update for a failed attempt: back off and retry, or fail; either way the
    error joins the item's error history (:func:`watcher.rules.error_history.appended`),
    whose time the write stamps from the database clock."""
    attempts = item.attempts + 1
    message = storable_text(describe_error(error))[:MAX_ERROR_LENGTH]
    history = appended(item.error_history, attempt=attempts, gate=item.gate, error=message)
    retryable = not isinstance(error, NonRetryableError)
    if not retryable or attempts > policy.max_retries:
        return ItemWrite(partition_id, item.id, item.version, Status.FAILED.value, item.gate,
                         attempts=attempts, last_error=message, error_history=history)
    delay = policy.delay(attempts, rng)
    if isinstance(error, RetryableError) and error.retry_after:
        delay = max(delay, error.retry_after)
    return ItemWrite(partition_id, item.id, item.version, Status.AVAILABLE.value, item.gate,
                     attempts=attempts, last_error=message, retry_delay=delay,
                     error_history=history)


def storable_text(text: str) -> str:
    """``text`` in a form every database stores: NUL and unpaired surrogates escaped.

    PostgreSQL rejects NUL in text and no UTF-8 encoder takes a lone
    surrogate, and either can arrive in a handler's error message.
    """
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def unstorable_write(write: ItemWrite, error: BaseException) -> ItemWrite:
    """The write that replaces ``write`` when the database refused it as a value error.

    The item fails where it stands (its gate and data unchanged), with an error
    that says why; the guard is the same version ``write`` was made against. Its
    stored error history stays as it was (the refused value may be in the history
    ``write`` carried, and the stored one is not at hand): ``last_error`` says why.
    """
    reason = storable_text(f"{type(error).__name__}: {error}")[:MAX_ERROR_LENGTH // 2]
    message = (f"the result could not be stored (status {write.status}, gate {write.gate}): "
               f"{reason}")
    if isinstance(error, SpawnConflictError):
        message = storable_text(str(error))  # it names the item, the ids and what to do
    return ItemWrite(write.partition_id, write.item_id, write.seen_version,
                     Status.FAILED.value, gate=None, attempts=write.attempts,
                     last_error=message[:MAX_ERROR_LENGTH])


def describe_error(error: BaseException) -> str:
    """A one-line description of an attempt error for ``last_error``."""
    if isinstance(error, ProcessorError):
        return error.message
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def result_problem(result: object, max_data_bytes: int | None = None, *,
                   max_snooze: float = MAX_SNOOZE_SECONDS) -> str | None:
    """Why ``result`` is not a valid :class:`Result`, or ``None`` when it is.

    ``max_data_bytes`` (the item size limit), when given, bounds the new data;
    ``max_snooze`` bounds a snooze (see :func:`~watcher.rules.delays.snooze_problem`).
    """
    if not isinstance(result, Result):
        return f"the processor returned {type(result).__name__}, expected a Result"
    if result.gate is not None and (
        isinstance(result.gate, bool) or not isinstance(result.gate, int)
        or not 0 <= result.gate <= MAX_GATE
    ):
        return f"the result's gate must be a whole number from 0 to {MAX_GATE}, got {result.gate!r}"
    if not isinstance(result.done, bool):
        return f"the result's done must be true or false, got {result.done!r}"
    if result.data is not None and not isinstance(result.data, bytes):
        return f"the result's data must be bytes, got {type(result.data).__name__}"
    if (max_data_bytes is not None and result.data is not None
            and len(result.data) > max_data_bytes):
        return (f"the result's data is {len(result.data)} bytes, over the item size limit "
                f"of {max_data_bytes} bytes (max_item_bytes)")
    if result.snooze is not None:
        problem = snooze_problem(result.snooze, max_snooze)
        if problem is None and (result.done or result.gate is not None):
            problem = ("'snooze' keeps the item at its gate to call it again later; it "
                       "cannot come with 'done' or 'gate'")
        if problem is not None:
            return problem
    if result.wait is not None:
        problem = wait_problem(result.wait)
        if problem is None and (result.done or result.snooze is not None
                                or result.gate is not None):
            problem = ("'wait' parks the item at its gate until it is completed or times "
                       "out; it cannot come with 'done', 'snooze' or 'gate'")
        return problem
    return None


def write_for_outcome(partition_id: str, item: ReadyItem, outcome: Result | BaseException,
                      partition_gate: int, policy: RetryPolicy, *, max_data_bytes: int,
                      max_snooze: float, spawn_limits: SpawnLimits,
                      completion_token: str | None = None,
                      traceparent: str | None = None) -> ItemWrite:
    """The item update one call's outcome asks for: its result's
    (:func:`write_for_result`), or an error's (:func:`write_for_error`) when the call
    failed or its result is unusable (:func:`result_problem`, not retried). Never
    raises: a bug met while working out the result's update is recorded on the item
    like a processor error."""
    if isinstance(outcome, BaseException):
        return write_for_error(partition_id, item, outcome, policy)
    try:
        problem = result_problem(outcome, max_data_bytes, max_snooze=max_snooze)
        if problem is None:
            return write_for_result(partition_id, item, outcome, partition_gate, policy,
                                    spawn_limits=spawn_limits,
                                    completion_token=completion_token,
                                    traceparent=traceparent)
        error: BaseException = NonRetryableError(f"item {item.id!r}: {problem}")
    except Exception as bug:
        error = bug
    return write_for_error(partition_id, item, error, policy)


def outcome_name(item: ReadyItem, write: ItemWrite) -> str:
    """A short label for what an attempt did: complete, advanced, looped, snoozed, waiting,
    retry or failed. (A call the handler throttled writes nothing: the supervisor reports it as
    "throttled".)"""
    if write.status == Status.COMPLETE:
        return "complete"
    if write.status == Status.FAILED:
        return "failed"
    if write.status == Status.WAITING:
        return "waiting"
    if write.last_error is not None:
        return "retry"
    if write.retry_delay is not None:
        return "snoozed"
    return "advanced" if write.gate != item.gate else "looped"


def completed_in_place(writes: Sequence[ItemWrite], outcomes: Sequence[bool | BaseException],
                       gate: int) -> bool:
    """Whether every write of a batch was applied and completed its item at ``gate``
    (none moved it to another gate, failed it, left it for a retry or spawned items):
    then, for all these results know, nothing of theirs is left at the partition's
    gates, and a drained gate may try to close it at once
    (:mod:`watcher.store.sql.closing`)."""
    return all(outcome is True and write.status == Status.COMPLETE
               and write.gate in (None, gate) and not write.spawn
               for write, outcome in zip(writes, outcomes, strict=True))
