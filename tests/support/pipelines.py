"""Handler services for the tests of many pipelines on one fleet: real uvicorn apps that
each write their name into the item's data at every gate, so the items' final data say
which service answered each of their gates; routes files that name them; routed
watchers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import handlers
from processor import AsyncClient
from processor.http.config import HttpProcessorConfig
from processor.http.routed import RoutedHttpProcessor
from processor.http.routes import Routes, parse_routes
from tests.support.servers import read_body, send_json, serve_app
from watcher import Watcher, WatcherConfig
from watcher.hooks import Hooks
from watcher.store import Store

FAST = {"poll_interval": 0.05, "lease_duration": 2.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2}


class Service:
    """A handler service: gate 0 moves each item to gate 1, gate 1 completes it; each
    answer adds ``{gate: name}`` to the item's data. ``down`` makes it answer as a proxy
    whose upstream is gone; ``retry_after`` (seconds, when set) makes it answer every
    item call 429 with that ``Retry-After``; :meth:`hold` holds a gate's answers back
    until the event it returns is set."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[tuple[str, int]] = []  # the calls it answered or holds
        self.arrivals: list[float] = []  # when each item call arrived (monotonic)
        self.throttled: list[float] = []  # when it answered each 429 (monotonic)
        self.down = False
        self.retry_after: int | None = None
        self.held: dict[int, asyncio.Event] = {}
        self.app = handlers.app(self.work)

    def hold(self, gate: int) -> asyncio.Event:
        """Hold the answers of ``gate``'s calls until the event returned is set."""
        return self.held.setdefault(gate, asyncio.Event())

    def release(self) -> None:
        """Answer every held call (a server does not stop while a call is held)."""
        for event in self.held.values():
            event.set()

    def in_flight(self, partition_id: str, gate: int) -> int:
        """The calls of ``partition_id`` at ``gate`` it holds now (held gates only)."""
        event = self.held.get(gate)
        return 0 if event is None or event.is_set() else self.calls.count((partition_id, gate))

    async def work(self, item: handlers.Item) -> handlers.Result:
        self.calls.append((item.partition_id, item.gate))
        held = self.held.get(item.gate)
        if held is not None:
            await held.wait()
        data = {**json.loads(item.data or b"{}"), str(item.gate): self.name}
        return (handlers.Result(gate=1, data=data) if item.gate == 0
                else handlers.Result(done=True, data=data))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.down:
            await read_body(receive)
            await send({"type": "http.response.start", "status": 502,
                        "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        if scope["type"] == "http" and scope["method"] == "POST":
            self.arrivals.append(time.monotonic())
            if self.retry_after is not None:
                await read_body(receive)
                self.throttled.append(time.monotonic())
                await send_json(send, 429, {"error": {"message": "too many requests"}},
                                headers=[("retry-after", str(self.retry_after))])
                return
        await self.app(scope, receive, send)

    def partitions(self) -> set[str]:
        return {partition for partition, _ in self.calls}


@contextlib.asynccontextmanager
async def serving(make: Callable[[str], Service] = Service
                  ) -> AsyncIterator[Callable[..., Any]]:
    """Start named services under uvicorn: ``await start("ocr", "rank")`` returns
    ``{name: (Service, url)}``; ``make`` builds each. Every held call is answered
    before the servers stop."""
    started: list[Service] = []
    async with contextlib.AsyncExitStack() as stack:
        def release_all() -> None:
            for service in started:
                service.release()

        stack.callback(release_all)

        async def start(*names: str) -> dict[str, tuple[Service, str]]:
            found = {}
            for name in names:
                service = make(name)
                url = await stack.enter_async_context(serve_app(service))
                started.append(service)
                found[name] = (service, url)
            return found

        yield start


def every_gate(**services: str) -> str:
    """A routes file's text: each pipeline named (keyword) with every gate to its
    service (``"@name"`` placeholders, as :func:`routes_of` fills them in)."""
    return "\n".join(f'[[pipeline]]\nname = "{pipeline}"\n[[pipeline.route]]\ngate = "*"\n'
                     f'url = "@{service}"\n' for pipeline, service in services.items())


def routes_of(text: str, urls: dict[str, tuple[Service, str]]) -> Routes:
    """``text`` (a routes file naming services as ``@name``) with their URLs."""
    return parse_routes(routes_text(text, urls))


def routes_text(text: str, urls: dict[str, tuple[Service, str]]) -> str:
    """``text`` with each ``@name`` replaced by that service's URL."""
    for name, (_, url) in sorted(urls.items(), key=lambda pair: -len(pair[0])):
        text = text.replace(f"@{name}", url)
    return text


def watcher_for(store: Store, routes: Routes, hooks: Hooks | None = None,
                **settings: Any) -> tuple[Watcher, RoutedHttpProcessor]:
    processor = RoutedHttpProcessor(routes, HttpProcessorConfig(handler_url="http://unused/"))
    config = WatcherConfig(**{**FAST, **settings}, pipelines=routes.served())
    return Watcher(store, processor, config, hooks), processor


async def answered_by(client: AsyncClient, partition_id: str) -> set[tuple[str, str]]:
    """Which service answered each gate of the partition's items: {(gate, service)}."""
    return {pair for item in await client.items(partition_id)
            for pair in json.loads(item.data).items()}
