"""The HTTP/1.1 protocol of the embedded servers: uvicorn's h11 protocol with a deadline
for a request's headers.

uvicorn closes an idle kept-alive connection (``timeout_keep_alive``), but a
connection that has sent part of a request line or of its headers, or nothing
at all since it opened, is kept for ever: a few hundred such connections hold a
server's file descriptors. Here each connection must finish a request's headers
within :data:`HEADER_TIMEOUT` seconds of opening, or of its first byte after the
previous answer, or is closed. The size of unfinished headers is bounded too
(:data:`MAX_HEADER_BYTES`; more is a 400).

h11 is chosen over httptools (which uvicorn prefers when it is installed) so
that every install runs the same protocol.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT = 10.0
KEEP_ALIVE_TIMEOUT = 5
MAX_HEADER_BYTES = 64 * 1024


class HeaderDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol that closes a connection whose request headers do not
    arrive whole within ``header_timeout`` seconds."""

    header_timeout: float = HEADER_TIMEOUT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._arm()  # the headers are not whole yet: keep (or start) the deadline
        else:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # Between requests the keep-alive timeout applies until the next byte comes.
        self._disarm()

    def _arm(self) -> None:
        if self._header_deadline is None:
            self._header_deadline = self.loop.call_later(self.header_timeout,
                                                         self._headers_too_late)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_too_late(self) -> None:
        self._header_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def protocol_with(header_timeout: float) -> type[HeaderDeadlineProtocol]:
    """The protocol with another header deadline (``header_timeout`` seconds)."""
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,),
                {"header_timeout": header_timeout})


def http_options(header_timeout: float = HEADER_TIMEOUT) -> dict[str, Any]:
    """The ``uvicorn.Config`` options of every embedded server: this protocol, the
    header size bound and the keep-alive timeout."""
    return {"http": protocol_with(header_timeout),
            "h11_max_incomplete_event_size": MAX_HEADER_BYTES,
            "timeout_keep_alive": KEEP_ALIVE_TIMEOUT}
