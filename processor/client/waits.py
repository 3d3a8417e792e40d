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
from processor.wire.completions import completion_document, read_completion
from watcher.errors import CompletionRefusedError, WaitNotFoundError
from watcher.records import NewItem
from watcher.reports import WaitSummary
from watcher.rules.completions import Answer
from watcher.rules.spawn import SpawnLimits
from watcher.store import Store
from watcher.store.waits import CompletedWait

T = TypeVar("T")
log = logging.getLogger(__name__)


def completion_answer(*, done: bool = False, gate: int | None = None, data: Any = None,
                      error: str | None = None, no_retry: bool = False,
                      wait: float | None = None, spawn: Sequence[NewItem] = ()) -> Answer:
    """The answer :meth:`WaitsClient.complete` sends, from its arguments: the same
    completion document the API's route reads, read by the same decoder
    (:func:`processor.wire.completions.read_completion`), so a completion means one
    thing on every path. ``data`` bytes are stored as they are, any other value but
    ``None`` (which keeps the item's bytes) as its compact JSON.

    Raises:
        CompletionRefusedError: ``data`` cannot be encoded as JSON, or a value is not
            one a completion takes (``field`` names it).
    """
    if data is not None and not isinstance(data, bytes | bytearray | memoryview):
        try:
            json.dumps(data, allow_nan=False)
        except (TypeError, ValueError) as problem:
            raise CompletionRefusedError("data", f"'data' cannot be encoded as JSON "
                                                 f"({problem}); pass bytes or JSON values"
                                         ) from None
    document = completion_document(gate=gate, done=done, error=error, no_retry=no_retry,
                                   wait=wait, **({} if data is None else {"data": data}))
    return read_completion(document, spawn=spawn if spawn else None)


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

    async def complete(self, token: str, *, gate: int | None = None, done: bool = False,
                       data: Any = None, error: str | None = None, no_retry: bool = False,
                       wait: float | None = None,
                       spawn: Sequence[NewItem] = ()) -> CompletedWait:
        """Complete the wait ``token`` names, exactly once, with the answer its handler
        would have given (``docs/how-to/park.md``), as ``POST /v1/completions/{token}``
        does: ``gate`` moves the item to that gate, where it runs (its own gate when
        not given); ``done=True`` completes it there instead; neither runs it again at
        its gate. ``data`` replaces its bytes (``None`` keeps them), ``spawn`` adds
        items, ``error`` records a failed attempt (``no_retry``: it fails at once),
        ``wait`` parks it again for that many seconds: the new token is the returned
        value's ``completion_token``.

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

    async def complete_item(self, partition_id: str, item_id: str, *,
                            gate: int | None = None, done: bool = False, data: Any = None,
                            error: str | None = None,
                            no_retry: bool = False) -> CompletedWait:
        """Complete the wait of the waiting item ``item_id`` without its token (an
        operator's completion, as the console's forms send), with the same answer
        :meth:`complete` gives for the same arguments, in the same exactly-once write,
        so a token's completion and this one never both apply.

        Raises:
            WaitNotFoundError: the partition has no such item.
            AlreadyCompletedError: the item is not waiting (its wait is over); nothing
                was written.
            CompletionRefusedError: the answer cannot be applied; nothing was written.
        """
        answer = completion_answer(gate=gate, done=done, data=data, error=error,
                                   no_retry=no_retry)
        return await self.complete_item_answer(partition_id, item_id, answer)

    async def complete_item_answer(self, partition_id: str, item_id: str,
                                   answer: Answer) -> CompletedWait:
        """Apply ``answer`` to the wait of the waiting item ``item_id``, exactly once:
        what :meth:`complete_item` and the console's Complete form do.

        Raises:
            As :meth:`complete_item`.
        """
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

    def complete(self, token: str, *, gate: int | None = None, done: bool = False,
                 data: Any = None, error: str | None = None, no_retry: bool = False,
                 wait: float | None = None, spawn: Sequence[NewItem] = ()) -> CompletedWait:
        """See :meth:`WaitsClient.complete`."""
        return self._run(self._waits.complete(token, done=done, gate=gate, data=data,
                                             error=error, no_retry=no_retry, wait=wait,
                                             spawn=spawn))

    def complete_answer(self, token: str, answer: Answer) -> CompletedWait:
        """See :meth:`WaitsClient.complete_answer`."""
        return self._run(self._waits.complete_answer(token, answer))

    def heartbeat(self, token: str, timeout: float) -> datetime:
        """See :meth:`WaitsClient.heartbeat`."""
        return self._run(self._waits.heartbeat(token, timeout))

    def complete_item(self, partition_id: str, item_id: str, *, gate: int | None = None,
                      done: bool = False, data: Any = None, error: str | None = None,
                      no_retry: bool = False) -> CompletedWait:
        """See :meth:`WaitsClient.complete_item`."""
        return self._run(self._waits.complete_item(partition_id, item_id, gate=gate,
                                                   done=done, data=data, error=error,
                                                   no_retry=no_retry))

    def operator_token(self, partition_id: str, item_id: str) -> str:
        """See :meth:`WaitsClient.operator_token`."""
        return self._run(self._waits.operator_token(partition_id, item_id))

    def waits_summary(self, partition_ids: Sequence[str]) -> dict[str, WaitSummary]:
        """See :meth:`WaitsClient.waits_summary`."""
        return self._run(self._waits.waits_summary(partition_ids))
