"""Small raw-ASGI handlers for tests: they follow the HTTP handler contract and record calls."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from tests.support.servers import read_body


@dataclass
class Call:
    """One request the handler received."""

    at: float
    partition_id: str
    item_id: str
    gate: int
    attempt: int
    key: str
    body: bytes
    headers: dict[str, str]


@dataclass
class TwoGateHandler:
    """Gate 0 items move to gate 1 (data gets a suffix); gate 1 items complete.

    ``hold`` (when set) makes every call wait until it is set, for tests that
    need items to stay in flight.
    """

    calls: list[Call] = field(default_factory=list)
    hold: asyncio.Event | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] == "GET":
            await _reply(send, 200, {"status": "ok"})
            return
        body = await read_body(receive)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        call = Call(time.monotonic(), headers["x-partition-id"], headers["x-item-id"],
                    int(headers["x-gate"]), int(headers["x-attempt"]),
                    headers["idempotency-key"], body, headers)
        self.calls.append(call)
        if self.hold is not None:
            await self.hold.wait()
        if call.gate == 0:
            await _reply(send, 200, {"gate": 1, "data": {"seen": body.decode() or None}})
        else:
            await _reply(send, 200, {"done": True})


async def _reply(send: Any, status: int, payload: Any) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})
