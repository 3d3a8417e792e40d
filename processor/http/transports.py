"""The HTTP hop to the handler: one request in, one :class:`Reply` or :class:`TransportError` out.

Two interchangeable senders implement it:

- :class:`AiohttpSender` (the default) posts through an ``aiohttp`` session,
  which costs less CPU per call than building httpx request and response
  objects; that cost bounds the per-item mode on a small machine (the figures are in
  docs/explanation/performance.md).
- :class:`HttpxSender` posts through an ``httpx.AsyncClient`` transport.

Both use one pooled keep-alive connection set, never follow redirects, give
a request that fails on a reused connection before any answer (the server
closed it while idle) one immediate retry, stop reading an answer as soon as
it exceeds the size limit, enforce the whole request's timeout (raising
``TimeoutError``), and word their failures the same way. aiohttp enforces it
with the session's own ``total`` timer; wrapping each call in
``asyncio.timeout`` as well would cost a second timer per call. Besides
``post``, each has a small ``probe`` (a ``GET`` that reads only the status)
for the handler's health check, so the check needs no client of its own.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import aiohttp
import httpx
import yarl

from processor.wire.values import Reply
from watcher.text import error_text

log = logging.getLogger(__name__)

USER_AGENT = "statefeed-processor"
# Idle pooled connections are dropped before the common server keep-alive
# timeouts close them under us (uvicorn and Node: 5 s), which is what makes a
# reused connection fail.
KEEPALIVE_EXPIRY = 4.0
CLOSED_REASON = "the HTTP processor is closed (shutting down)"


class TransportError(Exception):
    """The request got no answer; ``reason`` says why, naming the (redacted) URL."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ConnectError(TransportError):
    """No connection could be made (refused, unresolvable, or over ``connect_timeout``)."""


class TlsError(ConnectError):
    """The TLS handshake failed (an unverified certificate, a protocol mismatch): a fault
    of configuration that waiting does not mend, so the call is an ordinary failed
    attempt, never an outage of the service."""


def _tls_failure(error: BaseException | None) -> bool:
    """Whether ``error``, or an error it wraps, is a TLS failure."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, ssl.SSLError):
            return True
        error = getattr(error, "os_error", None) or error.__cause__ or error.__context__
        seen += 1
    return False


class UndecodableError(TransportError):
    """An answer came, but its body could not be decoded (a bad compression, say)."""


@dataclass(frozen=True, slots=True)
class SenderSettings:
    """What both senders need; ``shown_url`` is the redacted handler URL for messages."""

    headers: Mapping[str, str]
    request_timeout: float
    connect_timeout: float
    max_response_bytes: int
    max_connections: int
    verify: bool | ssl.SSLContext
    shown_url: str


class Sender(Protocol):
    """Posts a body to a URL and returns the answer; probes a URL for its status."""

    async def post(self, url: str, body: bytes, headers: Mapping[str, str], *,
                   shown_url: str | None = None) -> Reply:
        """POST ``body`` with ``headers`` (on top of the configured ones) to ``url``.

        ``shown_url`` is the redacted ``url`` for messages (default: the
        handler URL of the settings).

        Raises:
            TimeoutError: no complete answer within ``request_timeout``.
            TransportError: no answer (connect failure, dropped connection,
                undecodable body, sender closed).
        """
        ...

    async def probe(self, url: str, headers: Mapping[str, str], *, shown_url: str) -> Reply:
        """GET ``url`` with ``headers`` (on top of the configured ones); return the answer.

        The body is read up to ``max_response_bytes`` (``None`` past it), so the
        connection goes back to the pool. Uses the same connections, TLS
        settings, configured headers and ``request_timeout`` as :meth:`post` (a
        caller wanting less wraps the call in ``asyncio.timeout``).

        Raises:
            TimeoutError: no answer within ``request_timeout``.
            TransportError: no answer (as for :meth:`post`).
        """
        ...

    def start(self) -> None:
        """Build the client objects now (in the running loop) rather than at the first call."""
        ...

    async def aclose(self) -> None:
        """Close the pooled connections."""
        ...


class _Failures:
    """How both senders word a request that got no answer."""

    def __init__(self, settings: SenderSettings) -> None:
        self._settings = settings

    def connect_timeout(self, shown_url: str) -> TransportError:
        return ConnectError(f"could not connect to {shown_url} within "
                            f"{self._settings.connect_timeout} s (connect_timeout)")

    def connect(self, shown_url: str, error: BaseException | None) -> TransportError:
        kind = TlsError if _tls_failure(error) else ConnectError
        return kind(f"could not connect to {shown_url}: {error_text(error)}")

    def decoding(self, error: BaseException) -> TransportError:
        return UndecodableError(
            f"malformed answer: its body could not be decoded ({error_text(error)})")

    def connection(self, shown_url: str, error: BaseException) -> TransportError:
        return TransportError(f"the connection to {shown_url} failed: {error_text(error)}")


class SharedPool:
    """One aiohttp connection pool for the senders of several services (a routing
    processor's): keep-alive connections are kept per host as ever, under one bound
    (``max_connections``) for them all, so ten routes to one server reuse the
    connections one route would. Each sender keeps its own session (its headers and
    timeouts) over it. A sender with a CA bundle of its own keeps a pool of its own."""

    def __init__(self, max_connections: int) -> None:
        self.max_connections = max_connections
        self._connectors: dict[bool, aiohttp.TCPConnector] = {}

    def connector(self, verify: bool | ssl.SSLContext) -> aiohttp.TCPConnector | None:
        """The shared connector for ``verify`` (made in the running loop on first use);
        ``None`` for an SSL context, which is the sender's own."""
        if not isinstance(verify, bool):
            return None
        connector = self._connectors.get(verify)
        if connector is None or connector.closed:
            connector = self._connectors[verify] = aiohttp.TCPConnector(
                limit=self.max_connections, limit_per_host=0,
                keepalive_timeout=KEEPALIVE_EXPIRY, ssl=verify)
        return connector

    async def aclose(self) -> None:
        """Close the pooled connections (once every sender over them is closed)."""
        for connector in self._connectors.values():
            await connector.close()
        self._connectors.clear()


class AiohttpSender:
    """Posts through one ``aiohttp.ClientSession``, created on first use in the running
    loop, over a connection pool of its own or a :class:`SharedPool`'s."""

    def __init__(self, settings: SenderSettings, pool: SharedPool | None = None) -> None:
        self._settings = settings
        self._pool = pool
        self._failures = _Failures(settings)
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self._urls: dict[str, yarl.URL] = {}

    def start(self) -> None:
        """See :meth:`Sender.start`: the session, its connector and its TLS context."""
        if self._session is None and not self._closed:
            self._open()

    def _open(self) -> aiohttp.ClientSession:
        settings = self._settings
        shared = None if self._pool is None else self._pool.connector(settings.verify)
        connector = shared or aiohttp.TCPConnector(
            limit=settings.max_connections, limit_per_host=0,
            keepalive_timeout=KEEPALIVE_EXPIRY, ssl=settings.verify)
        self._session = aiohttp.ClientSession(
            connector=connector, connector_owner=shared is None,
            headers={"User-Agent": USER_AGENT, **settings.headers},
            # sock_connect bounds a new connection only; a pooled one is free.
            timeout=aiohttp.ClientTimeout(total=settings.request_timeout,
                                          sock_connect=settings.connect_timeout),
            cookie_jar=aiohttp.DummyCookieJar(), trust_env=False)
        return self._session

    def _target(self, url: str) -> yarl.URL:
        target = self._urls.get(url)
        if target is None:  # parsed once: every item goes to the same handler URL
            target = self._urls[url] = yarl.URL(url, encoded=True)
        return target

    async def post(self, url: str, body: bytes, headers: Mapping[str, str], *,
                   shown_url: str | None = None) -> Reply:
        """See :meth:`Sender.post`."""
        if self._closed:
            raise TransportError(CLOSED_REASON)
        session = self._session or self._open()
        target = self._target(url)
        try:
            try:
                return await self._exchange(session, target, body, headers)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as error:
                if isinstance(error, aiohttp.ClientConnectorError):
                    raise
                if self._closed:  # closed under the call: the session cannot send again
                    raise TransportError(CLOSED_REASON) from None
                log.debug("action=handler_connection_retry url=%s",
                          shown_url or self._settings.shown_url)
                return await self._exchange(session, target, body, headers)
        except aiohttp.ClientError as error:
            raise self._failure(error, shown_url or self._settings.shown_url) from None

    async def probe(self, url: str, headers: Mapping[str, str], *, shown_url: str) -> Reply:
        """See :meth:`Sender.probe`."""
        if self._closed:
            raise TransportError(CLOSED_REASON)
        session = self._session or self._open()
        try:
            async with session.get(self._target(url), headers=headers,
                                   allow_redirects=False) as response:
                return Reply(response.status, None, await self._read(response))
        except aiohttp.ClientError as error:
            raise self._failure(error, shown_url) from None

    def _failure(self, error: aiohttp.ClientError, shown_url: str) -> TransportError:
        # A connect timeout is also a TimeoutError: worded as the connect failure it
        # is, not as the whole request's timeout.
        if isinstance(error, aiohttp.ConnectionTimeoutError):
            return self._failures.connect_timeout(shown_url)
        if isinstance(error, aiohttp.ClientConnectorError):
            return self._failures.connect(shown_url, error.os_error)
        if isinstance(error, aiohttp.ClientPayloadError):
            return self._failures.decoding(error)
        return self._failures.connection(shown_url, error)

    async def _exchange(self, session: aiohttp.ClientSession, url: yarl.URL, body: bytes,
                        headers: Mapping[str, str]) -> Reply:
        async with session.post(url, data=body, headers=headers,
                                allow_redirects=False) as response:
            return Reply(response.status, response.headers.get("Retry-After"),
                         await self._read(response))

    async def _read(self, response: aiohttp.ClientResponse) -> bytes | None:
        limit = self._settings.max_response_bytes
        declared = response.content_length
        if declared is not None and declared > limit:
            return None
        if declared is not None and "Content-Encoding" not in response.headers:
            # Exactly ``declared`` bytes will come (a compressed body is counted
            # as it inflates, below).
            return await response.read()
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.content.iter_any():
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    async def aclose(self) -> None:
        """See :meth:`Sender.aclose`."""
        self._closed = True
        if self._session is not None:
            await self._session.close()


class HttpxSender:
    """Posts through an ``httpx`` transport (httpcore's pool)."""

    def __init__(self, settings: SenderSettings) -> None:
        self._settings = settings
        self._failures = _Failures(settings)
        self._transport = httpx.AsyncHTTPTransport(
            verify=settings.verify,
            limits=httpx.Limits(max_connections=settings.max_connections,
                                max_keepalive_connections=settings.max_connections,
                                keepalive_expiry=KEEPALIVE_EXPIRY))
        # Only to build requests (headers, URL, body); sending skips the client's
        # cookie, auth and redirect layers, which the contract does not use.
        self._client = httpx.AsyncClient(
            headers={"User-Agent": USER_AGENT, **settings.headers},
            timeout=httpx.Timeout(None, connect=settings.connect_timeout),
            transport=self._transport, follow_redirects=False)

    def start(self) -> None:
        """See :meth:`Sender.start`: httpx builds everything in the constructor."""

    async def post(self, url: str, body: bytes, headers: Mapping[str, str], *,
                   shown_url: str | None = None) -> Reply:
        """See :meth:`Sender.post`."""
        if self._client.is_closed:
            raise TransportError(CLOSED_REASON)
        shown_url = shown_url or self._settings.shown_url
        request = self._client.build_request("POST", url, content=body, headers=headers)
        try:
            async with asyncio.timeout(self._settings.request_timeout):
                try:
                    response = await self._transport.handle_async_request(request)
                except (httpx.RemoteProtocolError, httpx.WriteError):
                    log.debug("action=handler_connection_retry url=%s", shown_url)
                    response = await self._transport.handle_async_request(request)
                try:
                    body_read = await self._read(response)
                finally:
                    await response.aclose()
        except httpx.RequestError as error:
            raise self._failure(error, shown_url) from None
        return Reply(response.status_code, response.headers.get("retry-after"), body_read)

    async def probe(self, url: str, headers: Mapping[str, str], *, shown_url: str) -> Reply:
        """See :meth:`Sender.probe`."""
        if self._client.is_closed:
            raise TransportError(CLOSED_REASON)
        request = self._client.build_request("GET", url, headers=headers)
        try:
            async with asyncio.timeout(self._settings.request_timeout):
                response = await self._transport.handle_async_request(request)
                try:
                    body = await self._read(response)
                finally:
                    await response.aclose()
        except httpx.RequestError as error:
            raise self._failure(error, shown_url) from None
        return Reply(response.status_code, None, body)

    def _failure(self, error: httpx.RequestError, shown_url: str) -> Exception:
        if isinstance(error, httpx.ConnectTimeout):
            return self._failures.connect_timeout(shown_url)
        if isinstance(error, httpx.TimeoutException):
            return TimeoutError()  # the caller words the request timeout
        if isinstance(error, httpx.ConnectError):
            return self._failures.connect(shown_url, error)
        if isinstance(error, httpx.DecodingError):
            return self._failures.decoding(error)
        return self._failures.connection(shown_url, error)

    async def _read(self, response: httpx.Response) -> bytes | None:
        limit = self._settings.max_response_bytes
        declared = response.headers.get("content-length")
        if (declared is not None and declared.isascii() and declared.isdigit()
                and int(declared) > limit):
            return None
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    async def aclose(self) -> None:
        """See :meth:`Sender.aclose`."""
        await self._client.aclose()


def open_sender(transport: str, settings: SenderSettings,
                pool: SharedPool | None = None) -> Sender:
    """The sender for ``transport`` (``"aiohttp"`` or ``"httpx"``); an aiohttp sender
    over ``pool``'s connections when one is given."""
    return AiohttpSender(settings, pool) if transport == "aiohttp" else HttpxSender(settings)
