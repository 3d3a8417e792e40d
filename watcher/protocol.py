"""What a processor receives and returns: the engine's contract with user code.

A *processor* is any object with ``async def process(item: WorkItem) -> Result``
(or a bare coroutine function of that shape). It may raise
:class:`RetryableError` or :class:`NonRetryableError`; any other exception is
treated as retryable. A processor that also has ``async def process_batch(items)``
(:data:`ProcessBatchCall`) gets each read's items in one call instead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from watcher.records import DEFAULT_PIPELINE, NewItem
from watcher.waits import Wait, new_completion_token

__all__ = ["Wait"]  # re-exported: a processor answers Result(wait=Wait(timeout=...))


def step_key(partition_id: str, item_id: str, step: int) -> str:
    """The idempotency key of one logical step of one item (``step``: the item's
    version less its failed attempts, which only moves when the item progresses):
    32 hex digits, safe to send as a header."""
    raw = f"{len(partition_id)}:{partition_id}{item_id}:{step}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True, init=False)
class WorkItem:
    """One item handed to a processor.

    ``attempt`` is 1-based: 1 on the first call for this step, 2 after one error, ...
    ``version`` is the item row version the engine read; a result is written only
    against that version. ``idempotency_key`` is stable for one logical step of
    one item, so a repeated call after a failover carries the same key.

    The engine makes one per call and leaves the key out: it is worked out (a hash)
    when first read, so a processor that never reads it (or a transport that does
    not send it) does not pay for it. Given, it is used as it is.

    ``completion_token`` is this call's: if the answer parks the item
    (``Result(wait=...)``), it completes that wait (``POST /v1/completions/{token}``).
    It too is made when first read (256 random bits); never log it.

    ``call_traceparent`` is the W3C ``traceparent`` of the span of the call that
    answered, when a tracer noted it (:meth:`note_call_span`); a parking answer
    stores it with its wait, so the completion's span links to that call.

    ``pipeline`` and ``pipeline_version`` are its partition's: a processor that routes
    by pipeline (docs/how-to/pipelines.md) calls the handler their gate routes to.
    """

    partition_id: str
    id: str
    gate: int
    attempt: int
    data: bytes
    version: int
    pipeline: str
    pipeline_version: str | None
    _key: str | None = field(default=None, init=False, repr=False, compare=False)
    _token: str | None = field(default=None, init=False, repr=False, compare=False)
    _span: str | None = field(default=None, init=False, repr=False, compare=False)

    def __init__(self, partition_id: str, id: str, gate: int, attempt: int,
                 data: bytes, version: int, idempotency_key: str | None = None,
                 completion_token: str | None = None, *,
                 pipeline: str = DEFAULT_PIPELINE,
                 pipeline_version: str | None = None) -> None:
        setter = object.__setattr__
        setter(self, "partition_id", partition_id)
        setter(self, "id", id)
        setter(self, "gate", gate)
        setter(self, "attempt", attempt)
        setter(self, "data", data)
        setter(self, "version", version)
        setter(self, "pipeline", pipeline)
        setter(self, "pipeline_version", pipeline_version)
        setter(self, "_key", idempotency_key)
        setter(self, "_token", completion_token)
        setter(self, "_span", None)

    @property
    def idempotency_key(self) -> str:
        """Stable for one logical step of this item (see :func:`step_key`)."""
        key = self._key
        if key is None:
            key = step_key(self.partition_id, self.id, self.version - (self.attempt - 1))
            object.__setattr__(self, "_key", key)
        return key

    @property
    def completion_token(self) -> str:
        """The token that completes the wait this call's answer may begin."""
        token = self._token
        if token is None:
            token = new_completion_token()
            object.__setattr__(self, "_token", token)
        return token

    @property
    def token_given(self) -> str | None:
        """The token this call handed out (:attr:`completion_token` once read), else
        ``None``: a call given up before its answer leaves such a token with no wait."""
        return self._token

    @property
    def call_traceparent(self) -> str | None:
        """The ``traceparent`` of this call's span, once a tracer noted it, else ``None``."""
        return self._span

    def note_call_span(self, traceparent: str | None) -> None:
        """Remember the ``traceparent`` of this call's span (the tracer's, as the call
        answers): a parking answer's wait stores it."""
        object.__setattr__(self, "_span", traceparent)


@dataclass(frozen=True, slots=True)
class Result:
    """A processor's answer for one item.

    - ``done``: the item is complete.
    - ``gate``: the item's next gate; ``None`` keeps the current gate.
    - ``data``: the item's new bytes; ``None`` keeps the stored bytes.
    - ``spawn``: new items of the partition, inserted in the same transaction as
      this result and only if it is written; each one's gate defaults to the
      gate at which this item was called (``NewItem.gate`` of ``None``). At most
      ``max_spawn`` per answer: a larger fan-out pages (spawn a slice, answer
      ``Result(data=cursor)`` to be called again).
    - ``snooze``: seconds to wait before calling the item again at the same gate
      (polling an outside system); a success, so no attempt is counted. It may
      come with ``data`` and ``spawn``, not with ``done`` or another gate.
    - ``wait``: park the item at its gate until someone outside completes it with
      the call's :attr:`WorkItem.completion_token`, or ``wait.timeout`` seconds pass
      (:mod:`watcher.waits`). It may come with ``data`` and ``spawn``, not with
      ``done``, ``snooze`` or another gate.

    ``Result()`` (not done, same gate) asks for the item to run again: a loop.
    """

    gate: int | None = None
    done: bool = False
    data: bytes | None = None
    spawn: Sequence[NewItem] = ()
    snooze: float | None = None
    wait: Wait | None = None


class ProcessorError(Exception):
    """Base of the errors a processor raises to report a failed attempt."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class RetryableError(ProcessorError):
    """The attempt failed but may succeed later.

    ``retry_after`` (seconds), when set, is the minimum delay before the next attempt.
    """

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ThrottledError(RetryableError):
    """The handler asked for fewer calls: an HTTP 429, or a 503 with ``Retry-After``.

    Not the item's failure: it runs again after ``retry_after`` seconds with no
    attempt used, and every processor holds its calls to the handler until then.
    """

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message, retry_after=retry_after)


class HandlerUnavailableError(RetryableError):
    """The call got no answer from the handler's service: connection refused or reset, a
    name that does not resolve, a connect timeout, or a proxy's 502, 503 or 504 in place
    of the handler's answer.

    An outage is the fleet's problem, not the item's: the processor holds its calls to
    the handler and probes it until it answers again, and the item runs again then with
    no attempt used (up to ``max_unpaid_retries`` such retries per item: see
    :mod:`watcher.dispatch.unpaid`).
    """


class NonRetryableError(ProcessorError):
    """The attempt failed and retrying cannot help: the item fails at once."""


@runtime_checkable
class Processor(Protocol):
    """Anything that can process one item."""

    async def process(self, item: WorkItem) -> Result: ...


ProcessCall = Callable[[WorkItem], Awaitable[Result]]
"""A processor as a bare coroutine function: what the engine calls for each item."""

ProcessBatchCall = Callable[[Sequence[WorkItem]], Awaitable[Sequence["Result | Exception"]]]
"""A processor's optional ``process_batch(items)``: one call for the items of one read
(of one partition, at one gate), answering a :class:`Result` or an exception per item,
in the same order. An exception raised by the call itself is every item's answer."""


# -- reduce gates -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReduceItem:
    """One item of a reduce request.

    ``status`` is ``"available"`` for the items at the reduce gate, which the
    answer moves on, and ``"failed"`` for items that failed at an earlier gate
    of a partition that carries on without them (shown, never changed).
    """

    id: str
    status: str
    gate: int
    data: bytes
    last_error: str | None = None


@dataclass(frozen=True, slots=True)
class ReduceCall:
    """One reduce request: a whole gate (``pass_ == "all"``) or one page of a pass.

    - ``pass_``: ``"all"`` (one call answers everything), ``"fold"`` (answer
      the next accumulator) or ``"apply"`` (answer per item, given the final
      accumulator).
    - ``page``: 0-based position of this page in its pass; ``last``: whether
      it is the pass's last page.
    - ``accumulator``: JSON bytes from the previous fold page (``None`` on the
      first), or the final accumulator during the apply pass.
    - ``idempotency_key``: stable for this partition, gate, pass and page.
    - ``pipeline``, ``pipeline_version``: its partition's (where the call is routed).
    """

    partition_id: str
    gate: int
    attempt: int
    pass_: str
    page: int
    last: bool
    items: tuple[ReduceItem, ...]
    accumulator: bytes | None
    idempotency_key: str
    pipeline: str = DEFAULT_PIPELINE
    pipeline_version: str | None = None


@dataclass(frozen=True, slots=True)
class ReduceResult:
    """A reducer's answer.

    - ``items``: per-item results by item id, for available items of the request.
    - ``default``: the result of the available items not named; ``None``
      completes them (``Result(done=True)``).
    - ``result``: the partition result to store (bytes; ``None`` keeps the stored one).
    - ``accumulator``: the next accumulator (JSON bytes), for a fold page.
    - ``spawn``: new items at gates after the reduce gate (a gate of ``None``
      is the next gate, reduce gate + 1), inserted with the answer; a fold page
      may not spawn. Item results' own ``spawn`` is not allowed in a reduce.

    Every item result must complete the item or move it to a later gate: a
    reduce never leaves an item at its gate.
    """

    items: Mapping[str, Result] = field(default_factory=dict)
    default: Result | None = None
    result: bytes | None = None
    accumulator: bytes | None = None
    spawn: Sequence[NewItem] = ()


ReduceCallable = Callable[[ReduceCall], Awaitable[ReduceResult]]


@dataclass(frozen=True, slots=True)
class ReduceShape:
    """What a reducer takes, as it says before any call.

    - ``pages``: whether it serves a gate in pages (fold, then apply); a
      reducer that takes only a whole gate in one call cannot reduce a gate of
      more than ``reduce_page_items`` items.
    - ``max_request_bytes``: the largest request it takes (``None``: not said).
    """

    pages: bool
    max_request_bytes: int | None = None


# Asks a reducer what it takes: ``None`` when it does not say. Never raises.
ReduceShapeCall = Callable[[], Awaitable[ReduceShape | None]]
