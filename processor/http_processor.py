"""HTTP dispatch: the processor that POSTs each item to the user's handler.

:class:`HttpProcessor` implements :class:`watcher.protocol.Processor` over HTTP,
so handlers can be written in any language. The contract, per item:

Request
    ``POST <handler URL>``; the body is the item's bytes unchanged, with
    ``Content-Type: application/octet-stream`` and the headers ``X-Partition-Id``,
    ``X-Item-Id``, ``X-Gate`` (the item's current gate), ``X-Attempt`` (1-based)
    and ``Idempotency-Key`` (stable across retries of one step), plus the
    operator's extra headers (such as ``Authorization``). Ids and the key are
    sent unchanged when they consist only of visible ASCII other than ``%``;
    any other value is percent-encoded (RFC 3986, every byte but unreserved
    characters), so a handler always decodes them with ``urllib.parse.unquote``
    or ``decodeURIComponent`` (a no-op on values without ``%``).

Success: any 2xx with a JSON object, every field optional
    ``{"gate": int, "done": bool, "data": any}`` or ``{..., "data_b64": str}``.
    An empty body (or ``{}``, or 204) keeps the gate and the data: a loop.
    ``gate`` (a non-negative integer; ``true`` is not an integer) moves the item;
    absent or ``null`` keeps the current gate. ``done`` (``true``/``false``;
    absent or ``null`` is ``false``) completes the item. ``data``, when the key
    is present, replaces the item's bytes with its compact JSON encoding (so
    ``"data": null`` stores ``null``); ``data_b64`` replaces them with the
    decoded standard base64 (padding required). Setting both is malformed.
    Unknown keys are ignored. The Content-Type of the answer is not checked.

Errors: ``{"error": {"message": str, "no_retry": bool}}`` with any status
    (``"error": "text"`` is accepted too). :class:`NonRetryableError` for a 4xx
    other than 408 and 429, a 3xx (redirects are not followed: the handler URL
    is wrong) or ``no_retry: true`` with any status; otherwise
    :class:`RetryableError`: 5xx, 408, 429, an error object on a 2xx, timeouts
    and connection failures. On 429 and 503 a ``Retry-After`` header
    (delta-seconds or HTTP-date) becomes ``retry_after``.

Malformed answers (invalid JSON, a non-object body, wrong field types, a
negative gate, bad base64, a body over ``max_response_bytes``) raise
:class:`RetryableError`: a fixed handler can still process the item, and the
engine's retry budget bounds the attempts. Every message names the partition,
item, gate and attempt, and says what was wrong. :meth:`HttpProcessor.process`
raises nothing but these two errors (and ``CancelledError`` when cancelled).

No message, ``repr`` or log line of this module contains a configured header
value, the password of a URL or the values of its query string.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import email.utils
import json
import logging
import math
import os
import re
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC
from types import MappingProxyType, TracebackType
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import httpx

from processor.redact import Scrubber, header_secrets, redact_url, url_secrets
from processor.transports import USER_AGENT, SenderSettings, TransportError, open_sender
from watcher.errors import ConfigError
from watcher.models import MAX_GATE
from watcher.protocol import NonRetryableError, ProcessorError, Result, RetryableError, WorkItem

log = logging.getLogger(__name__)

DEFAULT_REQUEST_TIMEOUT = 30.0
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_MAX_RESPONSE_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_CONNECTIONS = 100
# httpx's own connection pool slows down as concurrency grows, and its request
# and response objects cost CPU per call; item calls go through aiohttp by default
# (processor/transports.py; the README's benchmark section has the figures).
TRANSPORTS = ("aiohttp", "httpx")
DEFAULT_TRANSPORT = "aiohttp"
HEALTH_CHECK_TIMEOUT = 5.0
# A Retry-After beyond this is taken as this: a day is already "much later".
MAX_RETRY_AFTER = 86_400.0
MAX_ERROR_MESSAGE_CHARS = 1000
ERROR_EXCERPT_CHARS = 200
EXCERPT_SCAN_BYTES = 64 * 1024

# Headers statefeed sets itself, or that frame the HTTP message: an operator
# header with one of these names would corrupt the request.
RESERVED_HEADERS = frozenset({
    "x-partition-id", "x-item-id", "x-gate", "x-attempt", "idempotency-key",
    "content-type", "content-length", "content-encoding", "transfer-encoding", "host",
    "connection", "keep-alive", "te", "trailer", "upgrade", "expect",
})

_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Visible ASCII, with spaces and tabs only inside: HTTP strips outer whitespace.
_HEADER_VALUE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?")
# Ids made of these are sent as they are; "%" is excluded so that decoding is
# never ambiguous.
_PLAIN_HEADER_VALUE = re.compile(r"[\x21-\x24\x26-\x7e]*")
_DELTA_SECONDS = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,6})?")


# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class HttpProcessorConfig:
    """Where and how to call the user's handler; validated at construction.

    - ``handler_url``: ``http://`` or ``https://`` URL the items are POSTed to. A
      ``user:password@`` in it becomes HTTP Basic authentication.
    - ``headers``: extra request headers (such as ``Authorization``); the names
      statefeed sets itself (:data:`RESERVED_HEADERS`) are refused.
    - ``request_timeout``: seconds for one whole call: waiting for a pooled
      connection, connecting, sending the item and reading the full answer.
    - ``connect_timeout``: seconds to establish a connection (within the above).
    - ``max_response_bytes``: larger answers are refused without being read.
    - ``max_connections``: connection pool size; keep it at least the engine's
      concurrency, or calls queue for a connection inside their timeout.
    - ``verify``: check TLS certificates (``True``), don't (``False``), or check
      them against this CA bundle file or directory.
    - ``health_url``: URL answered with 2xx while the handler is healthy.

    Raises:
        ConfigError: a setting is invalid; the message names it and the fix.
    """

    handler_url: str
    headers: Mapping[str, str] = field(default_factory=dict, hash=False)
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    verify: bool | str = True
    health_url: str | None = None
    transport: str = DEFAULT_TRANSPORT

    def __post_init__(self) -> None:
        _check_url("handler_url", self.handler_url)
        if self.transport not in TRANSPORTS:
            raise ConfigError(f"transport must be one of {', '.join(TRANSPORTS)}, got "
                              f"{self.transport!r}")
        if self.health_url is not None:
            _check_url("health_url", self.health_url)
        if not isinstance(self.headers, Mapping):
            raise ConfigError("headers must be a mapping of header name to value")
        seen: set[str] = set()
        for name, value in self.headers.items():
            check_header(name, value)
            if name.lower() in seen:
                raise ConfigError(f"handler header {name!r} is given twice; give it once")
            seen.add(name.lower())
        if "authorization" in seen and "@" in urlsplit(self.handler_url).netloc:
            raise ConfigError(
                "handler_url carries user:password@ and an Authorization header is set too; "
                "use one of them")
        _check_seconds("request_timeout", self.request_timeout)
        _check_seconds("connect_timeout", self.connect_timeout)
        _check_count("max_response_bytes", self.max_response_bytes)
        _check_count("max_connections", self.max_connections)
        _check_verify(self.verify)
        # A read-only copy: the caller's dict can change neither this config nor
        # the running processor.
        object.__setattr__(self, "headers", MappingProxyType(dict(self.headers)))

    def __repr__(self) -> str:
        health = None if self.health_url is None else redact_url(self.health_url)
        return (
            f"HttpProcessorConfig(handler_url={redact_url(self.handler_url)!r}, "
            f"headers={sorted(self.headers)!r}, request_timeout={self.request_timeout!r}, "
            f"connect_timeout={self.connect_timeout!r}, "
            f"max_response_bytes={self.max_response_bytes!r}, "
            f"max_connections={self.max_connections!r}, verify={self.verify!r}, "
            f"health_url={health!r})"
        )

    __str__ = __repr__


def check_header(name: str, value: str) -> None:
    """Check one operator header. The message never contains the value.

    Raises:
        ConfigError: the name is not an HTTP token or is reserved, or the value is
            empty, not ASCII, or has control characters or outer whitespace.
    """
    if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
        raise ConfigError(
            f"handler header name {name!r} is not a valid HTTP header name (letters, digits "
            "and !#$%&'*+-.^_`|~ only)")
    if name.lower() in RESERVED_HEADERS:
        raise ConfigError(
            f"handler header {name!r} is reserved: statefeed sets it on every request; "
            "remove it")
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"handler header {name!r} has an empty value; give it a value")
    if not _HEADER_VALUE.fullmatch(value):
        raise ConfigError(
            f"handler header {name!r} has an invalid value: use visible ASCII characters "
            "(spaces inside only), without line breaks or other control characters")


def parse_header(spec: str) -> tuple[str, str]:
    """Parse a ``--handler-header 'Name: value'`` option into ``(name, value)``.

    Whitespace around the name and the value is dropped.

    Raises:
        ConfigError: ``spec`` has no ``:``, or :func:`check_header` refuses it. The
            message never contains the value.
    """
    name, colon, value = spec.partition(":")
    if not colon or not name.strip():
        raise ConfigError(
            "--handler-header must look like 'Name: value', for example "
            "'Authorization: Bearer $TOKEN'")
    name, value = name.strip(), value.strip()
    check_header(name, value)
    return name, value


def _check_url(setting: str, url: object) -> None:
    example = "http://handler:8000/process" if setting == "handler_url" else (
        "http://handler:8000/healthz")
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"{setting} is empty: give a URL such as {example}")
    shown = redact_url(url)
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        raise ConfigError(f"{setting} {shown!r} contains whitespace or control characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
        httpx.URL(url)
    except (ValueError, httpx.InvalidURL) as error:
        raise ConfigError(
            f"{setting} {shown!r} is malformed ({error}); expected a URL such as {example}"
        ) from None
    if parts.scheme.lower() not in ("http", "https"):
        raise ConfigError(
            f"{setting} {shown!r} must start with http:// or https://, such as {example}")
    if not parts.hostname:
        raise ConfigError(f"{setting} {shown!r} has no host; expected a URL such as {example}")


def _check_seconds(setting: str, value: object) -> None:
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or value <= 0):
        raise ConfigError(f"{setting} must be a number of seconds greater than 0, got {value!r}")


def _check_count(setting: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{setting} must be a whole number of at least 1, got {value!r}")


def _check_verify(verify: object) -> None:
    if isinstance(verify, bool):
        return
    if not isinstance(verify, str) or not verify:
        raise ConfigError(
            f"verify must be true, false or the path of a CA bundle, got {verify!r}")
    if not os.path.exists(verify):
        raise ConfigError(
            f"verify: the CA bundle {verify!r} does not exist; give the path of a PEM file "
            "or a directory of certificates")


def _ssl_verify(verify: bool | str) -> bool | ssl.SSLContext:
    """``verify`` as httpx takes it (a path must become an SSL context in httpx 0.28).

    Raises:
        ConfigError: the CA bundle cannot be loaded.
    """
    if isinstance(verify, bool):
        return verify
    try:
        if os.path.isdir(verify):
            return ssl.create_default_context(capath=verify)
        return ssl.create_default_context(cafile=verify)
    except (OSError, ssl.SSLError) as error:
        raise ConfigError(f"verify: cannot load the CA bundle {verify!r}: {error}") from None


def _split_userinfo(url: str) -> tuple[str, str | None]:
    """``url`` without ``user:password@``, and the Basic ``Authorization`` value it implied."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode("ascii")
    bare = urlunsplit((parts.scheme, hostport, parts.path, parts.query, parts.fragment))
    return bare, f"Basic {token}"


# --------------------------------------------------------------------------- pure parsing


class MalformedResponseError(ValueError):
    """The handler's answer breaks the contract; the message says how."""


@dataclass(frozen=True, slots=True)
class HandlerError:
    """An error the handler reported (or the text of an error answer without one)."""

    message: str
    no_retry: bool = False


@dataclass(frozen=True, slots=True)
class Failure:
    """Why one call failed: the reason, and whether and when to retry."""

    retryable: bool
    reason: str
    retry_after: float | None = None


_LOOP = Result()


def header_safe(value: str) -> str:
    """``value`` as an HTTP header value: unchanged if plain visible ASCII without ``%``,
    else percent-encoded (UTF-8, ``urllib.parse.quote(value, safe="")``).
    """
    if _PLAIN_HEADER_VALUE.fullmatch(value):
        return value
    return quote(value, safe="")


def _unchanged(text: str) -> str:
    return text


Mask = Callable[[str], str]


def parse_success_body(body: bytes, mask: Mask = _unchanged) -> Result | HandlerError:
    """Map the body of a 2xx answer to a :class:`Result`.

    An empty (or blank) body is ``Result()``. A body whose ``error`` is set is an
    error report and comes back as a :class:`HandlerError`.

    Raises:
        MalformedResponseError: the body is not a JSON object, or a field has the
            wrong type or value.
    """
    if not body or body.isspace():
        return _LOOP
    return parse_answer(_decode_json(body), mask)


def parse_answer(document: Any, mask: Mask = _unchanged) -> Result | HandlerError:
    """Map one decoded answer (a JSON object) to a :class:`Result` or a :class:`HandlerError`.

    Shared by the per-item body and each entry of a batch answer.

    Raises:
        MalformedResponseError: not an object, or a field has the wrong type or value.
    """
    if not isinstance(document, dict):
        raise MalformedResponseError(
            f"the body is a JSON {_json_type(document)}, not an object")
    error = document.get("error")
    if error is not None:
        reported = _handler_error(error, mask)
        if reported is None:
            raise MalformedResponseError(
                f"'error' must be an object or a string, got {_show(error)}")
        return reported
    gate = document.get("gate")
    if gate is not None:
        if type(gate) is not int:
            raise MalformedResponseError(
                f"'gate' must be a non-negative integer, got {_show(gate)}")
        if not 0 <= gate <= MAX_GATE:
            raise MalformedResponseError(
                f"'gate' must be a non-negative integer up to {MAX_GATE}, got {gate}")
    done = document.get("done")
    if done is None:
        done = False
    elif type(done) is not bool:
        raise MalformedResponseError(f"'done' must be true or false, got {_show(done)}")
    encoded = document.get("data_b64")
    data: bytes | None = None
    if "data" in document:
        if encoded is not None:
            raise MalformedResponseError("both 'data' and 'data_b64' are set; set one of them")
        try:
            data = json.dumps(document["data"], separators=(",", ":"),
                              ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise MalformedResponseError(
                "'data' contains an unpaired UTF-16 surrogate escape") from None
    elif encoded is not None:
        if not isinstance(encoded, str):
            raise MalformedResponseError(
                f"'data_b64' must be a base64 string, got {_show(encoded)}")
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise MalformedResponseError(
                "'data_b64' is not valid base64 (standard alphabet, with = padding)"
            ) from None
    return Result(gate=gate, done=done, data=data)


def parse_error_body(body: bytes, mask: Mask = _unchanged) -> HandlerError:
    """The handler's error from the body of a non-2xx answer. Never raises.

    A body without the error object (a proxy's HTML page, plain text) is kept as a
    short excerpt in the message. ``mask`` hides secrets in the handler's text
    *before* it is shortened, so a cut never leaves part of a secret behind.
    """
    if not body or body.isspace():
        return HandlerError("")
    try:
        document = _decode_json(body)
    except MalformedResponseError:
        return HandlerError(_excerpt(body, mask))
    if isinstance(document, dict) and document.get("error") is not None:
        reported = _handler_error(document["error"], mask)
        if reported is not None:
            return reported
    return HandlerError(_excerpt(body, mask))


def classify_error(status: int, error: HandlerError, *, retry_after: str | None = None,
                   now: float) -> Failure:
    """Decide what an error answer means for the item.

    ``no_retry`` (any status), a 3xx and a 4xx other than 408 and 429 are final;
    everything else is retryable. ``retry_after`` (the header) counts on 429 and
    503 only; ``now`` (Unix seconds) resolves an HTTP-date in it.
    """
    detail = f": {error.message}" if error.message else " with no error message"
    if 200 <= status < 300:
        reason = f"the handler reported an error (HTTP {status}){detail}"
    else:
        reason = f"the handler answered HTTP {status}{detail}"
    if error.no_retry:
        return Failure(False, f"{reason} (no_retry set: not retried)")
    if 300 <= status < 400:
        return Failure(False, f"{reason}; redirects are not followed: set the handler URL "
                              "to the final address")
    if 400 <= status < 500 and status not in (408, 429):
        return Failure(False, reason)
    delay = None
    if status in (429, 503) and retry_after:
        delay = parse_retry_after(retry_after, now=now)
    return Failure(True, reason, delay)


def parse_retry_after(value: str, *, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` value: delta-seconds or an HTTP-date.

    A date in the past gives 0; anything over :data:`MAX_RETRY_AFTER` gives that.
    Returns ``None`` for a value that is neither. Never raises.
    """
    value = value.strip()
    if _DELTA_SECONDS.fullmatch(value):
        seconds = float(value)
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:  # "-0000": UTC by RFC 5322
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - now
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _decode_json(body: bytes) -> Any:
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except RecursionError:
        raise MalformedResponseError("the body is nested too deeply to parse") from None
    except ValueError as error:
        raise MalformedResponseError(f"the body is not valid JSON ({error})") from None


def _handler_error(value: Any, mask: Mask) -> HandlerError | None:
    if isinstance(value, str):
        return HandlerError(_truncate(mask(value)))
    if not isinstance(value, dict):
        return None
    message = value.get("message")
    if message is None:
        message = ""
    elif not isinstance(message, str):
        message = json.dumps(message, ensure_ascii=False)
    return HandlerError(_truncate(mask(message)), value.get("no_retry") is True)


def _truncate(text: str, limit: int = MAX_ERROR_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _excerpt(body: bytes, mask: Mask) -> str:
    # Mask a generous prefix before cutting it short: a secret straddling the
    # cut would otherwise survive in part.
    text = mask(body[:EXCERPT_SCAN_BYTES].decode("utf-8", "replace"))
    return _truncate(" ".join(text.split()), ERROR_EXCERPT_CHARS)


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"


def _show(value: Any) -> str:
    return _truncate(json.dumps(value, ensure_ascii=False), 60)


def describe_item(item: WorkItem) -> str:
    """How messages name an item: partition, item, gate and attempt."""
    return (f"partition {item.partition_id!r} item {item.id!r} gate {item.gate} "
            f"(attempt {item.attempt})")


# --------------------------------------------------------------------------- processor


class HttpProcessor:
    """Processes items by POSTing them to the user's HTTP handler.

    Holds one pooled keep-alive :class:`httpx.AsyncClient`; safe to call from
    many tasks at once. Close it with :meth:`aclose` or ``async with``.

    Raises:
        ConfigError: (on construction) the CA bundle cannot be loaded.
    """

    def __init__(self, config: HttpProcessorConfig) -> None:
        self.config = config
        url, basic_auth = _split_userinfo(config.handler_url)
        self._url = str(httpx.URL(url))  # normalised and percent-encoded once
        self._shown_url = redact_url(config.handler_url)
        self._request_timeout = config.request_timeout
        self._max_bytes = config.max_response_bytes
        headers = {"User-Agent": USER_AGENT, **config.headers}
        if basic_auth:
            headers["Authorization"] = basic_auth
        secrets = [*url_secrets(config.handler_url)]
        for value in headers.values():
            secrets.extend(header_secrets(value))
        self._health_url: httpx.URL | None = None
        self._health_headers: dict[str, str] = {}
        if config.health_url is not None:
            health_url, health_auth = _split_userinfo(config.health_url)
            self._health_url = httpx.URL(health_url)
            if health_auth:
                self._health_headers["Authorization"] = health_auth
                secrets.extend(header_secrets(health_auth))
            secrets.extend(url_secrets(config.health_url))
        self._scrub = Scrubber(secrets)
        verify = _ssl_verify(config.verify)
        self._sender = open_sender(config.transport, SenderSettings(
            headers=headers, request_timeout=config.request_timeout,
            connect_timeout=min(config.connect_timeout, config.request_timeout),
            max_response_bytes=config.max_response_bytes,
            max_connections=config.max_connections, verify=verify,
            shown_url=self._shown_url))
        # The health check only: a plain httpx client.
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(config.request_timeout,
                                  connect=min(config.connect_timeout, config.request_timeout)),
            verify=verify, follow_redirects=False)

    def __repr__(self) -> str:
        return (f"HttpProcessor(handler_url={self._shown_url!r}, "
                f"headers={sorted(self.config.headers)!r}, "
                f"request_timeout={self._request_timeout!r}, "
                f"max_connections={self.config.max_connections!r})")

    async def __aenter__(self) -> HttpProcessor:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    def start(self) -> None:
        """Build the HTTP client now, so the first items do not wait for it (optional:
        the first call does it otherwise). Call it inside the running event loop."""
        self._sender.start()

    async def aclose(self) -> None:
        """Close the pooled connections. Safe to call more than once."""
        await self._sender.aclose()
        await self._client.aclose()

    async def process(self, item: WorkItem) -> Result:
        """POST ``item`` to the handler and map the answer to a :class:`Result`.

        Raises:
            RetryableError: the call failed but may succeed later (5xx, 408, 429,
                timeout, connection failure, malformed answer); ``retry_after`` is
                set from ``Retry-After`` on 429 and 503.
            NonRetryableError: the handler refused the item for good (4xx other
                than 408 and 429, a redirect, or ``no_retry``).
        """
        try:
            return await self._process(item)
        except ProcessorError:
            raise
        except Exception as error:  # a bug here must fail the attempt, not the engine
            log.error("action=handler_call_bug partition=%s item=%s gate=%d error=%s",
                      item.partition_id, item.id, item.gate, type(error).__name__)
            raise self._failed(item, Failure(
                True, f"unexpected {type(error).__name__} while calling the handler: "
                      f"{_truncate(str(error))}")) from None

    async def _process(self, item: WorkItem) -> Result:
        headers = {
            "Content-Type": "application/octet-stream",
            "X-Partition-Id": header_safe(item.partition_id),
            "X-Item-Id": header_safe(item.id),
            "X-Gate": str(item.gate),
            "X-Attempt": str(item.attempt),
            "Idempotency-Key": header_safe(item.idempotency_key),
        }
        try:
            reply = await self._sender.post(self._url, item.data, headers)
        except TimeoutError:
            raise self._failed(item, Failure(True, (
                f"no complete answer from {self._shown_url} within {self._request_timeout} s "
                "(request_timeout)"))) from None
        except TransportError as error:
            raise self._failed(item, Failure(True, error.reason)) from None
        status, body = reply.status, reply.body
        if body is None:
            if 200 <= status < 300:
                raise self._failed(item, Failure(True, (
                    f"malformed answer (HTTP {status}): the body is larger than "
                    f"max_response_bytes ({self._max_bytes} bytes)")))
            reported = HandlerError(f"(the error body is larger than {self._max_bytes} bytes)")
        elif 200 <= status < 300:
            try:
                outcome = parse_success_body(body, self._scrub)
            except MalformedResponseError as malformed:
                raise self._failed(item, Failure(True, (
                    f"malformed answer (HTTP {status}): {malformed}; expected a JSON object "
                    'such as {"gate": 2, "done": false}'))) from None
            if isinstance(outcome, Result):
                return outcome
            reported = outcome
        else:
            reported = parse_error_body(body, self._scrub)
        raise self._failed(item, classify_error(
            status, reported, retry_after=reply.retry_after, now=time.time()))

    def _failed(self, item: WorkItem, failure: Failure) -> ProcessorError:
        message = self._scrub(f"{describe_item(item)}: {failure.reason}")
        log.debug("action=handler_call_failed partition=%s item=%s gate=%d attempt=%d "
                  "retryable=%s", item.partition_id, item.id, item.gate, item.attempt,
                  failure.retryable)
        if failure.retryable:
            return RetryableError(message, retry_after=failure.retry_after)
        return NonRetryableError(message)

    async def check_health(self) -> tuple[bool, str]:
        """GET the health URL: ``(True, detail)`` on a 2xx answer. Never raises.

        Without a health URL the handler counts as healthy.
        """
        if self._health_url is None:
            return True, "no health URL configured"
        shown = redact_url(self.config.health_url or "")
        timeout = min(HEALTH_CHECK_TIMEOUT, self._request_timeout)
        try:
            async with asyncio.timeout(timeout):
                request = self._client.build_request("GET", self._health_url,
                                                     headers=self._health_headers)
                response = await self._client.send(request, stream=True)
                await response.aclose()
        except (TimeoutError, httpx.TimeoutException):
            return False, f"no answer from {shown} within {timeout} s"
        except Exception as error:  # a health check reports, it never raises
            return False, self._scrub(f"{shown}: {_error_text(error)}")
        status = response.status_code
        return 200 <= status < 300, f"{shown} answered HTTP {status}"


def _error_text(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {_truncate(text, 300)}" if text else type(error).__name__
