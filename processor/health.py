"""The health and metrics endpoints: ``/healthz``, ``/readyz`` and ``/metrics``.

A raw ASGI app, so it adds no web framework to the processor. ``/readyz``
answers 503 while the database, or the handler's health URL, does not answer
(``processor run`` checks ``<handler-url>/healthz`` unless told another URL, or
``off``; a handler that serves no such route counts as healthy while it answers).
:class:`HandlerHealthCheck` is the handler's check: a ``GET``
through the same sender (connections, TLS, headers) as the item calls.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from processor.http.transports import TransportError
from watcher.text import error_text

if TYPE_CHECKING:
    from processor.http.transports import Sender

Check = Callable[[], Awaitable[tuple[bool, str]]]
CHECK_TIMEOUT = 5.0
# What a handler without the route answers a guessed health URL.
NO_HEALTH_ROUTE = (404, 405)


class HandlerHealthCheck:
    """GETs the handler's health URL through ``sender``; healthy on a 2xx answer.

    ``url`` is the URL to send (without userinfo), ``shown_url`` its redacted
    form for the detail text, ``headers`` the ones to add to the sender's (such
    as the Basic authentication of the health URL), and ``mask`` hides secrets
    in the detail of an unexpected failure. ``optional``: the URL was guessed
    (``<handler-url>/healthz``), so a 404 or 405 (no such route) counts as
    healthy: the handler answered. No answer, or a 5xx, is unhealthy either way.
    """

    def __init__(self, sender: Sender, url: str, *, shown_url: str,
                 headers: Mapping[str, str], timeout: float,
                 mask: Callable[[str], str], optional: bool = False) -> None:
        self._sender = sender
        self._optional = optional
        self._url = url
        self._shown_url = shown_url
        self._headers = dict(headers)
        self._timeout = timeout
        self._mask = mask

    async def __call__(self) -> tuple[bool, str]:
        """``(healthy, detail)``: ``True`` on a 2xx answer. Never raises."""
        shown = self._shown_url
        try:
            async with asyncio.timeout(self._timeout):
                status = (await self._sender.probe(self._url, self._headers,
                                                   shown_url=shown)).status
        except TimeoutError:
            return False, f"no answer from {shown} within {self._timeout} s"
        except TransportError as error:
            return False, self._mask(f"{type(error).__name__}: {error.reason}")
        except Exception as error:  # a health check reports, it never raises
            return False, self._mask(f"{shown}: {error_text(error)}")
        if self._optional and status in NO_HEALTH_ROUTE:
            return True, (f"{shown} answered HTTP {status}: the handler serves no health "
                          "route there, so only its answering counts (--handler-health-url "
                          "names one)")
        return 200 <= status < 300, f"{shown} answered HTTP {status}"


class HealthApp:
    """ASGI app serving liveness, readiness and Prometheus metrics."""

    def __init__(self, *, checks: Mapping[str, Check], metrics: Callable[[], bytes],
                 before_metrics: Callable[[], Awaitable[None]] | None = None) -> None:
        self.checks = checks
        self.metrics = metrics
        # Brings gauges that went stale while nobody scraped up to date first.
        self.before_metrics = before_metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path = scope["path"]
        if scope["method"] not in ("GET", "HEAD"):
            await _send(send, 405, b'{"error":"method not allowed"}')
        elif path == "/healthz":
            await _send(send, 200, b'{"status":"ok"}')
        elif path == "/readyz":
            results = await self._run_checks()
            ready = all(ok for ok, _ in results.values())
            body = {"status": "ready" if ready else "not ready",
                    "checks": {name: {"ok": ok, "detail": detail}
                               for name, (ok, detail) in results.items()}}
            await _send(send, 200 if ready else 503, json.dumps(body).encode())
        elif path == "/metrics":
            if self.before_metrics is not None:
                await self.before_metrics()
            await _send(send, 200, self.metrics(), "text/plain; version=0.0.4; charset=utf-8")
        else:
            await _send(send, 404, b'{"error":"not found"}')

    async def _run_checks(self) -> dict[str, tuple[bool, str]]:
        async def guarded(check: Check) -> tuple[bool, str]:
            try:
                async with asyncio.timeout(CHECK_TIMEOUT):
                    return await check()
            except TimeoutError:
                return False, f"no answer within {CHECK_TIMEOUT} s"
            except Exception as error:
                return False, type(error).__name__
        names = list(self.checks)
        outcomes = await asyncio.gather(*(guarded(self.checks[name]) for name in names))
        return dict(zip(names, outcomes, strict=True))


async def _send(send: Any, status: int, body: bytes,
                content_type: str = "application/json") -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type.encode()),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
