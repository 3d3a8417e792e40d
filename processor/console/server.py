"""Serve the console with uvicorn on a socket bound here, so that a bad address or a
busy port is one clear error, and ``--port 0`` prints the port it got."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from sqlalchemy.exc import SQLAlchemyError

from processor.client.async_client import AsyncClient
from processor.console.app import create_app, settings_for
from processor.console.item_page import check_api_url
from processor.console.security import check_bind
from processor.embedded import http_url, listen, serving, stop_on_signals
from processor.feed.hub import FeedHub
from processor.notify.targets import check_url
from watcher.errors import ConfigError, DatabaseError
from watcher.store import require_migrated
from watcher.store.db.urls import DatabaseURL

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8090


@dataclass(frozen=True)
class ConsoleOptions:
    """Where the console reads and listens: the database and table prefix, the address
    and port (0: any free port), the token (``None``: loopback only), read-only, and
    the ingest API's public base URL (completion URLs start with it), and the
    processors' default notify URL (a cancel's event goes there)."""

    db_url: DatabaseURL
    table_prefix: str = ""
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    token: str | None = None
    read_only: bool = False
    api_url: str | None = None
    notify_default: str | None = None

    def __post_init__(self) -> None:
        """Raises:
            ConfigError: the port is not from 0 to 65535, the bind needs a token, or
                the API URL is not an http(s) URL.
            InvalidInputError: the default notify URL is not an http(s) URL.
        """
        if type(self.port) is not int or not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be from 0 to 65535, got {self.port!r}")
        check_bind(self.host, self.token)
        object.__setattr__(self, "api_url", check_api_url(self.api_url))
        check_url("--notify-url (PROCESSOR_NOTIFY_URL)", self.notify_default)


async def check_database(db_url: DatabaseURL, table_prefix: str) -> None:
    """Make sure the database answers and has statefeed's tables.

    Raises:
        DatabaseError: it does not answer (the message has no password), or the
            tables are missing (run ``processor migrate``).
    """
    try:
        await require_migrated(db_url, table_prefix)
    except (SQLAlchemyError, OSError) as error:
        from processor.service import describe_db_error

        raise DatabaseError(describe_db_error(error, db_url)) from None


@contextlib.asynccontextmanager
async def console_running(options: ConsoleOptions, client: AsyncClient | None = None,
                          feed: FeedHub | None = None) -> AsyncIterator[str]:
    """Serve the console for the block; yields its URL.

    ``client`` (optional) is shared with the caller and left open; ``feed`` is the live
    feed's hub (one of its own when not given). The partition pages' live feeds end when
    the block does (they would hold the server open).

    Raises:
        ConfigError: the address cannot be bound.
        RuntimeError: the server did not start.
    """
    sock = listen(options.host, options.port)
    port = sock.getsockname()[1]
    settings = settings_for(options.db_url, options.table_prefix, host=options.host,
                            port=port, token=options.token, read_only=options.read_only,
                            api_url=options.api_url,
                            notify_default=options.notify_default)
    hub = feed or FeedHub()
    async with serving(create_app(settings, client, hub), sock, what="the console"):
        try:
            yield http_url(options.host, port)
        finally:
            await hub.close()


async def run_console(options: ConsoleOptions, announce: Callable[[str], None]) -> int:
    """``processor console``: check the database, serve until SIGINT or SIGTERM, and
    return the exit status (0).

    Raises:
        ConfigError: the address cannot be bound.
        DatabaseError: the database does not answer or has no statefeed tables.
    """
    await check_database(options.db_url, options.table_prefix)
    stop = stop_on_signals()
    async with console_running(options) as url:
        mode = " (read-only)" if options.read_only else ""
        sign_in = "; sign in with its token" if options.token else ""
        announce(f"statefeed console{mode}: {url}{sign_in}")
        log.info("action=console_started url=%s read_only=%s", url, options.read_only)
        await stop.wait()
    log.info("action=console_stopped")
    return 0
