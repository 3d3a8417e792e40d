"""Spawn over HTTP on every live database: an SDK handler served by uvicorn spawns
through the per-item protocol, the batch protocol and a reduce answer, and a malformed
spawn from a hand-written handler writes nothing and names what is wrong."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import handlers
from processor import AsyncClient, NewItem
from processor.http.batch import BatchingHttpProcessor
from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from tests.support.engine import running
from tests.support.handler_apps import read_request
from tests.support.servers import answered_probe, send_json, serve_app
from watcher import Watcher, WatcherConfig

FAST = {"poll_interval": 0.05, "lease_duration": 3.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.1}


def unpack(item: handlers.Item) -> handlers.Result:
    """Gate 0: the inbox unpacks into its documents (at gate 0); a document goes to 1."""
    if item.id == "inbox":
        count = item.json()["documents"]
        return handlers.Result(gate=1, spawn=[
            handlers.Spawn(f"doc-{n}", {"n": n}) for n in range(count)] + [
            handlers.Spawn("raw", b"\x00\xff", gate=1)])
    return handlers.Result(gate=1, data={"seen": item.json()})


def rank(page: handlers.ReducePage) -> handlers.Reduced:
    """Gate 1 (reduce): counts the items and spawns a report at gate 2."""
    return handlers.Reduced(result={"count": len(page.items)},
                            spawn=[handlers.Spawn("report", {"count": len(page.items)})])


def report(item: handlers.Item) -> handlers.Result:
    return handlers.Result(done=True)


APP = handlers.app({0: unpack, 2: report}, reduce=rank)


@contextlib.asynccontextmanager
async def engine(make_store: Callable[..., Any], processor: Any) -> AsyncIterator[None]:
    watcher = Watcher(make_store(), processor, WatcherConfig(owner_id="w1", **FAST))
    try:
        async with running(watcher):
            yield
    finally:
        await processor.aclose()


@pytest.mark.parametrize("protocol", ["per-item", "batch"])
async def test_an_sdk_handler_spawns_and_its_reduce_spawns_the_next_gate(
        db_url, table_prefix, make_store, protocol: str) -> None:
    async with AsyncClient(db_url, table_prefix) as client, serve_app(APP) as url:
        config = HttpProcessorConfig(handler_url=f"{url}/")
        processor = (HttpProcessor(config) if protocol == "per-item"
                     else BatchingHttpProcessor(config, batch_size=8))
        await client.create_partition("job", [NewItem("inbox", b'{"documents": 12}')],
                                      reduce_gates=[1])
        async with engine(make_store, processor):
            info = await client.wait("job", timeout=60)
        assert info.status == "complete", info
        assert info.spawned == 12 + 1 + 1  # the documents, the raw one, the report
        assert json.loads(info.result or b"") == {"count": 14}
        items = {item.id: item for item in await client.items("job")}
    assert set(items) == {"inbox", "raw", "report", *(f"doc-{n}" for n in range(12))}
    assert items["doc-7"].parent == "inbox" and items["raw"].parent == "inbox"
    assert items["report"].parent is None, "a reduce's items have no parent item"
    assert json.loads(items["doc-7"].data) == {"seen": {"n": 7}}
    assert items["raw"].data == b"\x00\xff"
    assert json.loads(items["report"].data) == {"count": 14}
    assert {item.status for item in items.values()} == {"complete"}


@pytest.mark.parametrize(("spawn", "expected"), [
    ({"id": "a"}, "'spawn' must be an array of new items"),
    ([{"id": "a"}], "spawn[0]: a new item needs its content"),
    (["a"], "spawn[0]: each new item must be an object"),
    ([{"id": "a", "gates": 1, "data": 1}], 'spawn[0]: unknown key "gates"'),
    ([{"id": 5, "data": 1}], "spawn[0]: 'id' must be a string"),
    ([{"id": "a", "data": 1, "data_b64": "AA=="}], "both 'data' and 'data_b64'"),
    ([{"id": "a", "gate": -1, "data": 1}], "'gate' must be an integer"),
    ([{"id": "a", "data": 1}, {"id": "a", "data": 2}], "'a' more than once"),
    ([{"id": "", "data": 1}], "item id must be a non-empty string"),
])
async def test_a_malformed_spawn_over_http_writes_nothing(
        db_url, table_prefix, make_store, spawn: Any, expected: str) -> None:
    async def handler(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await answered_probe(scope, send):
            return
        await read_request(scope, receive)
        await send_json(send, 200, {"done": True, "spawn": spawn})

    async with AsyncClient(db_url, table_prefix) as client, serve_app(handler) as url:
        await client.create_partition("job", [NewItem("parent", b"{}")])
        processor = HttpProcessor(HttpProcessorConfig(handler_url=f"{url}/"))
        watcher = Watcher(make_store(), processor,
                          WatcherConfig(owner_id="w1", max_retries=0, **FAST))
        try:
            async with running(watcher):
                info = await client.wait("job", timeout=30)
        finally:
            await processor.aclose()
        [item] = await client.items("job")
    assert info.status == "failed" and info.spawned == 0
    assert item.status == "failed" and expected in (item.last_error or ""), item.last_error


async def test_a_crawl_over_http_then_a_reduce_counts_every_node(
        db_url, table_prefix, make_store) -> None:
    """A tree four levels deep, each node spawning its children at gate 0 through the
    SDK; the reduce at gate 1 counts the nodes exactly, and from the handler's own log
    no reduce call starts before the last gate-0 call ended."""
    log: list[tuple[str, float]] = []
    crawled: set[str] = set()
    fanout, depth = 3, 3

    def crawl(item: handlers.Item) -> handlers.Result:
        log.append(("start", time.monotonic()))
        level = item.id.count(".")
        children = ([handlers.Spawn(f"{item.id}.{n}", {"level": level + 1})
                     for n in range(fanout)] if level < depth else [])
        crawled.add(item.id)
        log.append(("end", time.monotonic()))
        return handlers.Result(gate=1, spawn=children)

    def count(page: handlers.ReducePage) -> handlers.Reduced:
        log.append(("reduce", time.monotonic()))
        return handlers.Reduced(result={"nodes": len(page.items)})

    app = handlers.app({0: crawl}, reduce=count)
    expected = sum(fanout ** level for level in range(depth + 1))
    async with AsyncClient(db_url, table_prefix) as client, serve_app(app) as url:
        await client.create_partition("site", [NewItem("n", b"{}")], reduce_gates=[1])
        async with engine(make_store, HttpProcessor(HttpProcessorConfig(handler_url=f"{url}/"))):
            info = await client.wait("site", timeout=60)
    assert info.status == "complete" and info.spawned == expected - 1
    assert json.loads(info.result or b"") == {"nodes": expected}
    last_end = max(at for what, at in log if what == "end")
    first_reduce = min(at for what, at in log if what == "reduce")
    # Every node was called; a call may repeat (a lease lost in a stall on a busy
    # machine runs its calls again: at least once), but its spawn lands exactly once.
    assert len(crawled) == expected and sum(what == "end" for what, _ in log) >= expected
    assert first_reduce >= last_end, "the reduce started before the crawl ended"
