"""Reduce functions: one step that sees a whole gate, at any size.

Two shapes are served at ``POST /reduce``:

- a plain function ``rank_all(page: ReducePage) -> Reduced``, which gets the
  whole gate in one call (``page.pass_ == "all"``). It is the short way for
  gates that fit one page (``--reduce-page-items``). ``GET /reduce`` says so,
  and a processor fails a partition with more items than a page before any
  item work; a paged request that still comes is answered with an error that
  says to use the second shape.
- :class:`Reduce`, built from a *fold* and an *apply* function, which serves
  gates of any size: the processor sends a big gate in pages, first to fold
  (each page with the accumulator of the one before), then again to apply
  (each page with the final accumulator). A small gate comes in one call,
  and :class:`Reduce` runs fold, result and apply on it in turn, so the same
  two functions answer both.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from handlers.errors import Fail
from handlers.model import UNSET, Item, Reduced, ReducePage, Result

FoldFunction: TypeAlias = Callable[[Any, list[Item]], Any]
ApplyFunction: TypeAlias = Callable[[Any, list[Item]], Mapping[str, Result] | Reduced]
ResultFunction: TypeAlias = Callable[[Any], Any]
ReduceFunction: TypeAlias = Callable[[ReducePage], Reduced | Mapping[str, Any] |
                                     Awaitable[Reduced | Mapping[str, Any]]]


@dataclass(frozen=True)
class Reduce:
    """A reduce of any size from plain functions (each may be sync or async).

    - ``fold(accumulator, items) -> accumulator``: folds one page into the
      accumulator (``initial`` before the first page). The accumulator must be
      JSON-compatible: the processor stores it between pages.
    - ``apply(accumulator, items) -> {item_id: Result}`` (or a :class:`Reduced`):
      the answers for one page, given the final accumulator; items not named
      are completed.
    - ``result(accumulator) -> value``: the partition result, from the final
      accumulator (default: the accumulator itself).

    Sync functions run on a worker thread, async ones on the event loop.
    Failed items (``item.failed``) reach ``fold`` and ``apply`` too, so a
    reduce can report them; answers for them are refused by the processor.

    Raises:
        TypeError: (on construction) ``fold`` or ``apply`` is not callable.
    """

    fold: FoldFunction
    apply: ApplyFunction
    result: ResultFunction | None = None
    initial: Any = None

    def __post_init__(self) -> None:
        for name in ("fold", "apply"):
            if not callable(getattr(self, name)):
                raise TypeError(f"Reduce({name}=...) must be a function, got "
                                f"{getattr(self, name)!r}")
        if self.result is not None and not callable(self.result):
            raise TypeError(f"Reduce(result=...) must be a function, got {self.result!r}")

    async def __call__(self, page: ReducePage) -> Reduced:
        """Answer one reduce request, whatever its pass.

        Raises whatever the user's functions raise.
        """
        items = list(page.items)
        if page.pass_ == "apply":
            return _answers(await call_user(self.apply, page.accumulator, items))
        start = self.initial if page.pass_ == "all" or page.page == 0 else page.accumulator
        accumulator = await call_user(self.fold, start, items)
        if page.pass_ == "fold":
            if not page.last:
                return Reduced(accumulator=accumulator)
            return Reduced(accumulator=accumulator, result=await self._result(accumulator))
        answered = _answers(await call_user(self.apply, accumulator, items))
        result = (await self._result(accumulator) if answered.result is UNSET
                  else answered.result)
        return Reduced(items=answered.items, default=answered.default, result=result)

    async def _result(self, accumulator: Any) -> Any:
        if self.result is None:
            return accumulator
        return await call_user(self.result, accumulator)


def whole_gate_only(func: ReduceFunction) -> Callable[[ReducePage], Awaitable[Any]]:
    """Wrap a plain reduce function: it answers ``"all"`` requests, and a paged
    request gets a non-retryable error naming the fix."""

    async def call(page: ReducePage) -> Any:
        if page.pass_ != "all":
            raise Fail(
                "this gate holds more items than one reduce page, and "
                "the handler's reduce function takes the whole gate at once; serve it with "
                "handlers.Reduce(fold=..., apply=...) or raise the processor's "
                "--reduce-page-items")
        return await call_user(func, page)

    return call


def _answers(value: Any) -> Reduced:
    if isinstance(value, Reduced):
        return value
    if isinstance(value, Mapping):
        return Reduced(items=value)
    raise TypeError(f"Reduce(apply=...) must return {{item_id: Result}} or a Reduced, got "
                    f"{type(value).__name__}")


async def call_user(func: Callable[..., Any], *args: Any) -> Any:
    """Run a user function: async ones on the loop, sync ones on a worker thread
    (a reduce may block on I/O; it runs once per page, so the hop costs nothing)."""
    if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
            getattr(func, "__call__", None)):  # noqa: B004
        return await func(*args)
    value = await asyncio.to_thread(func, *args)
    return await value if inspect.isawaitable(value) else value
