"""Raw-ASGI handlers for tests: how they read a contract request, and a small two-gate handler."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import unquote

from tests.support.servers import answered_probe, read_body, send_json


@dataclass
class Request:
    """One request of the HTTP handler contract, as a handler receives it.

    The ids and the key are percent-decoded; a header that is missing reads as
    empty (a gate of -1, an attempt of 0), so a handler can record a request
    that breaks the contract instead of failing on it.
    """

    partition_id: str
    item_id: str
    gate: int
    attempt: int
    key: str
    body: bytes
    raw_headers: list[tuple[str, str]]

    @property
    def headers(self) -> dict[str, str]:
        """The headers by lower-case name (the last value of a repeated one)."""
        return dict(self.raw_headers)

    def header(self, name: str) -> str | None:
        """The single value of header ``name``.

        Raises:
            AssertionError: the header was sent more than once.
        """
        values = [value for key, value in self.raw_headers if key == name.lower()]
        assert len(values) <= 1, f"header {name} sent {len(values)} times"
        return values[0] if values else None


RequestT = TypeVar("RequestT", bound=Request)


async def read_request(scope: dict[str, Any], receive: Any, kind: type[RequestT] = Request,
                       **extra: Any) -> RequestT:
    """Read a contract request's headers and whole body from ASGI.

    ``kind`` is the class to build (a subclass of :class:`Request` may add the
    fields in ``extra``).

    Raises:
        ValueError: the X-Gate or X-Attempt header is not a whole number.
    """
    body = await read_body(receive)
    raw = [(key.decode("latin-1").lower(), value.decode("latin-1"))
           for key, value in scope["headers"]]
    values = dict(raw)
    return kind(partition_id=unquote(values.get("x-partition-id", "")),
                item_id=unquote(values.get("x-item-id", "")),
                gate=int(values.get("x-gate", "-1")), attempt=int(values.get("x-attempt", "0")),
                key=unquote(values.get("idempotency-key", "")), body=body, raw_headers=raw,
                **extra)


@dataclass
class TwoGateHandler:
    """Gate 0 items move to gate 1 with data ``{"seen": <what arrived>}``; gate 1
    items complete. Every request is kept in ``calls``.

    ``hold`` (when set) makes every call wait until it is set, for tests that
    need items to stay in flight.
    """

    calls: list[Request] = field(default_factory=list)
    hold: asyncio.Event | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await answered_probe(scope, send):
            return
        request = await read_request(scope, receive)
        self.calls.append(request)
        if self.hold is not None:
            await self.hold.wait()
        if request.gate == 0:
            await send_json(send, 200, {"gate": 1, "data": {"seen": request.body.decode() or None}})
        else:
            await send_json(send, 200, {"done": True})
