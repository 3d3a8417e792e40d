"""HTTP dispatch: the processor that POSTs each item to the user's handler.

:class:`HttpProcessor` implements :class:`watcher.protocol.Processor` over HTTP,
so handlers can be written in any language. The contract (request headers,
answer fields, how errors are classified) is :mod:`processor.wire`; the
settings are :mod:`processor.http_config`; the HTTP client is a
:mod:`processor.transports` sender. This module only connects them:
:class:`HandlerEndpoint` is the handler as the processors reach it, shared by
this per-item processor and the batching one (:mod:`processor.http_batch`).

Every failed call is a :class:`~processor.wire.Failure` value until
:meth:`HandlerEndpoint.failed` turns it into :class:`RetryableError` or
:class:`NonRetryableError` with a message naming the partition, item, gate
and attempt. No message, ``repr`` or log line of this module contains a
configured header value, the password of a URL or the values of its query
string.

The configuration and contract names once defined here are still importable
from this module.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from types import TracebackType

import httpx

from processor.health import HandlerHealthCheck
from processor.http_config import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_TRANSPORT,
    HEALTH_CHECK_TIMEOUT,
    RESERVED_HEADERS,
    TRANSPORTS,
    HttpProcessorConfig,
    check_header,
    parse_header,
    split_userinfo,
    ssl_verify,
)
from processor.http_reduce import HttpReducer
from processor.redact import Scrubber, header_secrets, redact_url, url_secrets
from processor.transports import USER_AGENT, SenderSettings, TransportError, open_sender
from processor.wire import (
    ERROR_EXCERPT_CHARS,
    EXCERPT_SCAN_BYTES,
    MAX_ERROR_MESSAGE_CHARS,
    MAX_RETRY_AFTER,
    Failure,
    HandlerError,
    MalformedResponseError,
    Mask,
    Reply,
    classify_error,
    describe_item,
    header_safe,
    item_error,
    item_headers,
    parse_answer,
    parse_error_body,
    parse_retry_after,
    parse_success_body,
    read_item_reply,
    unexpected_failure,
)
from watcher.protocol import (
    ProcessorError,
    ReduceCall,
    ReduceResult,
    ReduceShape,
    Result,
    WorkItem,
)

log = logging.getLogger(__name__)


class HandlerEndpoint:
    """The user's handler as the processors reach it: URLs, sender, secrets, words.

    Built once from an :class:`HttpProcessorConfig`; holds the one pooled
    sender (:mod:`processor.transports`) that item calls, batch calls and the
    health check all go through. Safe to use from many tasks at once.

    - ``url`` / ``shown_url``: the handler URL to send to (userinfo moved into
      a Basic ``Authorization`` header) and its redacted form for messages.
    - ``mask``: hides every configured secret in a text: header values, and
      the passwords and query values of the handler URL, the health URL and
      ``other_urls`` (such as a batch URL), with the Basic credentials they imply.

    Raises:
        ConfigError: (on construction) the CA bundle cannot be loaded.
    """

    def __init__(self, config: HttpProcessorConfig, *, other_urls: Sequence[str] = ()) -> None:
        self.config = config
        url, basic_auth = split_userinfo(config.handler_url)
        self.url = str(httpx.URL(url))  # normalised and percent-encoded once
        self.shown_url = redact_url(config.handler_url)
        headers = {"User-Agent": USER_AGENT, **config.headers}
        if basic_auth:
            headers["Authorization"] = basic_auth
        secrets: list[str] = []
        for value in headers.values():
            secrets.extend(header_secrets(value))
        health_url, health_auth = (None, None) if config.health_url is None else (
            split_userinfo(config.health_url))
        for secret_url in (config.handler_url, config.health_url, config.reduce_url,
                           *other_urls):
            if secret_url is not None:
                secrets.extend(url_secrets(secret_url))
                implied = split_userinfo(secret_url)[1]
                if implied:
                    secrets.extend(header_secrets(implied))
        self.mask: Mask = Scrubber(secrets)
        self.sender = open_sender(config.transport, SenderSettings(
            headers=headers, request_timeout=config.request_timeout,
            connect_timeout=min(config.connect_timeout, config.request_timeout),
            max_response_bytes=config.max_response_bytes,
            max_connections=config.max_connections, verify=ssl_verify(config.verify),
            shown_url=self.shown_url))
        self._health: HandlerHealthCheck | None = None
        if health_url is not None:
            self._health = HandlerHealthCheck(
                self.sender, str(httpx.URL(health_url)),
                shown_url=redact_url(config.health_url or ""),
                headers={"Authorization": health_auth} if health_auth else {},
                timeout=min(HEALTH_CHECK_TIMEOUT, config.request_timeout), mask=self.mask)

    async def post(self, url: str, body: bytes, headers: Mapping[str, str], *,
                   shown_url: str) -> Reply | Failure:
        """POST to ``url`` (shown as ``shown_url``): the reply, or why none came.

        Never raises but for a bug (or ``CancelledError``): a timeout or a
        transport failure comes back as a retryable :class:`Failure`.
        """
        try:
            return await self.sender.post(url, body, headers, shown_url=shown_url)
        except TimeoutError:
            return Failure(True, f"no complete answer from {shown_url} within "
                                 f"{self.config.request_timeout} s (request_timeout)")
        except TransportError as error:
            return Failure(True, error.reason)

    def failed(self, item: WorkItem, failure: Failure) -> ProcessorError:
        """``failure`` as the engine's error for ``item`` (:func:`~processor.wire.item_error`)."""
        log.debug("action=handler_call_failed partition=%s item=%s gate=%d attempt=%d "
                  "retryable=%s", item.partition_id, item.id, item.gate, item.attempt,
                  failure.retryable)
        return item_error(item, failure, self.mask)

    def unexpected(self, item: WorkItem, error: Exception, doing: str) -> ProcessorError:
        """A bug met while ``doing`` something for ``item``, logged, as a retryable error."""
        log.error("action=handler_call_bug partition=%s item=%s gate=%d error=%s",
                  item.partition_id, item.id, item.gate, type(error).__name__)
        return self.failed(item, unexpected_failure(error, doing))

    async def check_health(self) -> tuple[bool, str]:
        """GET the health URL: ``(True, detail)`` on a 2xx answer. Never raises.

        Without a health URL the handler counts as healthy.
        """
        if self._health is None:
            return True, "no health URL configured"
        return await self._health()

    def start(self) -> None:
        """Build the HTTP client now (see :meth:`HttpProcessor.start`)."""
        self.sender.start()

    async def aclose(self) -> None:
        """Close the pooled connections. Safe to call more than once."""
        await self.sender.aclose()


class HttpProcessor:
    """Processes items by POSTing them to the user's HTTP handler, one request each.

    Holds one pooled keep-alive connection set (through its
    :class:`HandlerEndpoint`); safe to call from many tasks at once. Close it
    with :meth:`aclose` or ``async with``.

    Raises:
        ConfigError: (on construction) the CA bundle cannot be loaded.
    """

    def __init__(self, config: HttpProcessorConfig) -> None:
        self.config = config
        self.endpoint = HandlerEndpoint(config)
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
            reply = await endpoint.post(endpoint.url, item.data, item_headers(item),
                                        shown_url=endpoint.shown_url)
            outcome = reply if isinstance(reply, Failure) else read_item_reply(
                reply, max_bytes=self.config.max_response_bytes, mask=endpoint.mask,
                clock=time.time)
        except Exception as error:  # a bug here must fail the attempt, not the engine
            raise endpoint.unexpected(item, error, "calling the handler") from None
        if isinstance(outcome, Failure):
            raise endpoint.failed(item, outcome)
        return outcome


__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_RESPONSE_BYTES",
    "DEFAULT_REQUEST_TIMEOUT",
    "DEFAULT_TRANSPORT",
    "ERROR_EXCERPT_CHARS",
    "EXCERPT_SCAN_BYTES",
    "HEALTH_CHECK_TIMEOUT",
    "MAX_ERROR_MESSAGE_CHARS",
    "MAX_RETRY_AFTER",
    "RESERVED_HEADERS",
    "TRANSPORTS",
    "Failure",
    "HandlerEndpoint",
    "HandlerError",
    "HttpProcessor",
    "HttpProcessorConfig",
    "MalformedResponseError",
    "check_header",
    "classify_error",
    "describe_item",
    "header_safe",
    "parse_answer",
    "parse_error_body",
    "parse_header",
    "parse_retry_after",
    "parse_success_body",
]
