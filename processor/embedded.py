"""A uvicorn server run inside a process that owns its signals.

The processor, the demo and the console each serve HTTP from their own event loop
and decide themselves when to stop. uvicorn's own signal handling would take
SIGTERM and SIGINT from them while it serves (and re-raise the signal after
shutting down), so the server they embed handles no signals.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

import uvicorn

from processor.embedded_http import HEADER_TIMEOUT, http_options
from watcher.errors import ConfigError

STARTUP_TIMEOUT = 15.0
STOP_TIMEOUT = 10.0


class EmbeddedServer(uvicorn.Server):
    """uvicorn without its signal handling: the caller stops it (``should_exit``)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def install_signal_handlers(self) -> None:  # uvicorn releases before 0.29
        return


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


def http_url(host: str, port: int) -> str:
    """The address a browser opens: ``http://127.0.0.1:8090/`` (``[::1]`` for IPv6)."""
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/"


@contextlib.asynccontextmanager
async def serving(app: Any, sock: socket.socket, *, what: str,
                  header_timeout: float = HEADER_TIMEOUT,
                  lifespan: Literal["auto", "on", "off"] = "on") -> AsyncIterator[None]:
    """Serve the ASGI ``app`` on the listening ``sock`` for the block (``what`` names it
    in errors): no access log, no server header, the app's lifespan run; stopped, with
    up to 10 s for requests in flight, when the block ends. A connection must send a
    request's headers whole within ``header_timeout`` seconds, and an idle kept-alive
    one is closed after 5 s (:mod:`processor.embedded_http`). ``lifespan="auto"`` serves
    an app of someone else's (a handler under test) that may not speak the lifespan
    protocol.

    Raises:
        RuntimeError: the server did not start (its lifespan failed).
        TimeoutError: it did not start within 15 s.
    """
    server = EmbeddedServer(uvicorn.Config(
        app, log_config=None, log_level="warning", access_log=False, server_header=False,
        proxy_headers=False, lifespan=lifespan, timeout_graceful_shutdown=int(STOP_TIMEOUT),
        **http_options(header_timeout)))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(STARTUP_TIMEOUT):
            while not server.started:
                if task.done():
                    task.result()
                    raise RuntimeError(f"{what}'s web server stopped while starting")
                await asyncio.sleep(0.02)
        yield
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(task, STOP_TIMEOUT + 2)
        sock.close()


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM: what a served verb waits on before it stops."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    return stop
