"""A read is one batch: a processor's process_batch gets it in one call, and a per-item
processor's quick results are written without waiting for a slow call of the same batch.
On every database."""

from __future__ import annotations

import asyncio

import pytest

import handlers
from processor import AsyncClient, NewItem
from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from tests.support.engine import running, wait_until
from tests.support.servers import serve_app
from watcher import RetryableError, Watcher, WatcherConfig
from watcher.protocol import Result, WorkItem

FAST = {"poll_interval": 0.05, "lease_duration": 3.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2}


class Batched:
    """A library-mode processor with a batch call; process() must never be used."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.failed_once: set[str] = set()

    async def process(self, item: WorkItem) -> Result:
        raise AssertionError("process_batch was there to be called")

    async def process_batch(self, items: list[WorkItem]) -> list[Result | Exception]:
        self.batches.append([item.id for item in items])
        answers: list[Result | Exception] = []
        for item in items:
            if item.id.endswith("7") and item.id not in self.failed_once:
                self.failed_once.add(item.id)
                answers.append(RetryableError("flaky"))
            elif item.gate == 0:
                answers.append(Result(gate=1, data=item.data + b"+0"))
            else:
                answers.append(Result(done=True, data=item.data + b"+1"))
        return answers


async def test_process_batch_gets_each_read_in_one_call_and_answers_per_item(
        db_url, table_prefix, make_store) -> None:
    processor = Batched()
    async with AsyncClient(db_url, table_prefix) as client:
        await client.create_partition("p", [NewItem(f"i{n:02d}", b"x") for n in range(40)])
        watcher = Watcher(make_store(), processor,
                          WatcherConfig(owner_id="w", concurrency=16, **FAST))
        async with running(watcher):
            info = await client.wait("p", timeout=30)
        assert info.status == "complete" and info.counts == {"complete": 40}
        items = {item.id: item for item in await client.items("p", with_data=True)}
        assert {item.data for item in items.values()} == {b"x+0+1"}
        assert items["i07"].attempts == 0, "a success resets the attempts of the retry"
    sizes = [len(batch) for batch in processor.batches]
    assert max(sizes) > 1 and max(sizes) <= 16, sizes
    assert sum(sizes) == 40 * 2 + 4, "each item once per gate, and the four retries"


async def test_quick_results_are_written_while_a_slow_call_of_their_batch_runs(
        db_url, table_prefix, make_store) -> None:
    release = asyncio.Event()

    async def process(item: WorkItem) -> Result:
        if item.id == "slow":
            await release.wait()
        else:
            await asyncio.sleep(0.001)
        return Result(done=True)

    async with AsyncClient(db_url, table_prefix) as client:
        await client.create_partition(
            "p", [NewItem("slow", b"")] + [NewItem(f"q{n}", b"") for n in range(9)])
        watcher = Watcher(make_store(), process,
                          WatcherConfig(owner_id="w", concurrency=32, **FAST))
        async with running(watcher):
            async def quick_ones_written() -> bool:
                counts = (await client.partition("p")).counts
                return counts.get("complete") == 9
            await wait_until(quick_ones_written, timeout=10)
            assert (await client.partition("p")).counts == {"available": 1, "complete": 9}
            release.set()
            info = await client.wait("p", timeout=10)
        assert info.status == "complete" and info.counts == {"complete": 10}


def _handler_step(item: handlers.Item) -> handlers.Result:
    return handlers.Result(done=True, data=item.data + b"!")


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
async def test_per_item_http_calls_of_each_batch_drain_on_either_transport(
        db_url, table_prefix, make_store, transport) -> None:
    """Each call of a batch runs in a task of its own: httpx (anyio cancel scopes) and
    aiohttp (timers bound to the current task) both see one task per call."""
    async with AsyncClient(db_url, table_prefix) as client, \
            serve_app(handlers.app(_handler_step)) as url:
        await client.create_partition("p", [NewItem(f"i{n:02d}", b"x") for n in range(60)])
        processor = HttpProcessor(HttpProcessorConfig(handler_url=url + "/",
                                                      transport=transport))
        watcher = Watcher(make_store(), processor,
                          WatcherConfig(owner_id="w", concurrency=16, **FAST))
        try:
            async with running(watcher):
                info = await client.wait("p", timeout=30)
        finally:
            await processor.aclose()
        assert info.status == "complete" and info.counts == {"complete": 60}
        items = await client.items("p", with_data=True)
        assert {item.data for item in items} == {b"x!"}
        assert {item.attempts for item in items} == {0}, "no attempt failed"
