"""The ASGI responses of a handler app: a sized JSON body, an answer with its
``Retry-After``, and a 405 naming the allowed method."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeAlias

from handlers.wire.contract import (
    encode_error,
    retry_after_header,
)

Scope: TypeAlias = dict[str, Any]
Receive: TypeAlias = Callable[[], Awaitable[dict[str, Any]]]
Send: TypeAlias = Callable[[dict[str, Any]], Awaitable[None]]

JSON_HEADER: Final = (b"content-type", b"application/json")


class Answer:
    """One item's answer: status, JSON body, and the delay asked for (if any)."""

    __slots__ = ("body", "retry_after", "status")

    def __init__(self, status: int, body: bytes, retry_after: float | None = None) -> None:
        self.status = status
        self.body = body
        self.retry_after = retry_after


async def respond(send: Send, status: int, body: bytes,
                   extra: tuple[bytes, bytes] | None = None) -> None:
    headers = [JSON_HEADER, (b"content-length", str(len(body)).encode("ascii"))]
    if extra is not None:
        headers.append(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_answer(send: Send, answer: Answer) -> None:
    """Send ``answer``, with a ``Retry-After`` header when it asks for a delay."""
    if answer.retry_after is not None:
        await respond(send, answer.status, answer.body,
                       (b"retry-after", retry_after_header(answer.retry_after)))
    else:
        await respond(send, answer.status, answer.body)


async def method_not_allowed(send: Send, method: str, path: str, allow: bytes) -> None:
    await respond(send, 405, encode_error(
        f"method {method} is not allowed on {path}; use {allow.decode('ascii')}",
        no_retry=True), (b"allow", allow))
