"""Reading ahead on real databases: one read of ready items feeds more calls than the
slots free at the time; the rows held start as slots free, without another read, and
never start twice, after a pause, or at a gate the partition has left."""

from __future__ import annotations

import asyncio
from collections import Counter

from processor import AsyncClient, NewItem
from tests.support.engine import count_calls, running, wait_until
from watcher import Result, Watcher, WatcherConfig, WorkItem


def config(**overrides) -> WatcherConfig:
    return WatcherConfig(**{"owner_id": "w1", "poll_interval": 5.0, "lease_duration": 30.0,
                            "retry_backoff": 0.05, **overrides})


async def test_a_partition_larger_than_the_slots_is_read_once(db_url, table_prefix,
                                                             make_store) -> None:
    """12 items, 8 slots: one read returns all 12 (8 to start, 4 held); the 4 start as
    the first calls' slots free. Without reading ahead it took two reads (8, then 4 and
    the empty end)."""
    client = AsyncClient(db_url, table_prefix)
    await client.create_partition("p", [NewItem(f"i{n:02}", b"", 0) for n in range(12)])
    store = make_store()
    reads = count_calls(store, "items_ready")
    calls: Counter[str] = Counter()
    in_flight = peak = 0

    async def process(item: WorkItem) -> Result:
        nonlocal in_flight, peak
        calls[item.id] += 1
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return Result(done=True)

    async with running(Watcher(store, process, config(concurrency=8))):
        info = await client.wait("p", timeout=30)
    assert info.status == "complete"
    assert calls == Counter({f"i{n:02}": 1 for n in range(12)}), "each item once"
    assert peak <= 8, "the rows held wait for free slots"
    assert reads["items_ready"] == 1
    await client.close()


async def test_a_pause_stops_the_rows_held_within_a_poll(db_url, table_prefix,
                                                         make_store) -> None:
    """Rows read before a pause do not start once a poll interval has passed since
    their read: the next start reads again, and the read sees the pause."""
    client = AsyncClient(db_url, table_prefix)
    await client.create_partition("p", [NewItem(f"i{n:02}", b"", 0) for n in range(12)])
    release = asyncio.Event()
    started: list[str] = []

    async def process(item: WorkItem) -> Result:
        started.append(item.id)
        await release.wait()
        return Result(done=True)

    poll = 0.3
    watcher = Watcher(make_store(), process, config(concurrency=4, poll_interval=poll))
    async with running(watcher):
        await wait_until(lambda: len(started) == 4, timeout=10)  # 4 started, 8 held
        await client.pause("p")
        await asyncio.sleep(poll * 1.5)  # the held rows are older than a poll now
        release.set()

        async def four_complete() -> bool:
            return (await client.partition("p")).counts.get("complete") == 4

        await wait_until(four_complete, timeout=10, message="the 4 calls' results written")
        await asyncio.sleep(poll * 2)  # their freed slots would start a held row by now
        assert len(started) == 4, f"calls started after the pause: {started[4:]}"
        await client.resume("p")
        info = await client.wait("p", timeout=30)
    assert info.status == "complete"
    assert sorted(started) == [f"i{n:02}" for n in range(12)], "each item once"
    await client.close()
