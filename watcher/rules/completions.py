"""What completes items, as pure decisions: what one completion of a waiting item
writes, and when a gate with a quorum has enough complete items to pass.

A completion answers a waiting item exactly as a handler's answer would
(:func:`watcher.rules.decisions.write_for_result`,
:func:`~watcher.rules.decisions.write_for_error`),
with one difference: an answer that cannot be applied is refused
(:class:`~watcher.errors.CompletionRefusedError`, naming the field) instead of
failing the item, so the completer can correct it and the token stays usable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from enum import Enum

from watcher.errors import CompletionRefusedError
from watcher.models import AVAILABLE, COMPLETE
from watcher.protocol import ProcessorError, Result
from watcher.records import GateSummary, ItemWrite, ReadyItem
from watcher.rules.decisions import (
    RetryPolicy,
    result_problem,
    write_for_error,
    write_for_result,
)
from watcher.rules.delays import MAX_SNOOZE_SECONDS
from watcher.rules.spawn import DEFAULT_SPAWN_LIMITS, SpawnLimits, spawn_problem

Answer = Result | ProcessorError
"""A completion's answer: a result, or an error (``NonRetryableError``: no retry)."""


def completion_write(partition_id: str, item: ReadyItem, answer: Answer, partition_gate: int,
                     policy: RetryPolicy, *, new_token: str, max_data_bytes: int | None = None,
                     spawn_limits: SpawnLimits = DEFAULT_SPAWN_LIMITS,
                     traceparent: str | None = None) -> ItemWrite:
    """The write a completion ``answer`` makes of the waiting ``item`` (read at its
    waiting version), its partition being at ``partition_gate``. An answer that waits
    again parks the item with ``new_token`` (and the completer's ``traceparent``).

    Raises:
        CompletionRefusedError: the answer is malformed, moves the item below its own
            gate, spawns what cannot be written, or its data is over
            ``max_data_bytes``; its ``field`` names the part.
    """
    if isinstance(answer, ProcessorError):
        return write_for_error(partition_id, item, answer, policy)
    problem = result_problem(answer, max_data_bytes, max_snooze=MAX_SNOOZE_SECONDS)
    if problem is not None:
        raise CompletionRefusedError(_field_of(problem), problem)
    if answer.gate is not None and answer.gate < item.gate:
        raise CompletionRefusedError(
            "gate", f"'gate' {answer.gate} is below the item's gate {item.gate}; a completion "
                    "may keep the item at its gate or move it on, never back")
    if answer.spawn:
        problem = spawn_problem(answer.spawn, floor=partition_gate, limits=spawn_limits)
        if problem is not None:
            raise CompletionRefusedError("spawn", problem)
    return write_for_result(partition_id, item, answer, partition_gate, policy,
                            spawn_limits=spawn_limits, completion_token=new_token,
                            traceparent=traceparent)


def _field_of(problem: str) -> str:
    """The answer field a :func:`~watcher.rules.decisions.result_problem` message is about."""
    for name in ("wait", "snooze", "gate", "done", "data"):
        if name in problem:
            return name
    return "answer"


# -- quorums: the first k of N -------------------------------------------------


class QuorumMove(Enum):
    """What a gate's quorum makes of its summary (:func:`decide_quorum`)."""

    AS_USUAL = "as_usual"  # decide on the summary as it is (no failure fails it yet)
    SKIP = "skip"  # k are complete: settle the rest as skipped, then pass the gate
    PASS = "pass"  # k are complete and nothing is left: pass, whatever failed
    UNREACHABLE = "unreachable"  # too many failed: the quorum cannot be met


def decide_quorum(summary: GateSummary, k: int, complete: int) -> QuorumMove:
    """What a quorum of ``k`` does at a gate whose summary is ``summary`` and where
    ``complete`` items (counted up to ``k``) are complete or past it.

    The gate passes as soon as ``k`` items are complete: the others (available, in
    flight or waiting) are skipped. While ``k`` can still be reached, a failed item
    does not fail the gate; once the items still open cannot make up the difference,
    the quorum is unreachable.
    """
    if complete >= k:
        return QuorumMove.SKIP if summary.pending or summary.waiting else QuorumMove.PASS
    if complete + summary.pending + summary.waiting < k:
        return QuorumMove.UNREACHABLE
    return QuorumMove.AS_USUAL


def summary_under_quorum(summary: GateSummary, move: QuorumMove) -> GateSummary:
    """The summary the gate's usual decision reads under ``move``: nothing left once
    the quorum passed (skipped items are settled), and failures set aside while it can
    still be met; an unreachable quorum is judged as a gate with failures."""
    if move in (QuorumMove.SKIP, QuorumMove.PASS):
        return replace(summary, pending=0, waiting=0, failed=0,
                       seconds_to_next_retry=None, seconds_to_deadline=None)
    if move is QuorumMove.AS_USUAL:
        return replace(summary, failed=0)
    return replace(summary, failed=max(1, summary.failed))


def settles_at(write: ItemWrite, gate: int) -> bool:
    """Whether ``write`` (applied) counts towards the quorum of ``gate``: it completed
    its item, or moved it past the gate."""
    if write.status == COMPLETE:
        return True
    return write.status == AVAILABLE and write.gate is not None and write.gate > gate


def quorum_keep(writes: Sequence[ItemWrite], room: Mapping[tuple[str, int], int]
                ) -> list[bool]:
    """Which of ``writes`` (one batch, in its order) may be written, when the quorum
    gates they answer at have ``room[(partition, gate)]`` passes left (``k`` less the
    items already past the gate): every write that does not settle its item at its
    quorum's gate, and of those that do, the first ``room`` of each gate. The others
    are left out: their items are skipped with the rest of the gate once the quorum
    is met, so exactly ``k`` pass whatever the batch holds."""
    left = dict(room)
    keep = []
    for write in writes:
        if write.quorum is None or not settles_at(write, write.quorum[0]):
            keep.append(True)
            continue
        gate = (write.partition_id, write.quorum[0])
        keep.append(left.get(gate, 0) > 0)
        if keep[-1]:
            left[gate] -= 1
    return keep


def quorum_look_due(written: bool, *, in_flight: bool, since_last_look: float,
                    poll_interval: float) -> bool:
    """Whether a processor counts its gate's quorum now: after it wrote an answer that
    may have met it (``written``), or, while calls are ``in_flight``, once a poll
    interval since it last looked (a completion by token, elsewhere, may have met it:
    the calls still in flight are then given up instead of awaited). A gate with no
    call in flight is counted when it moves (the gate's summary)."""
    if written:
        return True
    return in_flight and since_last_look >= poll_interval
