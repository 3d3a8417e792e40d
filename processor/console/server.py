"""Serve the console with uvicorn on a socket bound here, so that a bad address or a
busy port is one clear error, and ``--port 0`` prints the port it got."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import uvicorn
from sqlalchemy.exc import SQLAlchemyError

from processor.async_client import AsyncClient
from processor.console.app import create_app, settings_for
from processor.console.security import check_bind
from processor.embedded import EmbeddedServer
from watcher.dburl import DatabaseURL
from watcher.errors import ConfigError, DatabaseError
from watcher.store import require_migrated

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8090
STARTUP_TIMEOUT = 15.0
STOP_TIMEOUT = 10.0


@dataclass(frozen=True)
class ConsoleOptions:
    """Where the console reads and listens: the database and table prefix, the address
    and port (0: any free port), the token (``None``: loopback only) and read-only."""

    db_url: DatabaseURL
    table_prefix: str = ""
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    token: str | None = None
    read_only: bool = False

    def __post_init__(self) -> None:
        """Raises:
            ConfigError: the port is not from 0 to 65535, or the bind needs a token.
        """
        if type(self.port) is not int or not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be from 0 to 65535, got {self.port!r}")
        check_bind(self.host, self.token)


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port``.

    Raises:
        ConfigError: the address does not resolve, or cannot be bound (in use, not
            this machine's); one line saying which.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as error:
        raise ConfigError(f"cannot listen on {host}: {error.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as error:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    sock.setblocking(False)
    return sock


def console_url(host: str, port: int) -> str:
    """The address a browser opens: ``http://127.0.0.1:8090/`` (``[::1]`` for IPv6)."""
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/"


async def check_database(options: ConsoleOptions) -> None:
    """Make sure the database answers and has statefeed's tables.

    Raises:
        DatabaseError: it does not answer (the message has no password), or the
            tables are missing (run ``processor migrate``).
    """
    try:
        await require_migrated(options.db_url, options.table_prefix)
    except (SQLAlchemyError, OSError) as error:
        from processor.service import describe_db_error

        raise DatabaseError(describe_db_error(error, options.db_url)) from None


@contextlib.asynccontextmanager
async def console_running(options: ConsoleOptions, client: AsyncClient | None = None
                          ) -> AsyncIterator[str]:
    """Serve the console for the block; yields its URL.

    ``client`` (optional) is shared with the caller and left open.

    Raises:
        ConfigError: the address cannot be bound.
        RuntimeError: the server did not start.
    """
    sock = listen(options.host, options.port)
    port = sock.getsockname()[1]
    settings = settings_for(options.db_url, options.table_prefix, host=options.host,
                            port=port, token=options.token, read_only=options.read_only)
    server = EmbeddedServer(uvicorn.Config(
        create_app(settings, client), log_config=None, log_level="warning",
        access_log=False, server_header=False, proxy_headers=False, lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(STARTUP_TIMEOUT):
            while not server.started:
                if task.done():
                    task.result()
                    raise RuntimeError("the console's web server stopped while starting")
                await asyncio.sleep(0.02)
        yield console_url(options.host, port)
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(task, STOP_TIMEOUT)
        sock.close()


async def run_console(options: ConsoleOptions, announce: Callable[[str], None]) -> int:
    """``processor console``: check the database, serve until SIGINT or SIGTERM, and
    return the exit status (0).

    Raises:
        ConfigError: the address cannot be bound.
        DatabaseError: the database does not answer or has no statefeed tables.
    """
    await check_database(options)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with console_running(options) as url:
        mode = " (read-only)" if options.read_only else ""
        sign_in = "; sign in with its token" if options.token else ""
        announce(f"statefeed console{mode}: {url}{sign_in}")
        log.info("action=console_started url=%s read_only=%s", url, options.read_only)
        await stop.wait()
    log.info("action=console_stopped")
    return 0
