"""The user's handler as the processors reach it: one endpoint for every kind of call.

:class:`HandlerEndpoint` holds the handler's URLs, the one pooled sender
(:mod:`processor.http.transports`) and the secrets to mask, and turns a failed
call (a :class:`~processor.wire.values.Failure` value) into the engine's
:class:`~watcher.protocol.RetryableError` or
:class:`~watcher.protocol.NonRetryableError` with the call's context. The
per-item processor (:mod:`processor.http.processor`), the batching one
(:mod:`processor.http.batch`) and the reduce caller (:mod:`processor.http.reduce`)
share it. No message, ``repr`` or log line of this module contains a configured
header value, the password of a URL or the values of its query string.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence

import httpx

from processor.health import HandlerHealthCheck
from processor.http.config import (
    HEALTH_CHECK_TIMEOUT,
    HttpProcessorConfig,
    split_userinfo,
    ssl_verify,
)
from processor.http.outage import OutageTracker, answered_by_handler
from processor.http.transports import (
    CLOSED_REASON,
    USER_AGENT,
    SenderSettings,
    SharedPool,
    TlsError,
    TransportError,
    UndecodableError,
    open_sender,
)
from processor.observe.redact import Scrubber, header_secrets, redact_url, url_secrets
from processor.observe.tracing import CallSpans
from processor.wire.errors import item_error, parse_error_body, unexpected_failure
from processor.wire.values import Failure, Mask, Reply
from watcher.protocol import ProcessorError, WorkItem

log = logging.getLogger(__name__)

# A proxy's answers while the handler behind it is down (without the handler's error object).
PROXY_OUTAGE_STATUSES = frozenset({502, 503, 504})


class HandlerEndpoint:
    """The user's handler as the processors reach it: URLs, sender, secrets, words.

    Built once from an :class:`HttpProcessorConfig`; holds the one pooled
    sender (:mod:`processor.http.transports`) that item calls, batch calls and the
    health check all go through. Safe to use from many tasks at once.

    - ``url`` / ``shown_url``: the handler URL to send to (userinfo moved into
      a Basic ``Authorization`` header) and its redacted form for messages.
    - ``mask``: hides every configured secret in a text: header values, and
      the passwords and query values of the handler URL, the health URL and
      ``other_urls`` (such as a batch URL), with the Basic credentials they imply.
    - ``outage``: the :class:`~processor.http.outage.OutageTracker` every call feeds, timed
      by ``clock`` (monotonic seconds).
    - ``tracer``: the :class:`~processor.observe.tracing.CallSpans` whose current span the
      calls carry as a ``traceparent`` header, or ``None`` (tracing off).

    Raises:
        ConfigError: (on construction) the CA bundle cannot be loaded.
    """

    def __init__(self, config: HttpProcessorConfig, *, other_urls: Sequence[str] = (),
                 clock: Callable[[], float] = time.monotonic,
                 tracer: CallSpans | None = None, pool: SharedPool | None = None) -> None:
        self.config = config
        self.clock = clock
        self.tracer = tracer
        self.outage = OutageTracker()
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
            shown_url=self.shown_url), pool)
        self._health: HandlerHealthCheck | None = None
        if health_url is not None:
            self._health = HandlerHealthCheck(
                self.sender, str(httpx.URL(health_url)),
                shown_url=redact_url(config.health_url or ""),
                headers={"Authorization": health_auth} if health_auth else {},
                timeout=min(HEALTH_CHECK_TIMEOUT, config.request_timeout), mask=self.mask,
                optional=config.health_optional)

    async def post(self, url: str, body: bytes, headers: Mapping[str, str], *,
                   shown_url: str) -> Reply | Failure:
        """POST to ``url`` (shown as ``shown_url``): the reply, or why none came.

        Every call's outcome goes to :attr:`outage` (:mod:`processor.http.outage`), which
        logs one WARNING when the handler stops answering and one when it answers
        again. Never raises but for a bug (or ``CancelledError``): a timeout or a
        transport failure comes back as a retryable :class:`Failure`. A call the
        handler's service did not answer (no connection, a dropped one, a proxy's
        bare 502, 503 or 504) is ``unanswered``: the engine holds the calls to the
        handler and spends no attempt on it (:mod:`watcher.dispatch.unpaid`).
        """
        started = self.clock()
        try:
            reply = await self.sender.post(url, body, headers, shown_url=shown_url)
        except TimeoutError:
            failure = Failure(True, f"no complete answer from {shown_url} within "
                                    f"{self.config.request_timeout} s (request_timeout)")
        except UndecodableError as error:  # an answer came: the item's failure
            failure = Failure(True, error.reason)
        except TransportError as error:  # closed under the call: this processor stops
            failure = Failure(True, error.reason, unanswered=(
                error.reason != CLOSED_REASON and not isinstance(error, TlsError)))
        else:
            if answered_by_handler(reply):
                self._answered()
                return reply
            reason = f"{shown_url} answered HTTP {reply.status} without the handler's error object"
            self._unanswered(shown_url, reason, started)
            if reply.status not in PROXY_OUTAGE_STATUSES or (
                    reply.status == 503 and reply.retry_after):
                return reply  # a bare 500 may be the item's; a Retry-After is a throttle
            excerpt = parse_error_body(reply.body or b"", self.mask).message
            return Failure(True, f"{reason} (the handler's service is down)"
                           + (f": {excerpt}" if excerpt else ""), unanswered=True)
        self._unanswered(shown_url, failure.reason, started)
        return failure

    def _unanswered(self, shown_url: str, reason: str, started: float) -> None:
        """A call got no answer from the handler: log the outage it starts, if any."""
        began = self.outage.unanswered(shown_url, reason, started=started, ended=self.clock())
        if began is not None:
            log.warning("action=handler_outage_started url=%s failed_calls=%d seconds=%.1f "
                        "error=%s", began.url, began.failed_calls, began.seconds,
                        self.mask(began.reason))

    def _answered(self) -> None:
        """The handler answered a call: log the outage it ends, if one was on."""
        if self.outage.failed_calls == 0:
            return  # the hot path: nothing to reset
        ended = self.outage.answered(ended=self.clock())
        if ended is not None:
            log.warning("action=handler_outage_ended url=%s seconds=%.1f failed_calls=%d",
                        ended.url, ended.seconds, ended.failed_calls)

    def failed(self, item: WorkItem, failure: Failure) -> ProcessorError:
        """``failure`` as the engine's error for ``item``
        (:func:`~processor.wire.errors.item_error`)."""
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

    async def probe(self) -> bool:
        """Whether the handler's service answers: its health check when it has one, else
        a ``GET`` of the handler URL answered in the handler's words (any status below
        500, or an error answer with the contract's error object). The engine asks it
        while it holds the calls to the handler (:mod:`watcher.flow.handler_hold`). Never
        raises."""
        started = self.clock()
        if self._health is not None:
            healthy, detail = await self._health()
        else:
            try:
                async with asyncio.timeout(HEALTH_CHECK_TIMEOUT):
                    reply = await self.sender.probe(self.url, {}, shown_url=self.shown_url)
            except TransportError as error:
                healthy, detail = False, error.reason
            except Exception as error:  # a timeout, or a bug: a probe never raises
                healthy, detail = False, f"no answer to a probe of {self.shown_url} ({error!r})"
            else:
                healthy = answered_by_handler(reply)
                detail = f"{self.shown_url} answered a probe with HTTP {reply.status}"
        # The probes count with the calls: while the calls are held, they are the only
        # ones to say how long the handler has been out.
        if healthy:
            self._answered()
        else:
            self._unanswered(self.shown_url, detail, started)
        return healthy

    def start(self) -> None:
        """Build the HTTP client now (see :meth:`HttpProcessor.start`)."""
        self.sender.start()

    async def aclose(self) -> None:
        """Close the pooled connections. Safe to call more than once."""
        await self.sender.aclose()
