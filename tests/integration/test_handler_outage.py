"""A handler outage fails no work, on real databases with real uvicorn handlers.

While the handler's service gives no answer (its server stopped: connections refused;
or a proxy in front of it answering bare 502, 503 and 504), the processor holds its
calls, probes the service, and spends no attempt: with ``max_retries=0`` one attempt
spent would fail its partition. A poison item that "takes the service down" each time it
is called, and an item that always answers Retry-After, are bounded by
``max_unpaid_retries`` and fail with an error that names it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import handlers
from processor import AsyncClient, NewItem
from processor.console.flow_page import flow_data
from processor.http.batch import BatchingHttpProcessor
from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from tests.support.engine import running, wait_until
from tests.support.servers import free_port, read_body, serve_app
from watcher import Watcher, WatcherConfig
from watcher.store import Store

FAST = {"poll_interval": 0.05, "lease_duration": 1.5, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2}
PARTITIONS, ITEMS = 4, 30


def probing_quickly(watcher: Watcher) -> Watcher:
    """``watcher`` with its hold's probes 0.05 s apart, doubling up to 0.4 s: three
    probes come within half a second instead of 3.5 s (the waits themselves are
    tests/unit/test_unpaid.py's)."""
    watcher.flow.hold.first_wait, watcher.flow.hold.max_wait = 0.05, 0.4
    return watcher


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


class Handler:
    """The handler SDK's app, completing each item after a moment, behind a switch that
    makes it answer like a proxy whose upstream is gone (a bare 502, 503 or 504 in turn,
    to calls and probes alike) while ``down``, or for the items in ``poison`` only."""

    def __init__(self, *, seconds: float = 0.05, poison: frozenset[str] = frozenset(),
                 inner: Any = None, reduces_refused: int = 0) -> None:
        self.calls: list[str] = []
        self.down = False
        self.refused = 0
        self.poison = poison
        self.seconds = seconds
        self.inner = inner or handlers.app(self.work)
        self.reduces_refused = reduces_refused  # the first reduce calls met the proxy

    async def work(self, item: handlers.Item) -> handlers.Result:
        self.calls.append(item.id)
        await asyncio.sleep(self.seconds)
        return handlers.Result(done=True)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not self.down and (
                scope["path"].endswith("/reduce") and self.reduces_refused > 0):
            self.reduces_refused -= 1
            self.down = True
            try:
                return await self(scope, receive, send)
            finally:
                self.down = False
        if scope["type"] == "http" and (self.down or (
                self.poison and self._poisoned(scope))):
            await read_body(receive)
            status = (502, 503, 504)[self.refused % 3]
            self.refused += 1
            body = b"<html><body>upstream unavailable</body></html>"
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"text/html"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.inner(scope, receive, send)

    def _poisoned(self, scope: dict[str, Any]) -> bool:
        headers = dict(scope["headers"])
        return headers.get(b"x-item-id", b"").decode() in self.poison


def processor_for(url: str, batch: bool) -> HttpProcessor | BatchingHttpProcessor:
    config = HttpProcessorConfig(handler_url=url)
    return BatchingHttpProcessor(config, batch_size=8) if batch else HttpProcessor(config)


async def create(client: AsyncClient, partitions: int = PARTITIONS, items: int = ITEMS) -> None:
    for n in range(partitions):
        await client.create_partition(f"p{n}", [NewItem(f"i{m:03d}", b"{}")
                                                 for m in range(items)])


async def assert_complete_without_attempts(client: AsyncClient, partitions: int) -> None:
    for n in range(partitions):
        info = await client.wait(f"p{n}", timeout=60)
        assert info.status == "complete", info
        for item in await client.items(f"p{n}"):
            assert item.error_history == (), item  # not one attempt failed


def hold_lines(caplog: pytest.LogCaptureFixture) -> tuple[int, int]:
    records = [record for record in caplog.records
               if record.name == "watcher.flow.handler_hold" and record.levelno == logging.WARNING]
    started = sum("action=handler_hold_started" in r.getMessage() for r in records)
    ended = sum("action=handler_hold_ended" in r.getMessage() for r in records)
    return started, ended


@pytest.mark.parametrize("batch", [False, True], ids=["per-item", "batch"])
async def test_a_stopped_handler_that_comes_back_fails_nothing(
        client: AsyncClient, make_store: Callable[..., Store],
        caplog: pytest.LogCaptureFixture, batch: bool) -> None:
    caplog.set_level(logging.WARNING)
    await create(client)
    handler = Handler()
    port = free_port()
    processor = processor_for(f"http://127.0.0.1:{port}", batch)
    watcher = probing_quickly(Watcher(make_store(), processor,
                                      WatcherConfig(**FAST, max_retries=0, concurrency=8)))
    first = serve_app(handler, port=port, abrupt=True)
    await first.__aenter__()
    try:
        async with running(watcher):
            await wait_until(lambda: len(handler.calls) >= 8)
            stopping, first = first, None
            await stopping.__aexit__(None, None, None)
            # The server crashed: the calls in flight were cut off, and every
            # connection is refused.
            await wait_until(lambda: watcher.flow.hold.probes >= 3, timeout=30)
            assert watcher.flow.hold.held
            async with serve_app(handler, port=port):
                await assert_complete_without_attempts(client, PARTITIONS)
                assert not watcher.flow.hold.held
    finally:
        if first is not None:
            await first.__aexit__(None, None, None)
        await processor.aclose()
    assert hold_lines(caplog) == (1, 1)


@pytest.mark.parametrize("batch", [False, True], ids=["per-item", "batch"])
async def test_a_proxy_answering_502_503_504_for_every_call_fails_nothing(
        client: AsyncClient, make_store: Callable[..., Store],
        caplog: pytest.LogCaptureFixture, batch: bool) -> None:
    caplog.set_level(logging.WARNING)
    await create(client)
    handler = Handler()
    async with serve_app(handler) as url:
        processor = processor_for(url, batch)
        watcher = probing_quickly(Watcher(make_store(), processor,
                                          WatcherConfig(**FAST, max_retries=0, concurrency=8)))
        try:
            async with running(watcher):
                await wait_until(lambda: len(handler.calls) >= 8)
                handler.down = True
                await wait_until(lambda: watcher.flow.hold.probes >= 3, timeout=30)
                assert watcher.flow.hold.held
                assert handler.refused >= 3  # calls and probes met the proxy's answers
                handler.down = False
                await assert_complete_without_attempts(client, PARTITIONS)
        finally:
            await processor.aclose()
    assert hold_lines(caplog) == (1, 1)


async def test_a_poison_item_that_takes_the_service_down_is_bounded(
        client: AsyncClient, make_store: Callable[..., Store],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    await create(client, partitions=2, items=6)
    handler = Handler(seconds=0.0, poison=frozenset({"i002"}))
    async with serve_app(handler) as url:
        processor = processor_for(url, batch=False)
        # A lease far longer than the run: a renewal starved on a loaded machine would
        # lose a lease, and a call its holder made again would count one more refusal.
        config = WatcherConfig(**{**FAST, "lease_duration": 30.0}, max_retries=1,
                               max_unpaid_retries=2)
        try:
            async with running(Watcher(make_store(), processor, config)):
                infos = [await client.wait(f"p{n}", timeout=60) for n in range(2)]
        finally:
            await processor.aclose()
    assert [info.status for info in infos] == ["failed", "failed"]
    for n in range(2):
        poison = await client.item(f"p{n}", "i002")
        assert poison.status == "failed"
        assert poison.attempts == 2  # max_retries + 1, after max_unpaid_retries unpaid
        assert "max_unpaid_retries allows (2)" in (poison.last_error or "")
        assert "HTTP 50" in (poison.last_error or "")
        others = [item for item in await client.items(f"p{n}") if item.id != "i002"]
        assert [item.status for item in others] == ["complete"] * 5
    # Each poisoned call went to the handler: two unpaid, then two attempts.
    assert handler.calls.count("i002") == 0  # the switch answered them, not the handler
    assert handler.refused == 2 * (2 + 2)
    spent = [r for r in caplog.records if "action=unpaid_retries_spent" in r.getMessage()]
    assert len(spent) == 2 * 2 and all(r.levelno == logging.WARNING for r in spent)


async def test_an_item_always_answering_retry_after_is_bounded_logged_and_shown(
        client: AsyncClient, make_store: Callable[..., Store], db_url: str,
        table_prefix: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    await client.create_partition("p", [NewItem(f"i{m}", b"{}") for m in range(5)])
    calls: list[str] = []

    def work(item: handlers.Item) -> handlers.Result:
        calls.append(item.id)
        if item.id == "i3":
            raise handlers.Retry("busy with this one", retry_after=0)
        return handlers.Result(done=True)

    async with serve_app(handlers.app(work)) as url:
        processor = HttpProcessor(HttpProcessorConfig(handler_url=url))
        # A lease lost on a busy machine would call i3 again beyond its bound: the bound
        # is what is counted here, so the lease outlasts any stall.
        config = WatcherConfig(**{**FAST, "lease_duration": 10.0}, max_retries=1,
                               max_unpaid_retries=3, handler_name=url)
        try:
            async with running(Watcher(make_store(), processor, config)):
                info = await client.wait("p", timeout=60)
        finally:
            await processor.aclose()
    assert info.status == "failed"
    item = await client.item("p", "i3")
    assert item.status == "failed" and item.attempts == 2
    assert "max_unpaid_retries allows (3)" in (item.last_error or "")
    assert calls.count("i3") == 3 + 2
    throttled = [r for r in caplog.records if "action=handler_throttled" in r.getMessage()]
    assert len(throttled) == 1  # three holds within a minute: one line
    assert throttled[0].levelno == logging.WARNING and "holds=1" in throttled[0].getMessage()
    flow = await flow_data(client)
    [row] = flow["handlers"]
    assert row.name == url and row.held_last  # the last hold is shown, though it ended
    status = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "processor.cli", "status", "--db-url", db_url, "--table-prefix",
        table_prefix, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"})
    async with asyncio.timeout(60):
        out, err = await status.communicate()
    assert status.returncode == 0, err
    assert f"handler {url}: last held by a Retry-After" in out.decode(), out


async def test_a_reduce_call_the_service_did_not_answer_spends_no_attempt(
        client: AsyncClient, make_store: Callable[..., Store],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)

    def to_gate_one(item: handlers.Item) -> handlers.Result:
        return handlers.Result(gate=1)

    def total(page: handlers.ReducePage) -> handlers.Reduced:
        return handlers.Reduced(default=handlers.Result(done=True),
                                result={"count": len(page.items)})

    handler = Handler(inner=handlers.app(to_gate_one, reduce=total), reduces_refused=2)
    await client.create_partition("r", [NewItem(f"i{m}", b"{}") for m in range(6)],
                                  reduce_gates=[1])
    async with serve_app(handler) as url:
        processor = processor_for(url, batch=False)
        config = WatcherConfig(**FAST, max_retries=0)
        try:
            async with running(Watcher(make_store(), processor, config)):
                info = await client.wait("r", timeout=60)
        finally:
            await processor.aclose()
    # With max_retries=0, one reduce attempt spent would have failed the partition.
    assert info.status == "complete", info
    assert info.result_json() == {"count": 6}
    assert handler.refused == 2
    assert hold_lines(caplog) == (2, 2)  # one hold per refused call, each logged once


async def test_which_failed_calls_are_the_services_outage() -> None:
    from tests.support.servers import send_json
    from watcher import HandlerUnavailableError, RetryableError, ThrottledError, WorkItem

    answers: dict[str, tuple[int, bytes, list[tuple[str, str]]]] = {
        "/proxy502": (502, b"<html>Bad Gateway</html>", []),
        "/proxy504": (504, b"", []),
        "/bare500": (500, b"Internal Server Error", []),
        "/own503": (503, b'{"error": {"message": "not now"}}', []),
        "/busy": (503, b"", [("retry-after", "1")]),
    }

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await read_body(receive)
        status, body, headers = answers[scope["path"]]
        await send_json(send, status, body, headers)

    expected: dict[str, type[Exception]] = {
        "/proxy502": HandlerUnavailableError, "/proxy504": HandlerUnavailableError,
        "/bare500": RetryableError, "/own503": RetryableError, "/busy": ThrottledError}
    work = WorkItem("p", "i", 0, 1, b"{}", 1)
    async with serve_app(app) as url:
        for path, kind in expected.items():
            async with HttpProcessor(HttpProcessorConfig(handler_url=url + path)) as processor:
                with pytest.raises(RetryableError) as raised:
                    await processor.process(work)
                assert type(raised.value) is kind, (path, raised.value)
    closed = HttpProcessor(HttpProcessorConfig(handler_url=f"http://127.0.0.1:{free_port()}/"))
    async with closed:
        with pytest.raises(HandlerUnavailableError, match="could not connect"):
            await closed.process(work)
        assert await closed.probe_handler() is False
