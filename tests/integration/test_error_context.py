"""Each layer adds its context once. An item's stored error is the failure's kind and the
handler's own message: its row, its error history and the engine's log fields name its
partition, id, gate and attempt, so neither the processor, the handlers SDK nor the
example puts them in the text. A reduce's error names its page once. Real handlers served
by uvicorn, per-item and batch protocols and a reduce, on every live database."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import handlers
from handlers import Item, Reduced, ReducePage, Result
from handlers.examples import resumes, samples
from processor import AsyncClient, NewItem
from processor.http.batch import BatchingHttpProcessor
from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from processor.views import error_after_context, error_cell
from tests.support.engine import running
from tests.support.servers import serve_app
from watcher import Watcher, WatcherConfig

FAST = {"poll_interval": 0.05, "lease_duration": 3.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2, "max_retries": 0}
WAIT = 30.0


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


@contextlib.asynccontextmanager
async def engine(make_store: Callable[..., Any], app: Any, protocol: str
                 ) -> AsyncIterator[None]:
    async with serve_app(app) as url:
        config = HttpProcessorConfig(handler_url=url + "/")
        processor: Any = (HttpProcessor(config) if protocol == "item"
                          else BatchingHttpProcessor(config, batch_size=10))
        watcher = Watcher(make_store(), processor, WatcherConfig(owner_id="w1", **FAST))
        try:
            async with running(watcher):
                yield
        finally:
            await processor.aclose()


def step(item: Item) -> Result:
    """Gate 0 of the test handler: each item id asks for one kind of failure."""
    if item.id == "bad-json":
        item.json()
    if item.id == "refused":
        raise handlers.Fail("unreadable scan")
    if item.id == "bad-return":
        return 42  # type: ignore[return-value]
    if item.id == "late-bad":
        return Result(gate=10, data=b"\xffnot json")
    return Result(gate=10)


def total(page: ReducePage) -> Reduced:
    return Reduced(result=sum(item.json() for item in page.items if not item.failed))


def once(message: str, *contexts: str) -> None:
    for context in contexts:
        assert message.count(context) == 1, (context, message)


@pytest.mark.parametrize("protocol", ["item", "batch"])
async def test_stored_errors_name_each_thing_once(make_store: Callable[..., Any],
                                                  client: AsyncClient, protocol: str) -> None:
    app = handlers.app({0: step}, reduce=total)
    await client.create_partition("p", [
        NewItem("ok", b"1"), NewItem("bad-json", b"{not json"), NewItem("refused", b"2"),
        NewItem("bad-return", b"3"), NewItem("late-bad", b"4"), NewItem("lost", b"5", gate=7),
    ], reduce_gates=[10], on_item_failure="continue")
    async with engine(make_store, app, protocol):
        info = await client.wait("p", timeout=WAIT)
    errors = {item.id: item.last_error for item in await client.items("p", status="failed")}
    assert set(errors) == {"bad-json", "refused", "bad-return", "lost"}
    expected = {"bad-json": "data is not valid JSON", "refused": "unreadable scan",
                "bad-return": "returned a int", "lost": "no handler for this gate"}
    for item_id, message in errors.items():
        assert message is not None and expected[item_id] in message, message
        # The row and the log fields name the partition, item, gate and attempt.
        for context in ("'p'", repr(item_id), "attempt"):
            assert context not in message, (context, message)
        item = await client.item("p", item_id)
        assert [entry.error for entry in item.error_history] == [message]
        assert item.error_history[0].attempt == 1
        assert item.error_history[0].gate == (7 if item_id == "lost" else 0)
    # A table whose columns show the item, gate and attempts shows the message itself.
    [refused] = [item for item in await client.items("p", status="failed")
                 if item.id == "refused"]
    shown = error_after_context(refused)
    assert shown is not None and shown.startswith("the handler ")  # HTTP 422, or a batch's 200
    assert shown.endswith("unreadable scan (no_retry set: not retried)")
    assert error_cell(error_after_context(refused)).endswith("unreadable scan (no_retry set: "
                                                             "not retried)")
    # The reduce names its page; the item whose data it cannot read is named by the SDK.
    assert info.status == "failed" and info.last_error is not None
    assert info.last_error.startswith("partition 'p' gate 10 reduce all page 0 (attempt 1): ")
    once(info.last_error, "'p'", "gate 10", "attempt", "'late-bad'")
    assert "item 'late-bad': data is not valid JSON" in info.last_error


async def test_the_resume_example_names_nothing_the_processor_names(
        make_store: Callable[..., Any], client: AsyncClient) -> None:
    await client.create_partition("opening", [
        NewItem("scan", b'{"name": "x"}'), *(NewItem(f"r{n}", document) for n, document in
                                             enumerate(samples.sample_resumes(3, seed=1)))],
        reduce_gates=[1], on_item_failure="continue")
    async with engine(make_store, resumes.app, "item"):
        info = await client.wait("opening", timeout=WAIT)
    assert (info.status, info.counts) == ("complete", {"complete": 3, "failed": 1})
    [failed] = await client.items("opening", status="failed")
    assert failed.last_error is not None and "needs a 'text' string" in failed.last_error
    for context in ("'opening'", "'scan'", "gate 0", "attempt"):
        assert context not in failed.last_error, (context, failed.last_error)
