"""HTTP dispatch: the processor that POSTs each item to the user's handler.

:class:`HttpProcessor` implements :class:`watcher.protocol.Processor` over HTTP,
so handlers can be written in any language. The contract (request headers,
answer fields, how errors are classified) is :mod:`processor.wire.contract`; the
settings are :mod:`processor.http.config`; the handler as the processors reach
it is :class:`~processor.http.endpoint.HandlerEndpoint`. This module only connects
them. Every failed call is a :class:`~processor.wire.values.Failure` value until the
endpoint turns it into an error naming the partition, item, gate and attempt.
"""

from __future__ import annotations

import time
from types import TracebackType

from processor.http.config import HttpProcessorConfig
from processor.http.endpoint import HandlerEndpoint
from processor.http.reduce import HttpReducer
from processor.http.transports import SharedPool
from processor.observe.tracing import CallSpans, resolve
from processor.wire.contract import item_headers, read_item_reply
from processor.wire.values import Failure
from watcher.protocol import ReduceCall, ReduceResult, ReduceShape, Result, WorkItem


class HttpProcessor:
    """Processes items by POSTing them to the user's HTTP handler, one request each.

    Holds one pooled keep-alive connection set (through its
    :class:`HandlerEndpoint`); safe to call from many tasks at once. Close it
    with :meth:`aclose` or ``async with``.

    ``call_tracer``: a :class:`~processor.observe.tracing.CallSpans` to trace the calls with
    (each request carries its span as ``traceparent``), ``None`` for none, or
    ``"auto"``: traced when the application set an OpenTelemetry tracer provider. A
    :class:`~watcher.Watcher` traces its calls with the same.

    Raises:
        ConfigError: (on construction) the CA bundle cannot be loaded, or a tracer is
            asked for without OpenTelemetry installed.
    """

    def __init__(self, config: HttpProcessorConfig, *,
                 call_tracer: CallSpans | str | None = "auto",
                 pool: SharedPool | None = None) -> None:
        self.config = config
        self.call_tracer = resolve(call_tracer, client=True)
        self.endpoint = HandlerEndpoint(config, tracer=self.call_tracer, pool=pool)
        self.reducer = HttpReducer(self.endpoint)

    def __repr__(self) -> str:
        return (f"HttpProcessor(handler_url={self.endpoint.shown_url!r}, "
                f"headers={sorted(self.config.headers)!r}, "
                f"request_timeout={self.config.request_timeout!r}, "
                f"max_connections={self.config.max_connections!r})")

    async def __aenter__(self) -> HttpProcessor:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    def start(self) -> None:
        """Build the HTTP client now, so the first items do not wait for it (optional:
        the first call does it otherwise). Call it inside the running event loop."""
        self.endpoint.start()

    async def aclose(self) -> None:
        """Close the pooled connections. Safe to call more than once."""
        await self.endpoint.aclose()

    async def probe_handler(self) -> bool:
        """Whether the handler's service answers (:meth:`HandlerEndpoint.probe`): a
        :class:`~watcher.Watcher` asks it while it holds the calls to a handler that is
        down. Never raises."""
        return await self.endpoint.probe()

    async def check_health(self) -> tuple[bool, str]:
        """GET the health URL: ``(True, detail)`` on a 2xx answer. Never raises.

        Without a health URL the handler counts as healthy.
        """
        return await self.endpoint.check_health()

    async def reduce(self, call: ReduceCall) -> ReduceResult:
        """POST a reduce call to the handler's reduce URL (:class:`HttpReducer`).

        Raises:
            RetryableError, NonRetryableError: as :meth:`process`.
        """
        return await self.reducer.reduce(call)

    async def reduce_shape(self) -> ReduceShape | None:
        """What the handler's reduce takes (:meth:`HttpReducer.shape`). Never raises."""
        return await self.reducer.shape()

    async def process(self, item: WorkItem) -> Result:
        """POST ``item`` to the handler and map the answer to a :class:`Result`.

        Raises:
            RetryableError: the call failed but may succeed later (5xx, 408, 429,
                timeout, connection failure, malformed answer); ``retry_after`` is
                set from ``Retry-After`` on 429 and 503.
            NonRetryableError: the handler refused the item for good (4xx other
                than 408 and 429, a redirect, or ``no_retry``).
        """
        endpoint = self.endpoint
        try:
            headers = item_headers(item)
            if endpoint.tracer is not None:
                endpoint.tracer.inject(headers)
            reply = await endpoint.post(endpoint.url, item.data, headers,
                                        shown_url=endpoint.shown_url)
            outcome = reply if isinstance(reply, Failure) else read_item_reply(
                reply, max_bytes=self.config.max_response_bytes, mask=endpoint.mask,
                clock=time.time)
        except Exception as error:  # a bug here must fail the attempt, not the engine
            raise endpoint.unexpected(item, error, "calling the handler") from None
        if isinstance(outcome, Failure):
            raise endpoint.failed(item, outcome)
        return outcome
