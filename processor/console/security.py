"""Who may use the console, and which requests it takes: the bind rule, the token, the
session cookie, the cross-site checks and the security headers.

The rules:

- Bound to loopback (``127.0.0.1``, ``::1`` or ``localhost``, nothing else), the
  console needs no token, but answers only requests whose ``Host`` names loopback:
  a web page cannot reach it through a name of its own that resolves to 127.0.0.1
  (DNS rebinding).
- Bound anywhere else (``0.0.0.0``, a LAN address, even ``127.0.0.2``), it
  refuses to start without a token. A browser presents the token once, as
  ``?token=`` or in the login form, and gets a session cookie; a script sends
  ``Authorization: Bearer <token>``. Without either the console answers 401.
- Every action is a POST carrying the session's CSRF token in a form field,
  from a page of the console itself (its ``Origin``, or else its ``Referer``,
  names the host the request went to).

The functions here are pure; :class:`Guard` applies them to every request.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from watcher.errors import ConfigError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
TOKEN_ENV = "PROCESSOR_CONSOLE_TOKEN"
MIN_TOKEN_LENGTH = 16
TOKEN_PARAMETER = "token"
COOKIE_PREFIX = "statefeed_console_"
# Paths anyone may read: the login form and the files it needs.
PUBLIC_PREFIXES = ("/static/", "/login")
PUBLIC_PATHS = frozenset({"/favicon.ico"})
SESSION_BYTES = 18

# Nothing but the console's own files: no inline script or style, no other origin, no
# framing. A text that escaped escaping still could not run.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = (
    ("content-security-policy", CONTENT_SECURITY_POLICY),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    # same-origin: the console's own POSTs keep their Origin (no-referrer would make it
    # "null"), and no address of it ever reaches another site.
    ("referrer-policy", "same-origin"),
    ("cache-control", "no-store"),
)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is one of the three loopback names the console binds without a
    token: ``127.0.0.1``, ``::1`` and ``localhost``. Other 127.x addresses are not."""
    return host.strip("[]").lower() in LOOPBACK_HOSTS


def check_bind(host: str, token: str | None, *, what: str = "the console",
               token_env: str = TOKEN_ENV) -> None:
    """Refuse a bind that ``what`` (the console, the ingest API) must not make.

    Raises:
        ConfigError: ``host`` is not loopback and no token is given, or the token is
            shorter than 16 characters, or ``host`` is empty.
    """
    if not host:
        raise ConfigError("--host must name an address to listen on, such as 127.0.0.1")
    if token is not None and len(token) < MIN_TOKEN_LENGTH:
        raise ConfigError(f"{what}'s token must be at least {MIN_TOKEN_LENGTH} characters "
                          f"(got {len(token)}); generate one with `openssl rand -hex 16`")
    if token is None and not is_loopback(host):
        raise ConfigError(
            f"{what} listens on {host}, beyond loopback: give it a token with --token "
            f"or {token_env} (at least {MIN_TOKEN_LENGTH} characters), or bind 127.0.0.1")


def host_name(host_header: str) -> str:
    """The name part of a ``Host`` header (``[::1]:8090`` -> ``::1``), lower-cased."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def loopback_host_header(host_header: str) -> bool:
    """Whether a request's ``Host`` names loopback: ``127.0.0.1``, ``localhost`` or
    ``[::1]``, with any port."""
    name = host_name(host_header)
    if name in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def same_origin(origin: str | None, referer: str | None, host_header: str) -> bool:
    """Whether a POST comes from a page of this console: its ``Origin`` (or, without
    one, its ``Referer``) names the host the request was sent to. Neither: refused."""
    source = origin if origin else referer
    if not source or source == "null":
        return False
    parts = urlsplit(source)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == \
        host_header.strip().lower()


def token_matches(given: str | None, token: str) -> bool:
    """Compare a presented token with the console's in constant time."""
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or ``None``."""
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


@dataclass(frozen=True)
class Keys:
    """The secrets of one console process: its token (or none) and a random key that
    signs sessions' CSRF tokens (a restart ends the sessions)."""

    token: str | None
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    def _mac(self, purpose: bytes, session: str) -> str:
        key = self.secret + (self.token or "").encode()
        return hmac.new(key, purpose + session.encode(), hashlib.sha256).hexdigest()[:32]

    def cookie(self, session: str) -> str:
        """The cookie value of ``session``: the session id and, when a token guards the
        console, a signature only the token's holder could have obtained."""
        return f"{session}.{self._mac(b'auth:', session)}" if self.token else session

    def session_of(self, cookie: str | None) -> tuple[str | None, bool]:
        """The session id in ``cookie`` and whether it is signed in (always, without a
        token). A missing or malformed cookie gives ``(None, False)``."""
        if not cookie:
            return None, False
        session, _, signature = cookie.partition(".")
        if not session or len(session) > 64 or not session.replace("-", "").replace(
                "_", "").isalnum():
            return None, False
        if not self.token:
            return session, True
        return session, bool(signature) and hmac.compare_digest(
            signature, self._mac(b"auth:", session))

    def csrf(self, session: str) -> str:
        """The CSRF token of ``session``: what its forms carry, and every POST must."""
        return self._mac(b"csrf:", session)

    def csrf_matches(self, session: str | None, given: str | None) -> bool:
        """Whether ``given`` is the CSRF token of ``session`` (compared in constant time)."""
        return bool(session) and given is not None and hmac.compare_digest(
            given, self.csrf(session or ""))


def new_session() -> str:
    """A fresh random session id."""
    return secrets.token_urlsafe(SESSION_BYTES)


def without_token(path: str, query_string: str) -> str:
    """``path`` with its query string less the ``token`` parameter: where a browser that
    came with ``?token=`` is sent, so the token stays out of its history."""
    kept = [(key, value) for key, value in parse_qsl(query_string, keep_blank_values=True)
            if key != TOKEN_PARAMETER]
    return path + (f"?{urlencode(kept)}" if kept else "")


def local_path(target: str | None) -> str:
    """``target`` if it is a path of this console (``/...``, not ``//host``), else ``/``:
    where a login may send the browser on."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def is_public(path: str) -> bool:
    """Whether ``path`` is served without signing in (the login form and static files)."""
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


@dataclass(frozen=True)
class Access:
    """What :class:`Guard` found out about a request, for the pages (``scope["state"]``):
    its session id, the session's CSRF token, and the cookie to set (when new)."""

    session: str
    csrf: str
    set_cookie: str | None = None


class Guard:
    """ASGI middleware that applies the console's rules to every HTTP request.

    ``loopback_only`` (the console is bound to loopback) makes it refuse requests
    whose ``Host`` is not a loopback name (421). ``keys.token`` (when set) makes it
    answer 401 to requests that present neither the session cookie nor the token.
    It gives each browser a session (cookie ``statefeed_console_<port>``, HttpOnly,
    SameSite=Strict) and adds the security headers to every answer.
    """

    def __init__(self, app: ASGIApp, *, keys: Keys, loopback_only: bool, port: int,
                 unauthorised: ASGIApp) -> None:
        self.app = app
        self.keys = keys
        self.loopback_only = loopback_only
        self.cookie_name = f"{COOKIE_PREFIX}{port}"
        self.unauthorised = unauthorised

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {key.decode("latin-1").lower(): value.decode("latin-1")
                   for key, value in scope.get("headers", [])}
        host = headers.get("host", "")
        if self.loopback_only and not loopback_host_header(host):
            await _plain(send, 421, "this console answers on 127.0.0.1, localhost or [::1] "
                         "only")
            return
        session, signed_in = self.keys.session_of(_cookie(headers.get("cookie"),
                                                          self.cookie_name))
        path = scope.get("path", "")
        query = scope.get("query_string", b"").decode("latin-1")
        set_cookie = None
        if self.keys.token and not signed_in:
            presented = dict(parse_qsl(query)).get(TOKEN_PARAMETER)
            if token_matches(presented, self.keys.token) and scope.get("method") == "GET":
                session = new_session()
                await _redirect(send, without_token(path, query),
                                self._cookie_header(session, scope))
                return
            if token_matches(bearer(headers.get("authorization")), self.keys.token):
                signed_in = True
            elif not is_public(path):
                await self.unauthorised(scope, receive, _with_headers(send, ()))
                return
        if session is None:
            session = new_session()
            set_cookie = self._cookie_header(session, scope) if not self.keys.token else None
        scope.setdefault("state", {})["access"] = Access(session, self.keys.csrf(session),
                                                         set_cookie)
        extra = (("set-cookie", set_cookie),) if set_cookie else ()
        await self.app(scope, receive, _with_headers(send, extra))

    def _cookie_header(self, session: str, scope: Scope) -> str:
        secure = "; Secure" if scope.get("scheme") == "https" else ""
        return (f"{self.cookie_name}={self.keys.cookie(session)}; Path=/; HttpOnly; "
                f"SameSite=Strict{secure}")

    def sign_in_cookie(self, scope: Scope) -> str:
        """A ``Set-Cookie`` value starting a signed-in session (after a good login)."""
        return self._cookie_header(new_session(), scope)


def _cookie(header: str | None, name: str) -> str | None:
    for part in (header or "").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


def _with_headers(send: Send, extra: tuple[tuple[str, str], ...]) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            present = {key.lower() for key, _ in message.get("headers", [])}
            message["headers"] = [
                *message.get("headers", []),
                *((key.encode(), value.encode()) for key, value in SECURITY_HEADERS
                  if key.encode() not in present),
                *((key.encode(), value.encode()) for key, value in extra)]
        await send(message)
    return sending


async def _plain(send: Send, status: int, text: str) -> None:
    body = (text + "\n").encode()
    await _with_headers(send, ())({
        "type": "http.response.start", "status": status,
        "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _redirect(send: Send, location: str, cookie: str) -> None:
    await _with_headers(send, (("set-cookie", cookie),))({
        "type": "http.response.start", "status": 303,
        "headers": [(b"location", location.encode("latin-1", errors="replace")),
                    (b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})
