"""Configuration of the HTTP hop to the user's handler, validated once at construction.

:class:`HttpProcessorConfig` holds where and how to call the handler; the
checks of its headers and URLs, and :func:`parse_header` for the CLI's
``--handler-header``, live beside it. Nothing here does I/O except reading a
CA bundle (:func:`ssl_verify`).

No message or ``repr`` of this module contains a configured header value, the
password of a URL or the values of its query string.
"""

from __future__ import annotations

import base64
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from urllib.parse import unquote, urlsplit, urlunsplit

from processor.observe.redact import redact_url
from watcher.errors import ConfigError
from watcher.rules.checks import check_seconds, check_whole_number

DEFAULT_REQUEST_TIMEOUT = 30.0
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_MAX_RESPONSE_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_CONNECTIONS = 100
# httpx's own connection pool slows down as concurrency grows, and its request
# and response objects cost CPU per call; item calls go through aiohttp by default
# (processor/http/transports.py; docs/explanation/performance.md has the figures).
TRANSPORTS = ("aiohttp", "httpx")
DEFAULT_TRANSPORT = "aiohttp"
HEALTH_CHECK_TIMEOUT = 5.0
# Where the handler SDK answers GET for health checks (handlers.asgi.DEFAULT_HEALTH_PATH).
DEFAULT_HEALTH_PATH = "/healthz"

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

_URL_EXAMPLES = {"handler_url": "http://handler:8000/process",
                 "health_url": "http://handler:8000/healthz",
                 "reduce_url": "http://handler:8000/reduce"}


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
    - ``health_optional``: a 404 or 405 from ``health_url`` counts as healthy (the
      handler serves no such route): for a health URL guessed, not given
      (:func:`default_health_url`). No answer, or a 5xx, is unhealthy still.
    - ``transport``: the HTTP client the calls go through, one of :data:`TRANSPORTS`.
    - ``reduce_url``: where reduce gates are POSTed (default: ``<handler_url>/reduce``).

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
    reduce_url: str | None = None
    health_optional: bool = False

    def __post_init__(self) -> None:
        check_url("handler_url", self.handler_url)
        if self.transport not in TRANSPORTS:
            raise ConfigError(f"transport must be one of {', '.join(TRANSPORTS)}, got "
                              f"{self.transport!r}")
        if self.health_url is not None:
            check_url("health_url", self.health_url)
        if self.reduce_url is not None:
            check_url("reduce_url", self.reduce_url)
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
        check_seconds("request_timeout", self.request_timeout)
        check_seconds("connect_timeout", self.connect_timeout)
        check_whole_number("max_response_bytes", self.max_response_bytes)
        check_whole_number("max_connections", self.max_connections)
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


def service_name(handler_url: str) -> str:
    """The name processors give a handler in the flow controls (its rate limit and its
    Retry-After blocks are shared by every processor that calls it): its URL without
    user, password, query or fragment, which may carry secrets (``?code=...``)."""
    try:
        parts = urlsplit(handler_url.strip())
        host = parts.hostname or ""
        if ":" in host:  # an IPv6 address goes back in its brackets
            host = f"[{host}]"
        netloc = host + (f":{parts.port}" if parts.port is not None else "")
        return urlunsplit((parts.scheme.lower(), netloc, parts.path or "/", "", ""))
    except ValueError:  # a malformed URL: the HTTP config's check names it
        return "default"


def chosen_health_url(handler_url: str, given: str) -> str | None:
    """The handler URL /readyz checks: the one given, none for ``off``, else
    ``<handler-url>/healthz`` (:func:`~processor.http.config.default_health_url`)."""
    if given.strip().lower() == "off":
        return None
    if given:
        return given
    try:
        return default_health_url(handler_url)
    except ValueError:  # a malformed handler URL: the config's check names it
        return None


def beside_handler(handler_url: str, path: str) -> str:
    """``<handler-url><path>``: ``path`` (``/batch``) added to the handler URL's path, its
    query string (a token, say) kept after it, the fragment dropped.

    Raises:
        ValueError: ``handler_url`` does not parse (:func:`check_url` names it).
    """
    parts = urlsplit(handler_url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + path,
                       parts.query, ""))


def default_health_url(handler_url: str) -> str:
    """``<handler-url>/healthz``, as the batch and reduce URLs default to
    ``<handler-url>/batch`` and ``/reduce``: where the handler SDK answers health
    checks when the handler URL is its root.

    Raises:
        ValueError: ``handler_url`` does not parse (:func:`check_url` names it).
    """
    return beside_handler(handler_url, DEFAULT_HEALTH_PATH)


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


def check_url(setting: str, url: object, *, example: str | None = None) -> str:
    """Return ``url`` if it is an absolute ``http://`` or ``https://`` URL with a host.

    ``setting`` names the URL in messages; ``example`` is shown as a fix (by
    default, the one for ``setting`` or a handler URL). Messages show the URL
    redacted.

    Raises:
        ConfigError: ``url`` is empty, has whitespace or control characters, does
            not parse, has another scheme or has no host.
    """
    example = example or _URL_EXAMPLES.get(setting, _URL_EXAMPLES["handler_url"])
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"{setting} is empty: give a URL such as {example}")
    shown = redact_url(url)
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        raise ConfigError(f"{setting} {shown!r} contains whitespace or control characters")
    import httpx  # here, not at the top: the CLI's --help reads this module's defaults

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
    return url


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


def ssl_verify(verify: bool | str) -> bool | ssl.SSLContext:
    """``verify`` as the HTTP clients take it (a path becomes an SSL context).

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


def split_userinfo(url: str) -> tuple[str, str | None]:
    """``url`` without ``user:password@``, and the Basic ``Authorization`` value it implied.

    Never raises for a URL :func:`check_url` accepted.
    """
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode("ascii")
    bare = urlunsplit((parts.scheme, hostport, parts.path, parts.query, parts.fragment))
    return bare, f"Basic {token}"
