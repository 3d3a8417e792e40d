"""A partition to follow live: a handler holding each gate until the test opens it, the
ingest API on a feed hub, and a watcher running the partition (the feed's tests)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import unquote

from processor import AsyncClient
from processor.api.server import ApiOptions, api_running
from processor.feed.hub import FeedHub
from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from tests.support.engine import running
from tests.support.servers import answered_probe, read_body, send_json, serve_app
from watcher import Watcher, WatcherConfig
from watcher.store.db.urls import parse_database_url

LAST_GATE = 2


class HeldGates:
    """Moves each item from gate g to g + 1 up to :data:`LAST_GATE`, where it completes
    (or fails, for an item named ``bad``); the calls at gate g wait until ``open(g)``."""

    def __init__(self) -> None:
        self.gates = {gate: asyncio.Event() for gate in range(LAST_GATE + 1)}

    def open(self, gate: int) -> None:
        self.gates[gate].set()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await answered_probe(scope, send):
            return
        await read_body(receive)
        headers = dict(scope["headers"])
        gate = int(headers[b"x-gate"])
        await self.gates[gate].wait()
        if gate < LAST_GATE:
            await send_json(send, 200, {"gate": gate + 1})
        elif unquote(headers[b"x-item-id"].decode()) == "bad":
            await send_json(send, 200, {"error": {"message": "bad item", "no_retry": True}})
        else:
            await send_json(send, 200, {"done": True, "data": {"ok": True}})


@contextlib.asynccontextmanager
async def system(db_url: str, table_prefix: str, hub: FeedHub, **options: Any
                 ) -> AsyncIterator[tuple[str, HeldGates, AsyncClient]]:
    """The API (on ``hub``; ``options``: :class:`ApiOptions`'), a handler holding every
    gate, and a watcher running it."""
    handler = HeldGates()
    options.setdefault("port", 0)
    api_options = ApiOptions(parse_database_url(db_url), table_prefix, **options)
    async with (serve_app(handler) as handler_url, AsyncClient(db_url, table_prefix) as client,
                api_running(api_options, client, hub) as api_url):
        http = HttpProcessor(HttpProcessorConfig(handler_url=f"{handler_url}/"))
        watcher = Watcher(client.store, http, WatcherConfig(
            owner_id="feed", concurrency=8, poll_interval=0.05, lease_duration=5))
        try:
            async with running(watcher):
                try:
                    yield api_url, handler, client
                finally:
                    for gate in handler.gates:  # calls held would hold the watcher's stop
                        handler.open(gate)
        finally:
            await http.aclose()
