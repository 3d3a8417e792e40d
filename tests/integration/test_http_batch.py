"""The batch handler protocol end to end: watcher -> BatchingHttpProcessor -> real uvicorn."""

from __future__ import annotations

import json
from typing import Any

import handlers
from processor import AsyncClient, NewItem
from processor.http_batch import BatchingHttpProcessor
from processor.http_processor import HttpProcessorConfig
from tests.support.engine import running
from tests.support.servers import read_body, serve_app
from watcher import Watcher, WatcherConfig

FAST = {"poll_interval": 0.05, "lease_duration": 3.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2}


class Counting:
    """ASGI middleware counting requests per path."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.paths: list[str] = []

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            self.paths.append(scope["path"])
        await self.app(scope, receive, send)


def two_gates(item: handlers.Item) -> handlers.Result:
    if item.id == "poison":
        raise handlers.Fail(f"cannot read {item.id}")
    if item.gate == 0:
        return handlers.Result(gate=1, data={"len": len(item.data)})
    return handlers.Result(done=True)


async def test_batches_carry_many_items_per_request(db_url, table_prefix, make_store) -> None:
    app = Counting(handlers.app(two_gates))
    async with AsyncClient(db_url, table_prefix) as client, serve_app(app) as url:
        await client.create_partition("p", [NewItem(f"i{n:03}", b"x" * n) for n in range(60)])
        http = BatchingHttpProcessor(HttpProcessorConfig(handler_url=f"{url}/"), batch_size=25)
        watcher = Watcher(make_store(), http, WatcherConfig(owner_id="b", concurrency=50,
                                                            **FAST))
        try:
            async with running(watcher):
                info = await client.wait("p", timeout=30)
        finally:
            await http.aclose()
        assert info.status == "complete" and info.counts == {"complete": 60}
        items = {item.id: item for item in await client.items("p")}
    assert items["i007"].data == json.dumps({"len": 7}, separators=(",", ":")).encode()
    assert set(app.paths) == {"/batch"}
    assert len(app.paths) <= 60 * 2 // 10, f"{len(app.paths)} requests for 120 item steps"


async def test_an_error_entry_fails_only_its_item(db_url, table_prefix, make_store) -> None:
    app = handlers.app(two_gates)
    async with AsyncClient(db_url, table_prefix) as client, serve_app(app) as url:
        await client.create_partition("p", [NewItem("ok", b"1"), NewItem("poison", b"2")])
        http = BatchingHttpProcessor(HttpProcessorConfig(handler_url=url), batch_size=10)
        watcher = Watcher(make_store(), http, WatcherConfig(owner_id="b", **FAST))
        try:
            async with running(watcher):
                info = await client.wait("p", timeout=30)
        finally:
            await http.aclose()
        items = {item.id: item for item in await client.items("p")}
    assert info.status == "failed"
    assert items["poison"].status == "failed" and items["poison"].attempts == 1
    assert "cannot read poison" in items["poison"].last_error
    assert "'poison'" in items["poison"].last_error, "the error names its own item"
    assert (items["ok"].status, items["ok"].gate) == ("available", 1)


async def test_a_malformed_batch_answer_is_an_error_of_every_item(db_url, table_prefix,
                                                                  make_store) -> None:
    calls: list[int] = []

    async def short_answer(scope, receive, send) -> None:
        body = await read_body(receive)
        entries = json.loads(body)
        calls.append(len(entries))
        answer = [{"done": True}] * (len(entries) - 1)  # one result short
        if len(calls) > 2:
            answer = [{"done": True}] * len(entries)  # fixed after two bad answers
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": json.dumps(answer).encode()})

    async with AsyncClient(db_url, table_prefix) as client, serve_app(short_answer) as url:
        await client.create_partition("p", [NewItem(f"i{n}", b"") for n in range(3)])
        http = BatchingHttpProcessor(HttpProcessorConfig(handler_url=url), batch_size=10,
                                     batch_url=f"{url}/custom-batch")
        watcher = Watcher(make_store(), http, WatcherConfig(owner_id="b", max_retries=5,
                                                            **FAST))
        try:
            async with running(watcher):
                info = await client.wait("p", timeout=30)
        finally:
            await http.aclose()
        items = await client.items("p")
    assert info.status == "complete"
    assert calls[0] == 3, "the three items went out together"
    # The short answer failed all three (each came back at least once more), not just one.
    assert sum(calls[1:]) >= 3
    assert all(item.attempts == 0 for item in items)


async def test_batch_errors_name_each_item(db_url, table_prefix, make_store) -> None:
    """A whole-batch failure (connection refused) is recorded against every item by name."""
    from tests.support.servers import free_port

    async with AsyncClient(db_url, table_prefix) as client:
        await client.create_partition("p", [NewItem("a", b""), NewItem("b", b"")])
        http = BatchingHttpProcessor(
            HttpProcessorConfig(handler_url=f"http://127.0.0.1:{free_port()}/"), batch_size=10)
        watcher = Watcher(make_store(), http, WatcherConfig(owner_id="b", max_retries=0,
                                                            **FAST))
        try:
            async with running(watcher):
                info = await client.wait("p", timeout=30)
        finally:
            await http.aclose()
        items = {item.id: item for item in await client.items("p")}
    assert info.status == "failed"
    for name in ("a", "b"):
        assert items[name].status == "failed"
        assert f"item {name!r}" in items[name].last_error
        assert "batch request failed" in items[name].last_error
