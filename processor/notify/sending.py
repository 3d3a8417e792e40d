"""One HTTP attempt: POST an event's bytes, signed, to its URL, and say how it went.

Redirects are not followed (a 3xx is a failed attempt: following one would let a
receiver send the processor anywhere). Only the first bytes of the answer are read.
The whole attempt, connecting included, is bounded by the configured timeout.
Nothing here logs; the error text names no URL and no secret.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx

from processor.notify.policy import ANSWER_EXCERPT
from processor.notify.signing import ATTEMPT_HEADER, EVENT_ID_HEADER, HEADER, sign
from processor.observe.redact import redact_url
from processor.observe.safe_text import escape_controls

USER_AGENT = "statefeed-notify/1"


@dataclass(frozen=True)
class Attempt:
    """How an attempt went: ``delivered`` on a 2xx answer, else ``error`` says why."""

    delivered: bool
    error: str | None = None
    status: int | None = None


def client(timeout: float, concurrency: int) -> httpx.AsyncClient:
    """The delivery loop's HTTP client: no redirects, no proxies from the environment,
    at most ``concurrency`` connections."""
    return httpx.AsyncClient(
        follow_redirects=False, trust_env=False, timeout=httpx.Timeout(timeout),
        limits=httpx.Limits(max_connections=concurrency,
                            max_keepalive_connections=concurrency),
        headers={"user-agent": USER_AGENT})


async def post(http: httpx.AsyncClient, url: str, body: bytes, *, secret: bytes,
               event_id: str, attempt: int, timestamp: int, limit: float) -> Attempt:
    """POST ``body`` to ``url`` with its signature at ``timestamp`` (Unix seconds) and
    its event id, within ``limit`` seconds. Never raises for the receiver's or the
    network's failures: they come back as the attempt's error."""
    headers = {"content-type": "application/json", EVENT_ID_HEADER: event_id,
               ATTEMPT_HEADER: str(attempt), HEADER: sign(secret, timestamp, body)}
    try:
        async with asyncio.timeout(limit):
            async with http.stream("POST", url, content=body, headers=headers) as answer:
                excerpt = b""
                async for chunk in answer.aiter_raw():
                    excerpt += chunk
                    if len(excerpt) >= ANSWER_EXCERPT:
                        break
    except TimeoutError:
        return Attempt(False, f"no answer within {limit:g} s")
    except httpx.HTTPError as error:
        detail = escape_controls(str(error).replace(url, redact_url(url)))[:200]
        return Attempt(False, f"{type(error).__name__}: {detail}" if detail
                       else type(error).__name__)
    if 200 <= answer.status_code < 300:
        return Attempt(True, status=answer.status_code)
    text = escape_controls(excerpt[:ANSWER_EXCERPT].decode("utf-8", "replace")).strip()
    return Attempt(False, f"HTTP {answer.status_code}" + (f": {text}" if text else ""),
                   status=answer.status_code)
