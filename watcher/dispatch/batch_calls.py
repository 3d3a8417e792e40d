"""Calling a processor for one dispatched batch: the items of one read.

A processor with ``process_batch`` gets the batch in one call
(:func:`call_batch`). A per-item processor is called for every item at once
(:func:`call_each`), and the finished calls are handed on in groups: all of
them together when the batch finishes within :data:`GROUP_WAIT`, else what
has finished by then, and so on; so one slow call does not hold the others'
results back for long, and a batch of quick calls is written as one.

Each call runs in a task of its own (in a copy of the context), so that what a
call does with its task (``asyncio.timeout``, anyio's cancel scopes in httpx,
``asyncio.current_task()``) sees one task from start to end. On Python 3.12 and
later the task starts eagerly: a call that finishes without waiting on anything
(a step that only computes) is done before the next call starts, and is never
scheduled. A batch of one item is called in the batch's own task.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

from watcher.protocol import ProcessBatchCall, ProcessCall, Result, WorkItem

# How long the results of a batch's finished calls wait for its other calls before
# they are handed on without them.
GROUP_WAIT = 0.02

# A call's outcome: its result, the exception it raised, or CancelledError when the
# call cancelled itself (its item is not written and runs again).
CallOutcome = Result | BaseException
# Told the positions (in the batch) of finished calls and their outcomes.
Finished = Callable[[list[int], list[CallOutcome]], None]


class CallCounter(Protocol):
    """Told how many calls begin and end (a :class:`~watcher.flow.slots.SlotPool`)."""

    def calls_started(self, count: int) -> None: ...
    def calls_ended(self, count: int) -> None: ...


class BatchAnswerError(RuntimeError):
    """A ``process_batch`` call answered a list of the wrong length, or not a list."""


async def call_batch(process_batch: ProcessBatchCall, works: Sequence[WorkItem]
                     ) -> list[CallOutcome]:
    """Call ``process_batch`` once for ``works``; one outcome per item, in order.

    An exception the call raises, or an answer that is not one entry per item,
    is every item's outcome. Raises only :class:`asyncio.CancelledError`, when
    the caller is cancelled.
    """
    try:
        answers = await process_batch(works)
    except Exception as error:
        return [error] * len(works)
    if not isinstance(answers, Sequence) or len(answers) != len(works):
        count = len(answers) if isinstance(answers, Sequence) else type(answers).__name__
        wrong = BatchAnswerError(
            f"process_batch answered {count} for {len(works)} items: answer a list of one "
            "Result or exception per item, in the items' order")
        return [wrong] * len(works)
    return [answer if isinstance(answer, Result | BaseException)
            else TypeError(f"process_batch answered {type(answer).__name__} for an item; "
                           "answer a Result or an exception") for answer in answers]


async def call_items(process: ProcessCall, process_batch: ProcessBatchCall | None,
                     works: Sequence[WorkItem], counter: CallCounter, finished: Finished
                     ) -> None:
    """Call the processor for ``works``: in one ``process_batch`` call when it has one
    (:func:`call_batch`), else once per item (:func:`call_each`); hand the finished
    calls to ``finished``. ``counter`` is told of every item's call as it starts and
    ends, so it counts the calls in flight whether they end answered, failed or
    cancelled.

    Raises :class:`asyncio.CancelledError` when cancelled, and what ``finished`` raises.
    """
    running = len(works)
    counter.calls_started(running)

    def ended(positions: list[int], outcomes: list[CallOutcome]) -> None:
        nonlocal running
        running -= len(positions)
        counter.calls_ended(len(positions))
        finished(positions, outcomes)

    try:
        if process_batch is not None:
            ended(list(range(len(works))), await call_batch(process_batch, works))
        else:
            await call_each(process, works, ended)
    finally:
        if running:
            counter.calls_ended(running)


async def call_each(process: ProcessCall, works: Sequence[WorkItem], finished: Finished,
                    *, group_wait: float = GROUP_WAIT) -> None:
    """Call ``process`` for every item of ``works`` at once; hand finished calls to
    ``finished`` in groups (see the module docstring).

    Raises :class:`asyncio.CancelledError` when cancelled: the calls still
    running are cancelled and awaited first, and nothing more is handed on.
    """
    if len(works) == 1:  # no task of its own: the call runs in this one
        try:
            outcome: CallOutcome = await process(works[0])
        except Exception as error:
            outcome = error
        finished([0], [outcome])
        return
    tasks: dict[asyncio.Task[CallOutcome], int] = {}
    positions: list[int] = []
    outcomes: list[CallOutcome] = []
    for position, work in enumerate(works):
        task = _task(_outcome_of(process, work), contextvars.copy_context())
        if task.done():  # started eagerly and finished without waiting
            positions.append(position)
            outcomes.append(task.result())
        else:
            tasks[task] = position
    pending: set[asyncio.Task[CallOutcome]] = set(tasks)
    try:
        if not pending:
            finished(positions, outcomes)
            return
        while pending:
            done, pending = await asyncio.wait(pending, timeout=group_wait)
            if done:
                positions.extend(tasks[task] for task in done)
                outcomes.extend(task.result() for task in done)
            if positions:
                finished(positions, outcomes)
                positions, outcomes = [], []
    finally:
        if pending:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)


if sys.version_info >= (3, 12):
    def _task(call: Coroutine[Any, Any, CallOutcome], context: contextvars.Context
              ) -> asyncio.Task[CallOutcome]:
        """A task for ``call`` that runs it at once, up to its first wait."""
        return asyncio.Task(call, loop=asyncio.get_running_loop(), context=context,
                            eager_start=True)
else:
    def _task(call: Coroutine[Any, Any, CallOutcome], context: contextvars.Context
              ) -> asyncio.Task[CallOutcome]:
        """A task for ``call`` (Python 3.11 has no eager start)."""
        return asyncio.get_running_loop().create_task(call, context=context)


async def _outcome_of(process: ProcessCall, work: WorkItem) -> CallOutcome:
    """The call's result, or what it raised (its own cancellation included)."""
    try:
        return await process(work)
    except (Exception, asyncio.CancelledError) as error:
        return error
