"""Serve ASGI apps with a real uvicorn on loopback for tests, and the raw-ASGI I/O they share."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import uvicorn


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.asynccontextmanager
async def serve_app(app: Any, *, port: int | None = None, startup_timeout: float = 10.0,
                    certfile: Path | None = None, keyfile: Path | None = None,
                    abrupt: bool = False) -> AsyncIterator[str]:
    """Run ``app`` under uvicorn on 127.0.0.1 inside the current event loop.

    Yields the base URL: ``http://127.0.0.1:PORT``, or ``https://`` when a
    certificate and key are given. ``abrupt``: the server stops as a crash would
    (its connections closed at once, requests in flight cut off), not gracefully.

    Raises:
        TimeoutError: the server did not start within ``startup_timeout`` seconds,
            or did not stop within 10 s of being asked to.
        Exception: whatever made the server fail to start.
    """
    port = port or free_port()
    tls = {} if certfile is None else {"ssl_certfile": str(certfile),
                                       "ssl_keyfile": str(keyfile)}
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                            lifespan="off", access_log=False, **tls)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(startup_timeout):
            while not server.started:
                if task.done():
                    task.result()  # re-raise the start-up failure
                await asyncio.sleep(0.01)
        yield f"{'http' if certfile is None else 'https'}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        server.force_exit = abrupt
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=10)


async def read_body(receive: Any) -> bytes:
    """Read a whole ASGI request body."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def answered_probe(scope: dict[str, Any], send: Any) -> bool:
    """Whether the request is not an item call and was dealt with here: a non-HTTP
    event (ignored) or a ``GET`` health probe (answered ``{"status": "ok"}``)."""
    if scope["type"] != "http":
        return True
    if scope["method"] == "GET":
        await send_json(send, 200, {"status": "ok"})
        return True
    return False


async def send_json(send: Any, status: int, payload: Any,
                    headers: Iterable[tuple[str, str]] = ()) -> None:
    """Answer an ASGI request with ``payload`` as JSON (bytes are sent as they are).

    The body is sized (``Content-Length``), so the client reads it in one piece.
    """
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            *((name.encode(), value.encode()) for name, value in headers)]})
    await send({"type": "http.response.body", "body": body})
