"""The batch handler protocol end to end: watcher -> BatchingHttpProcessor -> real uvicorn."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest

import handlers
from processor import AsyncClient, NewItem
from processor.http.batch import BatchingHttpProcessor
from processor.http.config import HttpProcessorConfig
from tests.support.engine import running
from tests.support.servers import read_body, send_json, serve_app
from watcher import Watcher, WatcherConfig
from watcher.protocol import Result, RetryableError, WorkItem

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
    # Its own row holds it: the error is the handler's message, not another item's.
    assert [entry.error for entry in items["poison"].error_history] == [
        items["poison"].last_error]
    assert items["ok"].error_history == ()
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
    """A whole-batch failure (connection refused) is recorded against every item by name,
    once the items' unpaid retries are spent (none are allowed here: an outage of the
    service otherwise holds the calls and spends no attempt)."""
    from tests.support.servers import free_port

    items = await fail_two_items(db_url, table_prefix, make_store,
                                 f"http://127.0.0.1:{free_port()}/")
    for name in ("a", "b"):
        assert "batch request failed" in items[name].last_error


# --------------------------------------------------------------------------- bad answers
# Each call below runs under a deadline: a future left unsettled would hold its
# caller (and, in the engine, a dispatch slot) until shutdown.

DEADLINE = 10.0


async def fail_two_items(db_url: str, table_prefix: str, make_store: Any,
                         handler_url: str) -> dict[str, Any]:
    """Run items "a" and "b" through a batching processor at ``handler_url`` with no
    retries; check that the partition and both items failed, each with its error in its
    own row and history (the text names no item), and return the items by id."""
    async with AsyncClient(db_url, table_prefix) as client:
        await client.create_partition("p", [NewItem("a", b""), NewItem("b", b"")])
        http = BatchingHttpProcessor(HttpProcessorConfig(handler_url=handler_url),
                                     batch_size=10)
        watcher = Watcher(make_store(), http, WatcherConfig(owner_id="b", max_retries=0,
                                                            max_unpaid_retries=0, **FAST))
        try:
            async with running(watcher):
                info = await client.wait("p", timeout=30)
        finally:
            await http.aclose()
        items = {item.id: item for item in await client.items("p")}
    assert info.status == "failed"
    for name in ("a", "b"):
        assert items[name].status == "failed"
        assert f"'{name}'" not in items[name].last_error
        assert [(entry.attempt, entry.error) for entry in items[name].error_history] == [
            (1, items[name].last_error)]
    return items


def work(number: int) -> WorkItem:
    return WorkItem("p", f"i{number}", 0, 1, b"x", 1, f"key-{number}")


def answering(body: bytes, status: int = 200, seen: list[bytes] | None = None) -> Any:
    """A raw ASGI app answering every request with ``body``."""

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        request = await read_body(receive)
        if seen is not None:
            seen.append(request)
        await send_json(send, status, body)

    return app


async def process_all(http: BatchingHttpProcessor, items: list[WorkItem]) -> list[Any]:
    """Every item's outcome (a Result or the exception), or TimeoutError if one hangs."""
    return await asyncio.wait_for(
        asyncio.gather(*(http.process(item) for item in items), return_exceptions=True),
        DEADLINE)


OVERSIZE = b'[{"done": true}, {"done": true}, {"data": "' + b"x" * 5000 + b'"}]'


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
@pytest.mark.parametrize("body, in_message", [
    pytest.param(b"[" * 100_000, "the body is nested too deeply to parse", id="deeply-nested"),
    pytest.param(b"<html>Bad Gateway</html>", "the body is not valid JSON", id="not-json"),
    pytest.param(b'[{"done": true}, {"data": NaN}, {}]', "NaN is not a JSON number", id="NaN"),
    pytest.param(b'[{"done": true}, {"data": 1e999}, {}]', "1e999 overflows a 64-bit float",
                 id="1e999"),
    pytest.param(OVERSIZE, "the body is larger than max_response_bytes (1000 bytes)",
                 id="oversize"),
])
async def test_a_bad_batch_answer_fails_every_item_and_leaves_none_pending(
        transport, body, in_message) -> None:
    items = [work(n) for n in range(3)]
    async with serve_app(answering(body)) as url:
        config = HttpProcessorConfig(handler_url=url, transport=transport,
                                     max_response_bytes=1000 if body is OVERSIZE else 10**6)
        async with BatchingHttpProcessor(config, batch_size=10) as http:
            outcomes = await process_all(http, items)
    assert len(outcomes) == len(items)
    for outcome in outcomes:
        assert isinstance(outcome, RetryableError), outcome
        message = str(outcome)
        assert message.startswith("the batch request failed: malformed answer (HTTP 200): ")
        assert in_message in message, message


async def test_a_bug_in_the_batch_send_path_fails_the_attempts(monkeypatch, caplog) -> None:
    """Whatever goes wrong while sending, every caller gets an answer, and one log line."""
    import processor.wire.contract

    def broken_decoder(body: bytes) -> Any:
        raise KeyError("planted")

    monkeypatch.setattr(processor.wire.contract, "decode_json", broken_decoder)
    items = [work(n) for n in range(4)]
    async with serve_app(answering(b"[{}, {}, {}, {}]")) as url:
        async with BatchingHttpProcessor(HttpProcessorConfig(handler_url=url),
                                         batch_size=10) as http:
            outcomes = await process_all(http, items)
    for item, outcome in zip(items, outcomes, strict=True):
        assert isinstance(outcome, RetryableError), outcome
        assert f"{item.id!r}" not in str(outcome)
        assert "unexpected KeyError while sending a batch to the handler: 'planted'" in str(
            outcome)
    bug_lines = [r for r in caplog.records if "action=handler_batch_bug" in r.getMessage()]
    assert len(bug_lines) == 1


def _stalling_handler() -> tuple[Any, asyncio.Event, asyncio.Event]:
    """A batch handler that sets ``arrived`` when a batch comes in and answers it (two
    empty results) only once ``release`` is set: (app, arrived, release)."""
    arrived, release = asyncio.Event(), asyncio.Event()

    async def stalls(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        await read_body(receive)
        arrived.set()
        await release.wait()
        await send_json(send, 200, [{}, {}])

    return stalls, arrived, release


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
async def test_closing_mid_batch_answers_every_caller(transport) -> None:
    stalls, arrived, release = _stalling_handler()

    async with serve_app(stalls) as url:
        http = BatchingHttpProcessor(HttpProcessorConfig(handler_url=url, transport=transport),
                                     batch_size=10)
        calls = asyncio.gather(*(http.process(work(n)) for n in range(2)),
                               return_exceptions=True)
        try:
            await asyncio.wait_for(arrived.wait(), DEADLINE)
            await http.aclose()
        finally:
            release.set()
        outcomes = await asyncio.wait_for(calls, DEADLINE)
    # Closed under the call: a retryable error, or (httpx may still finish the
    # exchange it had started) the answer; never a call left waiting.
    assert all(isinstance(outcome, RetryableError | Result) for outcome in outcomes), outcomes
    assert not any("unexpected" in str(outcome) for outcome in outcomes), outcomes


async def test_a_cancelled_send_cancels_its_callers_instead_of_stranding_them() -> None:
    """A send task cancelled mid-call (as at loop shutdown) cancels its callers' waits."""
    stalls, arrived, release = _stalling_handler()

    async with serve_app(stalls) as url:
        async with BatchingHttpProcessor(HttpProcessorConfig(handler_url=url),
                                         batch_size=10) as http:
            calls = asyncio.gather(*(http.process(work(n)) for n in range(2)),
                                   return_exceptions=True)
            try:
                await asyncio.wait_for(arrived.wait(), DEADLINE)
                [sending] = http._sending  # the one batch in flight
                sending.cancel()
                outcomes = await asyncio.wait_for(calls, DEADLINE)
            finally:
                release.set()
    assert all(isinstance(outcome, asyncio.CancelledError) for outcome in outcomes), outcomes


async def test_a_handler_url_with_a_password_works_in_batch_mode() -> None:
    """The batch URL derived from ``http://user:password@host/`` sends Basic auth, as the
    per-item URL does (aiohttp refuses a URL with credentials beside an Authorization
    header, which used to kill the send task)."""
    seen: list[tuple[str, bytes]] = []

    async def records(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        entries = json.loads(await read_body(receive))
        seen.append((scope["path"], dict(scope["headers"]).get(b"authorization", b"")))
        await send_json(send, 200, [{"done": True}] * len(entries))

    async with serve_app(records) as url:
        with_password = url.replace("http://", "http://bob:pa55word@")
        async with BatchingHttpProcessor(HttpProcessorConfig(handler_url=with_password),
                                         batch_size=10) as http:
            outcomes = await process_all(http, [work(0), work(1)])
    assert outcomes == [Result(done=True)] * 2
    [(path, authorization)] = seen
    assert path == "/batch"
    assert authorization == b"Basic " + base64.b64encode(b"bob:pa55word")


async def test_a_deeply_nested_batch_answer_fails_the_items_through_the_engine(
        db_url, table_prefix, make_store) -> None:
    """The engine sees the attempts fail (and moves on) instead of waiting forever."""
    async with serve_app(answering(b"[" * 100_000)) as url:
        items = await fail_two_items(db_url, table_prefix, make_store, url)
    for name in ("a", "b"):
        assert "nested too deeply" in items[name].last_error
