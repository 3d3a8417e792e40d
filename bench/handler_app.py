"""The minimal handler every HTTP scenario calls: raw ASGI, served by uvicorn in its own process.

It follows the handler contract and does as little as possible, so the
figures measure the callers, not the handler:

- ``POST /`` (any path but the ones below): reads the body, answers
  ``{"done":true}``. A body ``loop:<seconds>`` sleeps that long and answers
  ``{}`` instead (run again at the same gate), which keeps partitions busy
  forever (the failover scenario).
- ``POST /batch``: a JSON array of items, answered with as many ``{"done":true}``.
- ``GET /stats``: items and requests answered since the last reset, and the
  ``time.monotonic()`` of the first request's arrival and of the last answer
  (one clock for every process on the machine), so every caller is timed the
  same way, at the handler.
- ``POST /reset``: zero the counters. Any other ``GET``: ``{"status":"ok"}``.

    python -m bench.handler_app --port 8123
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

_DONE = b'{"done":true}'
_JSON = [(b"content-type", b"application/json")]


class Counters:
    """What the handler answered since the last reset."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Zero everything."""
        self.items = 0
        self.requests = 0
        self.first: float | None = None
        self.last: float | None = None

    def as_json(self) -> bytes:
        """The counters as a JSON object."""
        return json.dumps({"items": self.items, "requests": self.requests,
                           "first": self.first, "last": self.last}).encode()


counters = Counters()


async def _body(receive: Any) -> bytes:
    chunks = []
    more = True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(chunks)


async def _send(send: Any, body: bytes, status: int = 200) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*_JSON, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The ASGI app (see the module docstring)."""
    if scope["type"] != "http":
        return
    path = scope["path"]
    if scope["method"] == "GET":
        await _send(send, counters.as_json() if path == "/stats" else b'{"status":"ok"}')
        return
    arrived = time.monotonic()
    if counters.first is None:
        counters.first = arrived
    body = await _body(receive)
    if path == "/reset":
        counters.reset()
        await _send(send, b"{}")
        return
    if path == "/batch":
        count = len(json.loads(body))
        answer = b"[" + b",".join([_DONE] * count) + b"]"
    else:
        count = 1
        answer = _DONE
        if body.startswith(b"loop:"):
            await asyncio.sleep(float(body[5:]))
            answer = b"{}"
    counters.items += count
    counters.requests += 1
    counters.last = time.monotonic()
    await _send(send, answer)


def serve(asgi_app: Any, description: str) -> None:
    """Serve ``asgi_app`` on 127.0.0.1:<--port> until terminated (every benchmark handler)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    import uvicorn

    # Pinned to the pure-Python stack (asyncio loop, h11), whatever else is installed
    # (PGQueuer pulls in uvloop), so figures compare across machines and runs.
    uvicorn.run(asgi_app, host="127.0.0.1", port=args.port, loop="asyncio", http="h11",
                log_level="warning", access_log=False, lifespan="off")


def main() -> None:
    """Serve the app on 127.0.0.1:<--port> until terminated."""
    serve(app, "the benchmark's minimal handler")


if __name__ == "__main__":
    main()
