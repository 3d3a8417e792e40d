"""What one completion of a waiting item writes, as a pure decision.

A completion answers a waiting item exactly as a handler's answer would
(:func:`watcher.rules.decisions.write_for_result`,
:func:`~watcher.rules.decisions.write_for_error`),
with one difference: an answer that cannot be applied is refused
(:class:`~watcher.errors.CompletionRefusedError`, naming the field) instead of
failing the item, so the completer can correct it and the token stays usable.
"""

from __future__ import annotations

from watcher.errors import CompletionRefusedError
from watcher.protocol import ProcessorError, Result
from watcher.records import ItemWrite, ReadyItem
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
                     spawn_limits: SpawnLimits = DEFAULT_SPAWN_LIMITS) -> ItemWrite:
    """The write a completion ``answer`` makes of the waiting ``item`` (read at its
    waiting version), its partition being at ``partition_gate``. An answer that waits
    again parks the item with ``new_token``.

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
                            spawn_limits=spawn_limits, completion_token=new_token)


def _field_of(problem: str) -> str:
    """The answer field a :func:`~watcher.rules.decisions.result_problem` message is about."""
    for name in ("wait", "snooze", "gate", "done", "data"):
        if name in problem:
            return name
    return "answer"
