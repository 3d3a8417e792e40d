"""Calling a processor for one dispatched batch: the items of one read.

A processor with ``process_batch`` gets the batch in one call
(:func:`call_batch`). A per-item processor is called for every item at once
(:func:`call_each`), and the finished calls are handed on in groups: all of
them together when the batch finishes within :data:`GROUP_WAIT`, else what
has finished by then, and so on; so one slow call does not hold the others'
results back for long, and a batch of quick calls is written as one.

Each call runs in a copy of the context, and sees one task from start to end, so that
what it does with its task (``asyncio.timeout``, anyio's cancel scopes in httpx,
``asyncio.current_task()``) works as in a task of its own. The calls start one after
another in the batch's own task: a call that finishes without waiting on anything (a
step that only computes, as most library-mode steps do) costs a function call, with no
task, no turn of the event loop and no wait. The first call that waits goes on in the
batch's task, which runs it step by step as a task would; each call after it gets a
task of its own (started eagerly on Python 3.12 and later). A batch of one item is
called in the batch's own task.
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

    The calls start in this task, one after another, each in a context of its own: a
    call that finishes without waiting costs a function call, not a task. The first
    call that waits goes on in this task (:func:`_drive`, which also hands on the
    groups while it waits); every call after it gets a task of its own.

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
    groups = _Groups(finished, group_wait)
    held: tuple[int, Coroutine[Any, Any, CallOutcome], object, contextvars.Context] | None = None
    for position, work in enumerate(works):
        call, context = _outcome_of(process, work), contextvars.copy_context()
        if held is not None:
            groups.follow(_task(call, context), position)
            continue
        try:
            waiting_on = context.run(call.send, None)
        except StopIteration as stop:  # it never waited
            groups.add(position, stop.value)
        else:
            held = (position, call, waiting_on, context)
    try:
        if held is not None:
            position, call, waiting_on, context = held
            try:
                groups.add(position, await _drive(call, waiting_on, context, groups.turn))
            finally:
                call.close()  # ended already, unless what ``finished`` raised cut it short
        await groups.rest()
    finally:
        await groups.cancel()


class _Groups:
    """The finished calls of one batch, handed on in groups: those that never waited,
    and the tasks' as they end, at most :data:`GROUP_WAIT` after the last hand-on."""

    def __init__(self, finished: Finished, group_wait: float) -> None:
        self._finished = finished
        self._group_wait = group_wait
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._cancelling = self._task.cancelling() if self._task else 0
        self._due = self._loop.time() + group_wait
        self._positions: list[int] = []
        self._outcomes: list[CallOutcome] = []
        self._running: dict[asyncio.Task[CallOutcome], int] = {}

    def add(self, position: int, outcome: CallOutcome) -> None:
        """A call's outcome, to hand on with the next group."""
        self._positions.append(position)
        self._outcomes.append(outcome)

    def follow(self, task: asyncio.Task[CallOutcome], position: int) -> None:
        """A call running in ``task``: its outcome joins a group once it ends."""
        if task.done():  # started eagerly and finished without waiting
            self.add(position, task.result())
            return
        self._running[task] = position

    def turn(self) -> float:
        """Hand on what has finished when a group is due; the seconds to the next."""
        now = self._loop.time()
        if self._task is not None and self._task.cancelling() > self._cancelling:
            return self._group_wait  # the batch is being cancelled: nothing more goes on
        if now >= self._due:
            self._hand_on()
            self._due = now + self._group_wait
        return self._due - now

    async def rest(self) -> None:
        """Wait for the tasks' calls, handing on a group each ``group_wait`` (and the
        last when they have all ended).

        Raises :class:`asyncio.CancelledError` when cancelled.
        """
        pending = {task for task in self._running if not task.done()}
        while pending:
            _, pending = await asyncio.wait(pending, timeout=max(0.0, self.turn()))
        self._hand_on()

    async def cancel(self) -> None:
        """Cancel the calls still running (the batch ends early), and await them."""
        pending = [task for task in self._running if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    def _hand_on(self) -> None:
        for task in [task for task in self._running if task.done()]:
            self.add(self._running.pop(task), task.result())
        if self._positions:
            positions, outcomes = self._positions, self._outcomes
            self._positions, self._outcomes = [], []
            self._finished(positions, outcomes)


async def _drive(call: Coroutine[Any, Any, CallOutcome], waiting_on: object,
                 context: contextvars.Context, turn: Callable[[], float]) -> CallOutcome:
    """Go on with ``call``, started in this task and now waiting on ``waiting_on`` (what
    its first step yielded), in this task and in its own ``context``, step by step as
    a task would run it; between its steps, ``turn()`` hands on the other calls' groups
    and says how long until the next is due.

    So the call sees one task from start to end (what ``asyncio.timeout`` and anyio's
    cancel scopes need): this one. This task's cancellation is passed on to the call as
    a task passes it to its coroutine (the future it waits on is cancelled); when the
    call has ended, a cancellation it did not take for its own (a timeout inside it
    takes its own) is raised here.

    Raises :class:`asyncio.CancelledError` when this task was cancelled.
    """
    task = asyncio.current_task()
    assert task is not None
    cancelling = task.cancelling()
    while True:
        cancel: BaseException | None = None
        try:
            if waiting_on is None:  # a bare yield: one turn of the loop
                await asyncio.sleep(0)
            elif asyncio.isfuture(waiting_on) and getattr(
                    waiting_on, "_asyncio_future_blocking", False):
                waiting_on._asyncio_future_blocking = False
                await _until_done(waiting_on, turn)
            else:
                cancel = RuntimeError(f"a call yielded {waiting_on!r}: await futures only")
        except asyncio.CancelledError as cancelled:
            # As a task does: cancel what the call waits on, and it sees CancelledError
            # when it looks; if that is done already, the error is thrown in instead.
            if not (asyncio.isfuture(waiting_on) and waiting_on.cancel()):
                cancel = cancelled
        try:
            waiting_on = (context.run(call.throw, cancel) if cancel is not None
                          else context.run(call.send, None))
        except StopIteration as stop:
            if task.cancelling() > cancelling:
                raise asyncio.CancelledError from None
            return stop.value


async def _until_done(future: asyncio.Future[Any], turn: Callable[[], float]) -> None:
    """Wait for ``future`` to be done, calling ``turn()`` whenever the time it asks for
    has passed.

    Raises :class:`asyncio.CancelledError` when cancelled (``future`` is left as it is).
    """
    loop = asyncio.get_running_loop()
    while not future.done():
        waiter = loop.create_future()

        def wake(_: object = None, waiter: asyncio.Future[None] = waiter) -> None:
            if not waiter.done():
                waiter.set_result(None)

        future.add_done_callback(wake)
        timer = loop.call_later(max(0.0, turn()), wake)
        try:
            await waiter
        finally:
            future.remove_done_callback(wake)
            timer.cancel()


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
