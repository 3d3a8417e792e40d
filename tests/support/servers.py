"""Serve ASGI apps with a real uvicorn on loopback for tests."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import uvicorn


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.asynccontextmanager
async def serve_app(app, *, port: int | None = None, startup_timeout: float = 10.0
                    ) -> AsyncIterator[str]:
    """Run ``app`` under uvicorn on 127.0.0.1 inside the current event loop.

    Yields the base URL (``http://127.0.0.1:PORT``). Raises ``TimeoutError`` when
    the server does not start within ``startup_timeout`` seconds.
    """
    port = port or free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                            lifespan="off", access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(startup_timeout):
            while not server.started:
                if task.done():
                    task.result()  # re-raise the start-up failure
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=10)


async def read_body(receive) -> bytes:
    """Read a whole ASGI request body."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body
