"""Reduce requests and the handler SDK's request limit agree, to the byte; against the
SDK served by uvicorn on loopback, on real SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

import handlers
from handlers import Item, Reduce, Result
from handlers.asgi import DEFAULT_MAX_BODY_BYTES
from processor import AsyncClient, NewItem
from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from tests.support.engine import running
from tests.support.servers import serve_app
from watcher import Watcher, WatcherConfig
from watcher.config import DEFAULT_REDUCE_PAGE_BYTES

FAST = {"poll_interval": 0.05, "lease_duration": 3.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2, "shutdown_timeout": 5.0}
WAIT = 60.0
LIMIT = 64 * 1024  # the SDK's max_body_bytes and the processor's reduce_page_bytes


def test_the_processor_and_the_sdk_default_to_the_same_request_limit() -> None:
    assert DEFAULT_REDUCE_PAGE_BYTES == DEFAULT_MAX_BODY_BYTES


class RequestSizes:
    """An ASGI wrapper that records the size of each reduce request the app gets."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.sizes: list[int] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/reduce" and scope["method"] == "POST":
            headers = dict(scope["headers"])
            self.sizes.append(int(headers[b"content-length"]))
        await self.app(scope, receive, send)


@contextlib.asynccontextmanager
async def engine(make_store: Callable[..., Any], app: Any, **config: Any
                 ) -> AsyncIterator[str]:
    async with serve_app(app) as url:
        processor = HttpProcessor(HttpProcessorConfig(handler_url=url + "/"))
        watcher = Watcher(make_store(), processor, WatcherConfig(owner_id="w", **config,
                                                                 **FAST))
        try:
            async with running(watcher):
                yield url
        finally:
            await processor.aclose()


def never(item: Item) -> Result:
    raise AssertionError("items start at the reduce gate")


def keep_text(accumulator: Any, items: list[Item]) -> Any:
    """A fold whose accumulator is large (about 2 KiB, with non-ASCII text)."""
    return {"seen": (accumulator or {"seen": 0})["seen"] + len(items), "pad": "é" * 1000}


def mark(accumulator: Any, items: list[Item]) -> dict[str, Result]:
    return {item.id: Result(done=True, data={"seen": accumulator["seen"]}) for item in items}


@pytest.mark.parametrize("limit_from", ["processor", "handler"])
async def test_reduce_pages_fill_up_to_the_sdk_limit_and_never_past_it(
        db_url: str, table_prefix: str, make_store: Callable[..., Any], limit_from: str
        ) -> None:
    """Item data counts as base64, with the accumulator and the envelope: every page of a
    gate cut by bytes is taken by an SDK whose body limit is the page limit (set on the
    processor, or said by the SDK itself), and the fullest page comes within one item
    of that limit."""
    sizes = RequestSizes(handlers.app(never, reduce=Reduce(fold=keep_text, apply=mark),
                                      max_body_bytes=LIMIT))
    data = b"\x00\xff" * 1500  # 3000 bytes: 4000 as base64
    async with AsyncClient(db_url, table_prefix) as client:
        await client.create_partition("p", [NewItem(f"i{n:03}", data, 1) for n in range(60)],
                                      reduce_gates=[1])
        page_bytes = {"reduce_page_bytes": LIMIT} if limit_from == "processor" else {}
        async with engine(make_store, sizes, reduce_page_items=1000, **page_bytes):
            info = await client.wait("p", timeout=WAIT)
        items = await client.items("p")
    assert info.status == "complete", info.last_error
    assert {json.loads(item.data)["seen"] for item in items} == {60}
    assert len(sizes.sizes) >= 4  # a fold and an apply pass of two pages or more
    assert max(sizes.sizes) <= LIMIT
    assert max(sizes.sizes) > LIMIT - 4200  # full: one more item would not have fit


async def test_the_sdk_takes_a_body_at_its_limit_and_refuses_one_byte_more() -> None:
    """The other side of the boundary: the SDK's limit is inclusive, as the page cut's."""
    app = handlers.app(never, reduce=Reduce(fold=keep_text, apply=mark), max_body_bytes=LIMIT)
    body = {"partition_id": "p", "gate": 1, "attempt": 1, "pass": "all", "page": 0,
            "last": True, "idempotency_key": "k", "accumulator": None,
            "items": [{"item_id": "a", "status": "available", "gate": 1,
                       "last_error": None, "data_b64": ""}]}
    encoded = json.dumps(body, separators=(",", ":")).encode()
    padded = encoded[:-1] + b" " * (LIMIT - len(encoded)) + b"}"  # JSON allows the spaces
    assert len(padded) == LIMIT
    async with serve_app(app) as url, httpx.AsyncClient() as http:
        taken = await http.post(url + "/reduce", content=padded,
                                headers={"content-type": "application/json"})
        refused = await http.post(url + "/reduce", content=padded[:-1] + b" }",
                                  headers={"content-type": "application/json"})
    assert taken.status_code == 200, taken.text
    assert refused.status_code == 413


async def test_a_failed_item_over_the_size_limit_reaches_the_reduce_without_its_data(
        db_url: str, table_prefix: str, make_store: Callable[..., Any]) -> None:
    """An item stored around the client's limit fails for its size at gate 0; the reduce
    (on_item_failure="continue") sees it failed, with its error and no data."""
    seen: list[tuple[str, str, int, str | None]] = []

    def record(page: handlers.ReducePage) -> handlers.Reduced:
        seen.extend((item.id, item.status, len(item.data), item.last_error)
                    for item in page.items)
        return handlers.Reduced(result={"n": len(page.items)})

    app = handlers.app(lambda item: Result(gate=1), reduce=record)
    async with AsyncClient(db_url, table_prefix, max_item_bytes=100_000) as client:
        await client.create_partition("p", [NewItem("big", b"x" * 90_000),
                                            NewItem("small", b"y")],
                                      reduce_gates=[1], on_item_failure="continue")
        async with engine(make_store, app, max_item_bytes=50_000):
            info = await client.wait("p", timeout=WAIT)
    assert info.status == "complete", info.last_error
    by_id = {item_id: (status, size, error) for item_id, status, size, error in seen}
    assert by_id["small"] == ("available", 1, None)
    status, size, error = by_id["big"]
    assert (status, size) == ("failed", 0)
    assert "90000 bytes, over the item size limit of 50000" in (error or "")


# -- a whole-gate reduce and a gate larger than a page: found before item work --


def rank_all(page: handlers.ReducePage) -> handlers.Reduced:
    """docs/reference/handler-sdk.md's first reduce: a plain function that takes the whole gate."""
    scored = sorted(page.items, key=lambda item: -item.json()["score"])
    return handlers.Reduced(result={"top": [item.id for item in scored[:3]]})


async def test_a_whole_gate_reduce_and_a_gate_over_a_page_fail_before_any_item_work(
        db_url: str, table_prefix: str, make_store: Callable[..., Any]) -> None:
    """The handler SDK page's one-call reduce with more items than --reduce-page-items: the
    partition fails when it is first leased, with the fix in its error, and the item
    handler is never called; a partition that fits one page is reduced as before."""
    calls: list[str] = []

    def score(item: Item) -> Result:
        calls.append(item.id)
        return Result(gate=1, data={"score": item.json()})

    app = handlers.app({0: score}, reduce=rank_all)
    async with AsyncClient(db_url, table_prefix) as client:
        await client.create_partition("big", [NewItem(f"i{n:02}", json.dumps(n).encode())
                                              for n in range(8)], reduce_gates=[1])
        await client.create_partition("small", [NewItem(f"i{n:02}", json.dumps(n).encode())
                                                for n in range(5)], reduce_gates=[1])
        async with engine(make_store, app, reduce_page_items=5):
            big = await client.wait("big", timeout=WAIT)
            small = await client.wait("small", timeout=WAIT)
    assert big.status == "failed" and big.gate == 0
    assert big.counts == {"available": 8}
    error = big.last_error or ""
    assert "has 8 items" in error and "handlers.Reduce(fold=..., apply=...)" in error, error
    assert "--reduce-page-items" in error, error
    assert small.status == "complete" and small.result_json() == {"top": ["i04", "i03", "i02"]}
    assert sorted(calls) == [f"i{n:02}" for n in range(5)]  # only the small partition's


async def test_the_sdk_says_what_its_reduce_takes() -> None:
    whole = handlers.app(never, reduce=rank_all, max_body_bytes=1234)
    paged = handlers.app(never, reduce=Reduce(fold=keep_text, apply=mark))
    none = handlers.app(never)
    async with serve_app(whole) as w, serve_app(paged) as p, serve_app(none) as n, \
            httpx.AsyncClient() as http:
        assert (await http.get(w + "/reduce")).json() == {"pages": False,
                                                          "max_body_bytes": 1234}
        assert (await http.get(p + "/reduce")).json() == {
            "pages": True, "max_body_bytes": DEFAULT_MAX_BODY_BYTES}
        assert (await http.get(n + "/reduce")).status_code == 405


async def test_an_item_no_request_can_carry_fails_the_reduce_before_the_call(
        db_url: str, table_prefix: str, make_store: Callable[..., Any]) -> None:
    """One item whose request alone passes the handler's limit is never sent (the
    handler would refuse it with a 413): the reduce fails at once, naming the item
    and the sizes."""
    sizes = RequestSizes(handlers.app(never, reduce=Reduce(fold=keep_text, apply=mark),
                                      max_body_bytes=LIMIT))
    async with AsyncClient(db_url, table_prefix) as client:
        await client.create_partition("p", [NewItem("huge", b"y" * 60_000, 1),
                                            NewItem("small", b"x" * 10, 1)],
                                      reduce_gates=[1])
        async with engine(make_store, sizes, max_item_bytes=100_000):
            info = await client.wait("p", timeout=WAIT)
    assert info.status == "failed" and info.gate == 1
    assert sizes.sizes == []  # nothing was sent (the page of "huge" comes first)
    error = info.last_error or ""
    assert "item 'huge' (60000 bytes of data, 80000 as base64)" in error, error
    assert f"over the reduce request limit of {LIMIT} bytes" in error, error
