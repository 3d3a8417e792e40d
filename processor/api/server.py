"""Serve the ingest API (``processor api``): who may call it, and the uvicorn server.

The rules are the console's: bound to loopback (``127.0.0.1``, ``::1``,
``localhost``) it needs no token but answers only requests whose ``Host`` names
loopback (no DNS rebinding); bound anywhere else it refuses to start without a
token of at least 16 characters, which every request then presents as
``Authorization: Bearer <token>`` (``/healthz`` excepted). Tokens never reach
the log. A browser on another site may not change state: every method but GET,
HEAD and OPTIONS is checked by :func:`processor.api.origin.cross_site_refusal`
here, once for every route.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from processor.api.completions import CompletionRoutes, is_completion_path
from processor.api.origin import cross_site_refusal
from processor.api.problems import ApiError
from processor.api.routes import ApiSettings, Dispatch, IngestApi
from processor.api.schedule_routes import mount_schedules
from processor.api.upload import Limits
from processor.client.async_client import AsyncClient
from processor.console.security import (
    bearer,
    check_bind,
    is_loopback,
    loopback_host_header,
    token_matches,
)
from processor.console.server import check_database
from processor.embedded import http_url, listen, serving, stop_on_signals
from processor.feed.hub import FeedHub, FeedSettings
from processor.notify.targets import check_url
from watcher.errors import ConfigError
from watcher.store.db.urls import DatabaseURL

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8091
TOKEN_ENV = "PROCESSOR_API_TOKEN"
PUBLIC_PATHS = frozenset({"/healthz"})
HEADERS = ((b"x-content-type-options", b"nosniff"), (b"cache-control", b"no-store"))


@dataclass(frozen=True)
class ApiOptions:
    """Where the API writes and listens: the database and table prefix, the address and
    port (0: any free port), the token (``None``: loopback only) and the limits."""

    db_url: DatabaseURL
    table_prefix: str = ""
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    token: str | None = None
    limits: Limits = field(default_factory=Limits)
    feed: FeedSettings = field(default_factory=FeedSettings)
    # The processors' --notify-url: a cancel here sends a partition that names none there.
    notify_default: str | None = None

    def __post_init__(self) -> None:
        """Raises:
            ConfigError: the port is not from 0 to 65535, or the bind needs a token.
            InvalidInputError: the default notify URL is not an http(s) URL.
        """
        if type(self.port) is not int or not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be from 0 to 65535, got {self.port!r}")
        check_bind(self.host, self.token, what="the API", token_env=TOKEN_ENV)
        check_url("--notify-url (PROCESSOR_NOTIFY_URL)", self.notify_default)


class AccessGuard:
    """ASGI middleware: the loopback ``Host`` check, the bearer token, the cross-site
    rule of every state-changing method, and the headers every answer carries."""

    def __init__(self, app: Any, *, token: str | None, loopback_only: bool) -> None:
        self.app = app
        self.token = token
        self.loopback_only = loopback_only

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {key.decode("latin-1").lower(): value.decode("latin-1")
                   for key, value in scope.get("headers", [])}
        refusal = None
        if self.loopback_only and not loopback_host_header(headers.get("host", "")):
            refusal = ApiError(421, "misdirected_request", "this API answers on 127.0.0.1, "
                               "localhost or [::1] only")
        elif (self.token and scope.get("path") not in PUBLIC_PATHS
              and not is_completion_path(scope.get("path", ""))  # the token is the capability
              and not token_matches(bearer(headers.get("authorization")), self.token)):
            refusal = ApiError(401, "unauthorized", "send the API's token as "
                               "'Authorization: Bearer <token>'")
        else:
            refusal = cross_site_refusal(scope.get("method", ""), headers)
        sending = _with_headers(send, refusal)
        if refusal is None:
            await self.app(scope, receive, sending)
            return
        body = refusal.body()
        await sending({"type": "http.response.start", "status": refusal.status, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode())]})
        await sending({"type": "http.response.body", "body": body})


def _with_headers(send: Any, refusal: ApiError | None) -> Any:
    async def sending(message: Any) -> None:
        if message["type"] == "http.response.start":
            extra = list(HEADERS)
            if refusal is not None and refusal.status == 401:
                extra.append((b"www-authenticate", b'Bearer realm="statefeed"'))
            message["headers"] = [*message.get("headers", []), *extra]
        await send(message)
    return sending


def create_app(options: ApiOptions, client: AsyncClient | None = None,
               feed: FeedHub | None = None) -> Any:
    """The API's ASGI app (``client``: shared with the caller and left open; ``feed``:
    the live feed's hub, one of its own when not given)."""
    settings = ApiSettings(db_url=options.db_url, table_prefix=options.table_prefix,
                           limits=options.limits, token=options.token,
                           loopback_only=is_loopback(options.host), feed=options.feed,
                           notify_default=options.notify_default)
    api = IngestApi(settings, client, feed)
    routes = CompletionRoutes(mount_schedules(Dispatch(api), api), api)
    return AccessGuard(routes, token=options.token, loopback_only=settings.loopback_only)


@contextlib.asynccontextmanager
async def api_running(options: ApiOptions, client: AsyncClient | None = None,
                      feed: FeedHub | None = None) -> AsyncIterator[str]:
    """Serve the API for the block; yields its base URL (``http://127.0.0.1:8091/``).
    Its live feeds end when the block does (they would hold the server open).

    Raises:
        ConfigError: the address cannot be bound.
        RuntimeError: the server did not start.
    """
    sock = listen(options.host, options.port)
    port = sock.getsockname()[1]
    hub = feed or FeedHub(options.feed)
    async with serving(create_app(options, client, hub), sock, what="the API"):
        try:
            yield http_url(options.host, port)
        finally:
            await hub.close()


async def run_api(options: ApiOptions, announce: Callable[[str], None]) -> int:
    """``processor api``: check the database, serve until SIGINT or SIGTERM, and return
    the exit status (0).

    Raises:
        ConfigError: the address cannot be bound.
        DatabaseError: the database does not answer or has no statefeed tables.
    """
    await check_database(options.db_url, options.table_prefix)
    stop = stop_on_signals()
    async with api_running(options) as url:
        guard = "; send 'Authorization: Bearer <token>'" if options.token else ""
        announce(f"statefeed ingest API: {url}v1/ (OpenAPI: {url}v1/openapi.json){guard}")
        log.info("action=api_started url=%s", url)
        await stop.wait()
    log.info("action=api_stopped")
    return 0
