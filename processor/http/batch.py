"""The batch handler protocol: many items per HTTP request.

With ``--handler-batch-size N`` the processor gathers the items dispatched in
the same moment (up to N) and POSTs them as one JSON array to the handler's
batch URL (``<handler-url>/batch`` by default)::

    [{"partition_id": "p", "item_id": "i", "gate": 0, "attempt": 1,
      "idempotency_key": "...", "data_b64": "..."}, ...]

The answer is a JSON array of the same length, in the same order; each entry
is what the per-item protocol's body would be (``{"gate", "done", "data"}`` or
``{"error": {...}}``). A failure of the whole request (connection, timeout,
non-2xx, a body that is not such an array) is a :class:`~processor.wire.values.Failure`
of every item in it, classified as in the per-item protocol. The engine still
sees one call per item, so retries, fencing and gate order do not change.

The encoding and decoding are :mod:`processor.wire.contract`'s; the connections,
secrets and error words are the :class:`~processor.http.endpoint.HandlerEndpoint`'s.
Every item handed over is answered: a bug in the send path fails the batch's
attempts, and a send cut short by cancellation cancels them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx

from processor.http.config import (
    HttpProcessorConfig,
    beside_handler,
    check_url,
    split_userinfo,
)
from processor.http.endpoint import HandlerEndpoint
from processor.http.reduce import HttpReducer
from processor.http.transports import SharedPool
from processor.observe.redact import redact_url
from processor.observe.tracing import CallSpans, resolve
from processor.wire.contract import encode_batch, json_headers, read_batch_reply
from processor.wire.errors import unexpected_failure
from processor.wire.values import Failure
from watcher.protocol import ReduceCall, ReduceResult, Result, WorkItem
from watcher.rules.checks import check_whole_number

log = logging.getLogger(__name__)

DEFAULT_BATCH_PATH = "/batch"


def default_batch_url(handler_url: str) -> str:
    """``<handler-url>/batch``, without doubling the slash, the handler URL's query
    string after it (:func:`~processor.http.config.beside_handler`)."""
    return beside_handler(handler_url, DEFAULT_BATCH_PATH)


@dataclass(slots=True)
class _Pending:
    """An item handed to :meth:`BatchingHttpProcessor.process`, and the future its caller awaits."""

    item: WorkItem
    future: asyncio.Future[Result]
    # The span of the item's call when tracing is on: the batch request links to it.
    span_context: Any = None


class BatchingHttpProcessor:
    """Processes items through the batch protocol, ``batch_size`` at a time at most.

    Items handed over in the same event-loop turn go out together; a full
    batch goes out at once. ``call_tracer`` is as for
    :class:`~processor.http.processor.HttpProcessor`: each item's call is a span,
    and each batch request a span of its own, linked to theirs, whose
    ``traceparent`` it carries.

    Raises:
        ConfigError: (on construction) a bad batch size or batch URL, or a CA
            bundle that cannot be loaded, or a tracer asked for without OpenTelemetry.
    """

    def __init__(self, config: HttpProcessorConfig, *, batch_size: int,
                 batch_url: str | None = None,
                 call_tracer: CallSpans | str | None = "auto",
                 pool: SharedPool | None = None) -> None:
        check_whole_number("handler batch size", batch_size)
        url = check_url("handler batch URL", batch_url or default_batch_url(config.handler_url),
                        example="http://handler:8000/batch")
        bare, basic_auth = split_userinfo(url)
        self.config = config
        self.batch_size = batch_size
        self.call_tracer = resolve(call_tracer, client=False)
        self.endpoint = HandlerEndpoint(config, other_urls=[url], tracer=self.call_tracer,
                                        pool=pool)
        self.reducer = HttpReducer(self.endpoint)
        self._batch_url = str(httpx.URL(bare))
        self._shown_batch_url = redact_url(url)
        self._headers = json_headers()
        if basic_auth:  # a user:password@ of the batch URL, as for the handler URL
            self._headers["Authorization"] = basic_auth
        self._waiting: list[_Pending] = []
        self._flush_scheduled = False
        self._sending: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return (f"BatchingHttpProcessor(batch_url={self._shown_batch_url!r}, "
                f"batch_size={self.batch_size!r}, "
                f"headers={sorted(self.config.headers)!r}, "
                f"request_timeout={self.config.request_timeout!r})")

    async def __aenter__(self) -> BatchingHttpProcessor:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    def start(self) -> None:
        """Build the HTTP client now (see :meth:`HttpProcessor.start`)."""
        self.endpoint.start()

    async def probe_handler(self) -> bool:
        """Whether the handler's service answers (:meth:`HandlerEndpoint.probe`): a
        :class:`~watcher.Watcher` asks it while it holds the calls to a handler that is
        down. Never raises."""
        return await self.endpoint.probe()

    async def check_health(self) -> tuple[bool, str]:
        """GET the health URL: ``(True, detail)`` on a 2xx answer. Never raises."""
        return await self.endpoint.check_health()

    async def reduce(self, call: ReduceCall) -> ReduceResult:
        """POST a reduce call to the handler's reduce URL (one request, never batched).

        Raises:
            RetryableError, NonRetryableError: as the per-item protocol.
        """
        return await self.reducer.reduce(call)

    async def process(self, item: WorkItem) -> Result:
        """Queue ``item`` for the next batch and wait for its own answer.

        Raises:
            RetryableError, NonRetryableError: as in the per-item protocol.
        """
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        tracer = self.call_tracer
        self._waiting.append(_Pending(item, future) if tracer is None else
                             _Pending(item, future, tracer.current_span_context()))
        if len(self._waiting) >= self.batch_size:
            self._flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        self._flush_scheduled = False
        while self._waiting:
            batch, self._waiting = (self._waiting[: self.batch_size],
                                    self._waiting[self.batch_size:])
            task = asyncio.create_task(self._send(batch))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[_Pending]) -> None:
        """Send one batch and answer each of its items; never leaves a future pending."""
        live = [p for p in batch if not p.future.done()]  # cancelled callers drop out
        if not live:
            return
        try:
            outcomes = await (self._call([p.item for p in live]) if self.call_tracer is None
                              else self._traced_call(live, self.call_tracer))
            for pending, outcome in zip(live, outcomes, strict=True):
                self._answer(pending, outcome)
        except Exception as error:  # a bug here must fail the attempts, not strand them
            log.error("action=handler_batch_bug items=%d first_partition=%s error=%s",
                      len(live), live[0].item.partition_id, type(error).__name__)
            failure = unexpected_failure(error, "sending a batch to the handler")
            for pending in live:
                self._answer(pending, failure)
        finally:
            # Cancelled (shutdown), or a failure while answering: the callers'
            # futures are cancelled, as a closing processor's queued items are.
            for pending in live:
                if not pending.future.done():
                    pending.future.cancel()

    async def _traced_call(self, live: list[_Pending], tracer: CallSpans
                           ) -> list[Result | Failure]:
        """:meth:`_call` in a span of its own, linked to the items' call spans."""
        with tracer.batch_request([p.span_context for p in live], len(live)) as span:
            headers = dict(self._headers)
            tracer.inject(headers)
            outcomes = await self._call([p.item for p in live], headers)
            tracer.answered(span, sum(isinstance(outcome, Failure) for outcome in outcomes),
                            len(outcomes))
            return outcomes

    async def _call(self, items: list[WorkItem], headers: dict[str, str] | None = None
                    ) -> list[Result | Failure]:
        """POST ``items`` as one batch: one :class:`Result` or :class:`Failure` per item."""
        endpoint = self.endpoint
        reply = await endpoint.post(self._batch_url, encode_batch(items),
                                    headers or self._headers, shown_url=self._shown_batch_url)
        outcomes = reply if isinstance(reply, Failure) else read_batch_reply(
            reply, len(items), max_bytes=self.config.max_response_bytes,
            mask=endpoint.mask, clock=time.time)
        if isinstance(outcomes, Failure):
            return [outcomes.prefixed("the batch request failed")] * len(items)
        return outcomes

    def _answer(self, pending: _Pending, outcome: Result | Failure) -> None:
        if pending.future.done():
            return
        if isinstance(outcome, Failure):
            pending.future.set_exception(self.endpoint.failed(pending.item, outcome))
        else:
            pending.future.set_result(outcome)

    async def aclose(self) -> None:
        """Cancel what is still queued, then close the connections. Safe to call twice.

        Batches already sent are answered by their send tasks: with the
        connections closed, their calls fail as retryable attempt errors.
        """
        for pending in self._waiting:
            if not pending.future.done():
                pending.future.cancel()
        self._waiting.clear()
        await self.endpoint.aclose()


__all__ = ["BatchingHttpProcessor", "default_batch_url"]
