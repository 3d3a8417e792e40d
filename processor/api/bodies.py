"""Reading a request's body from Starlette: its media type, its declared length, the
whole of it, or its NDJSON as a stream into :class:`~processor.api.upload.NdjsonItems`.
The checks themselves are :mod:`processor.api.upload`'s, which knows no HTTP server (the
CLI's ``create`` and ``add`` use them too).
"""

from __future__ import annotations

from starlette.requests import Request

from processor.api.problems import bad_request, too_large, unsupported_media
from processor.api.upload import JSON_TYPES, NDJSON_TYPES, NdjsonItems


def media_type(request: Request) -> str:
    """The body's media type, JSON or NDJSON.

    Raises:
        ApiError: 415 for any other type (or none).
    """
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media in JSON_TYPES or media in NDJSON_TYPES:
        return media
    raise unsupported_media(media, ndjson=True)


def declared_length(request: Request, limit: int, option: str) -> None:
    """Refuse a body whose Content-Length is over ``limit`` before reading it.

    Raises:
        ApiError: 413 naming the limit, 400 for a Content-Length that is not a number.
    """
    raw = request.headers.get("content-length")
    if raw is None:
        return
    if not (raw.isascii() and raw.isdigit()):
        raise bad_request(f"Content-Length must be a number, got {raw!r}",
                          field="Content-Length")
    # int() refuses over 4300 digits; a length of over 20 is too large anyway.
    if len(raw.lstrip("0")) > 20 or int(raw) > limit:
        raise too_large(f"the body is {raw} bytes; the limit is {limit} bytes ({option}): "
                        "send the items in several requests, or as NDJSON")


async def read_whole(request: Request, limit: int) -> bytes:
    """The body, up to ``limit`` bytes.

    Raises:
        ApiError: 413 when it is longer.
        ClientDisconnect: the client went away before the end.
    """
    declared_length(request, limit, "--max-body-bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large(f"the body is over {limit} bytes (--max-body-bytes): send the "
                            "items in several requests, or as NDJSON")
    return bytes(body)


async def stream_into(request: Request, lines: NdjsonItems) -> None:
    """Feed the body to ``lines`` as it arrives, and finish it when it ends whole.

    Raises:
        ApiError: as :meth:`NdjsonItems.feed`.
        ClientDisconnect: the client went away before the end.
    """
    declared_length(request, lines.max_bytes, lines.limit_option)
    async for chunk in request.stream():
        if chunk:
            lines.feed(chunk)
    lines.finish()
