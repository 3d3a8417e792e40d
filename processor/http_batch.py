"""The batch handler protocol: many items per HTTP request.

With ``--handler-batch-size N`` the processor gathers the items dispatched in
the same moment (up to N) and POSTs them as one JSON array to the handler's
batch URL (``<handler-url>/batch`` by default)::

    [{"partition_id": "p", "item_id": "i", "gate": 0, "attempt": 1,
      "idempotency_key": "...", "data_b64": "..."}, ...]

The answer is a JSON array of the same length, in the same order; each entry
is what the per-item protocol's body would be (``{"gate", "done", "data"}`` or
``{"error": {...}}``). A failure of the whole request (connection, timeout,
non-2xx, a body that is not such an array) is an error of every item in it,
classified as in the per-item protocol. The engine still sees one call per
item, so retries, fencing and gate order do not change.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from dataclasses import dataclass

import httpx

from processor.http_processor import (
    Failure,
    HttpProcessor,
    HttpProcessorConfig,
    MalformedResponseError,
    classify_error,
    parse_answer,
    parse_error_body,
)
from processor.transports import TransportError
from watcher.errors import ConfigError
from watcher.protocol import NonRetryableError, ProcessorError, Result, WorkItem

DEFAULT_BATCH_PATH = "/batch"


def default_batch_url(handler_url: str) -> str:
    """``<handler-url>/batch``, without doubling the slash."""
    return handler_url.rstrip("/") + DEFAULT_BATCH_PATH


@dataclass
class _Pending:
    item: WorkItem
    future: asyncio.Future[Result]


class BatchingHttpProcessor(HttpProcessor):
    """Processes items through the batch protocol, ``batch_size`` at a time at most.

    Items handed over in the same event-loop turn go out together; a full
    batch goes out at once. Raises :class:`ConfigError` on a bad size or URL.
    """

    def __init__(self, config: HttpProcessorConfig, *, batch_size: int,
                 batch_url: str | None = None) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"handler batch size must be a whole number >= 1, got "
                              f"{batch_size!r}")
        super().__init__(config)
        url = batch_url or default_batch_url(config.handler_url)
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"handler batch URL must start with http:// or https://, "
                              f"got {url!r}")
        self.batch_size = batch_size
        self._batch_url = str(httpx.URL(url))
        self._waiting: list[_Pending] = []
        self._flush_scheduled = False
        self._sending: set[asyncio.Task[None]] = set()

    async def process(self, item: WorkItem) -> Result:
        """Queue ``item`` for the next batch and wait for its own answer.

        Raises:
            RetryableError, NonRetryableError: as in the per-item protocol.
        """
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Pending(item, future))
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
            task = asyncio.create_task(self._send_batch(batch))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send_batch(self, batch: list[_Pending]) -> None:
        live = [p for p in batch if not p.future.done()]  # cancelled callers drop out
        if not live:
            return
        try:
            answers = await self._post(live)
        except ProcessorError as error:
            for pending in live:
                _settle(pending, error=self._for_item(pending.item, error))
            return
        for pending, answer in zip(live, answers, strict=True):
            _settle(pending, result=answer if isinstance(answer, Result) else None,
                    error=None if isinstance(answer, Result) else answer)

    async def _post(self, batch: list[_Pending]) -> list[Result | ProcessorError]:
        first = batch[0].item
        body = json.dumps([
            {"partition_id": p.item.partition_id, "item_id": p.item.id, "gate": p.item.gate,
             "attempt": p.item.attempt, "idempotency_key": p.item.idempotency_key,
             "data_b64": base64.b64encode(p.item.data).decode("ascii")}
            for p in batch
        ], separators=(",", ":")).encode()
        try:
            reply = await self._sender.post(
                self._batch_url, body, {"Content-Type": "application/json"})
        except TimeoutError:
            raise self._failed(first, Failure(True, (
                f"no complete answer from the batch URL within {self._request_timeout} s "
                f"(request_timeout, batch of {len(batch)})"))) from None
        except TransportError as error:
            raise self._failed(first, Failure(True, (
                f"the batch request failed: {error.reason}"))) from None
        status, raw = reply.status, reply.body
        if raw is None:
            raise self._failed(first, Failure(True, (
                f"malformed batch answer (HTTP {status}): larger than max_response_bytes "
                f"({self._max_bytes} bytes)")))
        if not 200 <= status < 300:
            raise self._failed(first, classify_error(
                status, parse_error_body(raw, self._scrub),
                retry_after=reply.retry_after, now=time.time()))
        try:
            document = json.loads(raw)
        except ValueError as error:
            raise self._failed(first, Failure(True, (
                f"malformed batch answer: not valid JSON ({error})"))) from None
        if not isinstance(document, list) or len(document) != len(batch):
            shape = (f"an array of {len(document)}" if isinstance(document, list)
                     else f"a JSON {type(document).__name__}")
            raise self._failed(first, Failure(True, (
                f"malformed batch answer: expected an array of {len(batch)} results in "
                f"request order, got {shape}")))
        return [self._answer(p.item, entry, status) for p, entry in zip(batch, document,
                                                                          strict=True)]

    def _answer(self, item: WorkItem, entry: object, status: int) -> Result | ProcessorError:
        try:
            outcome = parse_answer(entry, self._scrub)
        except MalformedResponseError as malformed:
            return self._failed(item, Failure(True, (
                f"malformed batch answer entry: {malformed}; expected an object such as "
                '{"gate": 2, "done": false}')))
        if isinstance(outcome, Result):
            return outcome
        return self._failed(item, classify_error(status, outcome, now=time.time()))

    def _for_item(self, item: WorkItem, error: ProcessorError) -> ProcessorError:
        """The whole-batch error, re-addressed to ``item``."""
        failure = Failure(not isinstance(error, NonRetryableError), _reason(error),
                          getattr(error, "retry_after", None))
        return self._failed(item, failure)

    async def aclose(self) -> None:
        """Fail what is still queued, then close the connections."""
        for pending in self._waiting:
            if not pending.future.done():
                pending.future.cancel()
        self._waiting.clear()
        await super().aclose()


def _reason(error: ProcessorError) -> str:
    # Drop the first item's "partition ... item ...: " prefix; _failed adds the right one.
    head, sep, tail = error.message.partition("): ")
    return tail if sep and head.startswith("partition ") else error.message


def _settle(pending: _Pending, *, result: Result | None = None,
            error: ProcessorError | None = None) -> None:
    if pending.future.done():
        return
    if error is not None:
        pending.future.set_exception(error)
    else:
        assert result is not None
        pending.future.set_result(result)


__all__ = ["BatchingHttpProcessor", "default_batch_url"]
