"""A webhook receiver for the notifications' tests: a raw ASGI app served by uvicorn on
loopback that records every POST (headers and body), verifies its signature, and
answers as the test sets: a status, or a hold (no answer until released)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from processor.notify.signing import EVENT_ID_HEADER, HEADER, verify
from tests.support.servers import read_body, send_json


@dataclass
class Received:
    """One POST the receiver got."""

    headers: dict[str, str]
    body: bytes
    signed: bool  # the signature verified with the receiver's secret

    @property
    def event(self) -> dict[str, Any]:
        return json.loads(self.body)


@dataclass
class Receiver:
    """Records POSTs; answers ``status`` (200 by default), or holds every request
    while ``hold`` is set (a receiver that never answers)."""

    secret: bytes
    status: int = 200
    hold: bool = False
    received: list[Received] = field(default_factory=list)
    released: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        headers = {name.decode().lower(): value.decode() for name, value in scope["headers"]}
        signed = verify(self.secret, headers.get(HEADER.lower(), ""), body, time.time())
        self.received.append(Received(headers, body, signed))
        if self.hold:
            await self.released.wait()
        await send_json(send, self.status, {"ok": self.status < 300})

    def event_ids(self) -> list[str]:
        return [one.headers[EVENT_ID_HEADER.lower()] for one in self.received]

    def accepted(self) -> list[Received]:
        """The POSTs answered 2xx (all of them while the status is 2xx)."""
        return self.received if self.status < 300 else []
