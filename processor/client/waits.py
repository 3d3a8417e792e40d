"""The client's side of waits: complete a waiting item, or move its deadline, with the
completion token its handler was given (:mod:`watcher.waits`).

:class:`WaitsClient` is a part of :class:`processor.AsyncClient`, :class:`SyncWaits` of
:class:`processor.Client`. The token is the whole capability: whoever holds it may
complete that one wait, once. It is never logged.

Every completion goes through :meth:`WaitsClient._completed`: with tracing on, it is a
span linked to the span of the call that parked the item
(:func:`processor.observe.tracing.record_completion`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime
from typing import Any, TypeVar

from processor.observe.tracing import completion_spans, current_traceparent, record_completion
from watcher.errors import CompletionRefusedError, WaitNotFoundError
from watcher.protocol import NonRetryableError, Result, RetryableError
from watcher.records import NewItem
from watcher.reports import WaitSummary
from watcher.rules.completions import Answer
from watcher.rules.spawn import SpawnLimits
from watcher.store import Store
from watcher.store.waits import CompletedWait
from watcher.waits import Wait, timeout_problem

T = TypeVar("T")
log = logging.getLogger(__name__)


def completion_answer(*, done: bool = True, gate: int | None = None, data: Any = None,
                      error: str | None = None, no_retry: bool = False,
                      wait: float | None = None, spawn: Sequence[NewItem] = ()) -> Answer:
    """The answer :meth:`WaitsClient.complete` sends, from its arguments: an error when
    ``error`` is set; otherwise a result (``data`` bytes as they are, any other value
    but ``None`` as its compact JSON), which parks the item again when ``wait``
    (seconds) is given (``done`` is then ignored).

    Raises:
        CompletionRefusedError: ``data`` cannot be encoded as JSON, or ``wait`` is not
            a usable timeout.
    """
    if error is not None:
        return NonRetryableError(str(error)) if no_retry else RetryableError(str(error))
    encoded: bytes | None
    if data is None or isinstance(data, bytes):
        encoded = data
    else:
        try:
            encoded = json.dumps(data, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError) as problem:
            raise CompletionRefusedError("data", f"'data' cannot be encoded as JSON "
                                                 f"({problem}); pass bytes or JSON values"
                                         ) from None
    if wait is not None:
        wrong = timeout_problem(wait, "'wait'")
        if wrong is not None:
            raise CompletionRefusedError("wait", wrong)
        return Result(gate=gate, data=encoded, spawn=tuple(spawn), wait=Wait(float(wait)))
    return Result(gate=gate, done=done, data=encoded, spawn=tuple(spawn))


class WaitsClient:
    """Complete and heartbeat waits (a part of :class:`processor.AsyncClient`)."""

    store: Store
    max_item_bytes: int
    tracer_provider: Any = None  # the completion spans' (None: the global one, if set)

    async def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError  # AsyncClient's

    async def _completed(self, apply: Callable[[str | None],
                                               Coroutine[Any, Any, CompletedWait]]
                         ) -> CompletedWait:
        """``apply(traceparent)``, a completion in the store (``traceparent``: the
        caller's current span, stored with a wait the answer begins again), as one
        span when tracing is on. A token no wait has makes no span.

        Raises:
            What ``apply`` raises; a database failure as :meth:`_call` says.
        """
        spans = completion_spans(self.tracer_provider)
        if spans is None:
            return await self._call(apply(current_traceparent()))
        started = time.time_ns()
        try:
            done = await self._call(apply(current_traceparent()))
        except WaitNotFoundError:
            raise
        except Exception as error:
            record_completion(spans, started, error=error)
            raise
        record_completion(spans, started, done)
        return done

    async def complete_answer(self, token: str, answer: Answer, *,
                              max_data_bytes: int | None = None) -> CompletedWait:
        """Apply ``answer`` (as a handler would answer) to the wait ``token`` names,
        exactly once: what :meth:`complete` and the API's completion route do.
        ``max_data_bytes`` defaults to the client's ``max_item_bytes``.

        Raises:
            WaitNotFoundError: no wait has this token.
            AlreadyCompletedError: the wait is over; nothing was written.
            CompletionRefusedError: the answer cannot be applied; nothing was written
                and the token stays usable.
            SpawnConflictError: the answer spawns an id the partition holds already.
        """
        limit = self.max_item_bytes if max_data_bytes is None else max_data_bytes
        done = await self._completed(lambda traceparent: self.store.wait_complete(
            token, answer, max_data_bytes=limit,
            spawn_limits=SpawnLimits(max_item_bytes=limit), traceparent=traceparent))
        log.info("action=wait_completed partition=%r item=%r status=%s gate=%d",
                 done.partition_id, done.item_id, done.status, done.gate)
        return done

    async def complete(self, token: str, *, done: bool = True, gate: int | None = None,
                       data: Any = None, error: str | None = None, no_retry: bool = False,
                       wait: float | None = None,
                       spawn: Sequence[NewItem] = ()) -> CompletedWait:
        """Complete the wait ``token`` names, exactly once, as a handler's answer would:
        ``done`` (the default) completes the item, ``done=False`` runs it again at its
        gate, ``gate`` moves it, ``data`` replaces its bytes, ``error`` records a failed
        attempt (``no_retry``: it fails at once), ``wait`` parks it again for that many
        seconds: the new token is the returned value's ``completion_token``.

        Raises:
            WaitNotFoundError: no wait has this token.
            AlreadyCompletedError: the wait is over (completed, timed out, cancelled or
                retried); nothing was written.
            CompletionRefusedError: the answer cannot be applied (its ``field`` says
                which part); nothing was written and the token stays usable.
        """
        answer = completion_answer(done=done, gate=gate, data=data, error=error,
                                   no_retry=no_retry, wait=wait, spawn=spawn)
        return await self.complete_answer(token, answer)

    async def heartbeat(self, token: str, timeout: float) -> datetime:  # noqa: ASYNC109
        """Move the deadline of the wait ``token`` names to ``timeout`` seconds from now
        (by the database clock); returns the new deadline (naive UTC).

        Raises:
            WaitNotFoundError: no wait has this token.
            AlreadyCompletedError: the wait is over; nothing was written.
            CompletionRefusedError: ``timeout`` is not above 0 and at most 30 days.
        """
        return await self._call(self.store.wait_heartbeat(token, timeout))

    async def complete_item(self, partition_id: str, item_id: str, *, done: bool = True,
                            data: Any = None, error: str | None = None,
                            no_retry: bool = False) -> CompletedWait:
        """Complete the wait of the waiting item ``item_id`` without its token (an
        operator's completion, as the console's forms send): the same exactly-once
        write as :meth:`complete`, so a token's completion and this one never both
        apply.

        Raises:
            WaitNotFoundError: the partition has no such item.
            AlreadyCompletedError: the item is not waiting (its wait is over); nothing
                was written.
            CompletionRefusedError: the answer cannot be applied; nothing was written.
        """
        answer = completion_answer(done=done, data=data, error=error, no_retry=no_retry)
        limit = self.max_item_bytes
        done_ = await self._completed(lambda traceparent: self.store.wait_complete_item(
            partition_id, item_id, answer, max_data_bytes=limit,
            spawn_limits=SpawnLimits(max_item_bytes=limit), traceparent=traceparent))
        log.info("action=wait_completed partition=%r item=%r status=%s gate=%d by=operator",
                 done_.partition_id, done_.item_id, done_.status, done_.gate)
        return done_

    async def operator_token(self, partition_id: str, item_id: str) -> str:
        """Mint an operator's completion token for the wait of the waiting item
        ``item_id`` (what the console's "Show completion URL" shows): it completes
        that wait as the handler's token does, whichever comes first, once. Minting
        again replaces it (the previous one stops working). Never log it.

        Raises:
            WaitNotFoundError: the partition has no such item.
            AlreadyCompletedError: the item is not waiting; nothing was written.
        """
        token = await self._call(self.store.wait_operator_token(partition_id, item_id))
        log.info("action=operator_token_minted partition=%r item=%r", partition_id, item_id)
        return token

    async def waits_summary(self, partition_ids: Sequence[str]) -> dict[str, WaitSummary]:
        """The parked items of each of ``partition_ids`` that has some: counts per gate,
        the longest wait so far in seconds and the earliest deadline (never a token)."""
        return await self._call(self.store.waits_summary(list(partition_ids)))


class SyncWaits:
    """:class:`WaitsClient`'s methods for :class:`processor.Client`."""

    @property
    def _waits(self) -> WaitsClient:
        return self._async  # type: ignore[attr-defined]  # Client's

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError  # Client's

    def complete(self, token: str, *, done: bool = True, gate: int | None = None,
                 data: Any = None, error: str | None = None, no_retry: bool = False,
                 wait: float | None = None, spawn: Sequence[NewItem] = ()) -> CompletedWait:
        """See :meth:`WaitsClient.complete`."""
        return self._run(self._waits.complete(token, done=done, gate=gate, data=data,
                                             error=error, no_retry=no_retry, wait=wait,
                                             spawn=spawn))

    def heartbeat(self, token: str, timeout: float) -> datetime:
        """See :meth:`WaitsClient.heartbeat`."""
        return self._run(self._waits.heartbeat(token, timeout))

    def complete_item(self, partition_id: str, item_id: str, *, done: bool = True,
                      data: Any = None, error: str | None = None,
                      no_retry: bool = False) -> CompletedWait:
        """See :meth:`WaitsClient.complete_item`."""
        return self._run(self._waits.complete_item(partition_id, item_id, done=done,
                                                   data=data, error=error,
                                                   no_retry=no_retry))

    def operator_token(self, partition_id: str, item_id: str) -> str:
        """See :meth:`WaitsClient.operator_token`."""
        return self._run(self._waits.operator_token(partition_id, item_id))

    def waits_summary(self, partition_ids: Sequence[str]) -> dict[str, WaitSummary]:
        """See :meth:`WaitsClient.waits_summary`."""
        return self._run(self._waits.waits_summary(partition_ids))
