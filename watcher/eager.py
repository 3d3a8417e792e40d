"""Running a coroutine's first step at once, and giving it a task only if it waits.

Many processor calls (a no-op, a cache hit, a pure computation) finish without
ever waiting; a task for each costs more than the call itself. Python 3.12's
eager task factory does this inside asyncio; these two functions do the same
for the call sites that want it on 3.11: :func:`first_step` runs the coroutine
until it first waits, and :func:`rest` is awaited (in a task) to finish one
that did.
"""

from __future__ import annotations

import contextvars
import types
from collections.abc import Coroutine, Generator
from typing import Any


def first_step(call: Coroutine[Any, Any, Any], context: contextvars.Context
               ) -> tuple[bool, Any]:
    """Run ``call`` in ``context`` until it finishes or first waits.

    Returns ``(True, result)`` when it finished, or ``(False, awaited)``: what
    it waits on, to hand to :func:`rest`.

    Raises:
        Exception: whatever ``call`` raised in that first step.
    """
    try:
        awaited = context.run(call.send, None)
    except StopIteration as finished:
        return True, finished.value
    return False, awaited


@types.coroutine
def rest(call: Coroutine[Any, Any, Any], awaited: Any) -> Generator[Any, None, Any]:
    """Await the rest of ``call``, which :func:`first_step` left waiting on ``awaited``.

    Behaves as ``await call`` would have from that point: the result is
    returned, exceptions propagate, and a cancellation (or any exception
    thrown in) reaches ``call`` where it waits.
    """
    while True:
        try:
            yield awaited
        except GeneratorExit:
            call.close()
            raise
        except BaseException as error:
            try:
                awaited = call.throw(error)
            except StopIteration as finished:
                return finished.value
            continue
        return (yield from call)  # type: ignore[misc]
