"""Calling user code: a handler function for one item, a reduce for one page, each
outcome (a value, :class:`~handlers.errors.Retry`, another
:class:`~handlers.errors.HandlerError`, any other exception, a value that is not a
result) turned into the :class:`~handlers.responses.Answer` the processor reads.
Nothing here raises but ``CancelledError``: a bug in user code answers 500 and never
crashes the app. :class:`handlers.asgi.HandlerApp` routes requests here.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeAlias, cast

from handlers.errors import HandlerError, Retry
from handlers.model import Item, ReducePage, Result
from handlers.reduce import Reduce, ReduceFunction, call_user
from handlers.responses import Answer
from handlers.wire.contract import (
    ResultError,
    coerce_result,
    encode_error,
    encode_result,
    exception_message,
)
from handlers.wire.reduce import coerce_reduced, encode_reduced

# The app's logger: logging set up for ``handlers.asgi`` covers the outcome lines too.
log = logging.getLogger("handlers.asgi")

# None is left out on purpose: a type checker then flags a forgotten return.
HandlerReturn: TypeAlias = Result | Mapping[str, Any]
HandlerFunction: TypeAlias = Callable[[Item], HandlerReturn | Awaitable[HandlerReturn]]


class Target:
    """A handler function and how to call it.

    Raises:
        TypeError: ``func`` is not callable.
    """

    __slots__ = ("func", "is_async")

    def __init__(self, func: HandlerFunction) -> None:
        if not callable(func):
            raise TypeError(f"a handler must be a function taking an Item, got {func!r}")
        self.func = func
        self.is_async = _is_async(func)


async def call_handler(target: Target, item: Item,
                       threads: Callable[[], ThreadPoolExecutor]) -> Answer:
    """Run the handler function for ``item`` and turn any outcome into an answer.

    An async function runs on the loop; a sync one on the pool ``threads()`` returns
    (asked for only then, so the pool starts with the first sync call).
    Never raises (but ``CancelledError``): user errors become error answers.
    """
    value: Any
    try:
        if target.is_async:
            value = await cast("Callable[[Item], Awaitable[HandlerReturn]]",
                               target.func)(item)
        else:
            value = await asyncio.get_running_loop().run_in_executor(
                threads(),
                functools.partial(contextvars.copy_context().run, target.func, item))
            if inspect.isawaitable(value):  # a sync wrapper around an async function
                value = await value
    except Retry as error:
        log.debug("action=item_retry partition=%s item=%s gate=%d attempt=%d",
                  item.partition_id, item.id, item.gate, item.attempt)
        return Answer(error.status, encode_error(
            error.message, no_retry=False, retry_after=error.retry_after),
            error.retry_after)
    except HandlerError as error:
        log.info("action=item_refused partition=%s item=%s gate=%d attempt=%d status=%d "
                 "no_retry=%s", item.partition_id, item.id, item.gate, item.attempt,
                 error.status, error.no_retry)
        return Answer(error.status, encode_error(error.message, no_retry=error.no_retry))
    except Exception as error:  # a handler bug answers 500, never crashes the app
        log.exception("action=handler_exception partition=%s item=%s gate=%d attempt=%d",
                      item.partition_id, item.id, item.gate, item.attempt)
        return Answer(500, encode_error(exception_message(error), no_retry=False))
    try:
        return Answer(200, encode_result(coerce_result(value)))
    except ResultError as error:
        log.error("action=handler_bad_result partition=%s item=%s gate=%d attempt=%d "
                  "error=%s", item.partition_id, item.id, item.gate, item.attempt, error)
        return Answer(500, encode_error(str(error), no_retry=False))


async def call_reduce(reduce: Reduce | ReduceFunction, page: ReducePage) -> Answer:
    """Run the reduce function for ``page`` and turn any outcome into an answer.

    Never raises (but ``CancelledError``): user errors become error answers.
    """
    try:
        value = await call_user(reduce, page)
    except Retry as error:
        return Answer(error.status, encode_error(
            error.message, no_retry=False, retry_after=error.retry_after),
            error.retry_after)
    except HandlerError as error:
        log.info("action=reduce_refused partition=%s gate=%d pass=%s page=%d status=%d",
                 page.partition_id, page.gate, page.pass_, page.page, error.status)
        return Answer(error.status, encode_error(error.message, no_retry=error.no_retry))
    except Exception as error:  # a reduce bug answers 500, never crashes the app
        log.exception("action=reduce_exception partition=%s gate=%d pass=%s page=%d",
                      page.partition_id, page.gate, page.pass_, page.page)
        return Answer(500, encode_error(exception_message(error), no_retry=False))
    try:
        return Answer(200, encode_reduced(coerce_reduced(value)))
    except ResultError as error:
        log.error("action=reduce_bad_answer partition=%s gate=%d error=%s",
                  page.partition_id, page.gate, error)
        return Answer(500, encode_error(str(error), no_retry=False))


def _is_async(func: Any) -> bool:
    if inspect.iscoroutinefunction(func):
        return True
    call = getattr(func, "__call__", None)  # noqa: B004 - objects with async __call__
    return call is not None and inspect.iscoroutinefunction(call)
