"""A partition to follow live: a handler holding each gate until the test opens it, the
ingest API on a feed hub, and a watcher running the partition (the feed's tests); and
the same gates in library mode (a watcher calling Python functions, no HTTP)."""

from __future__ import annotations

import asyncio
import contextlib
import json
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
from watcher.protocol import ReduceCall, ReduceResult, Result, WorkItem
from watcher.store import Store
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


class LibraryGates:
    """The gates in library mode: an item moves from gate g to g + 1 once the test opens
    g; :data:`LAST_GATE` is a reduce gate whose one call, once opened, completes every
    item with the partition's result ``{"items": n}``."""

    def __init__(self) -> None:
        self.gates = {gate: asyncio.Event() for gate in range(LAST_GATE + 1)}

    def open(self, gate: int) -> None:
        self.gates[gate].set()

    async def process(self, item: WorkItem) -> Result:
        await self.gates[item.gate].wait()
        return Result(gate=item.gate + 1)

    async def reduce(self, call: ReduceCall) -> ReduceResult:
        await self.gates[call.gate].wait()
        return ReduceResult(result=json.dumps({"items": len(call.items)},
                                             separators=(",", ":")).encode())


@contextlib.asynccontextmanager
async def library_watcher(db_url: str, table_prefix: str) -> AsyncIterator[LibraryGates]:
    """A watcher in library mode on :class:`LibraryGates`, running for the block (create
    partitions with ``reduce_gates=(LAST_GATE,)``)."""
    gates = LibraryGates()
    store = Store.open(db_url, table_prefix)
    watcher = Watcher(store, gates.process, WatcherConfig(
        owner_id="feed-lib", concurrency=8, poll_interval=0.05, lease_duration=5),
        reduce=gates.reduce)
    try:
        async with running(watcher):
            try:
                yield gates
            finally:
                for gate in gates.gates:  # calls held would hold the watcher's stop
                    gates.open(gate)
    finally:
        await store.close()
