"""The result writer's linger: a result after a quiet spell goes at once, a steady
stream is written in few, larger transactions. The store is a recording stand-in
(the database side of the writer is tested in tests/integration/test_items.py)."""

from __future__ import annotations

import asyncio

from watcher.records import ItemWrite
from watcher.writer import ResultWriter


class RecordingStore:
    """Answers every write as applied and records the size of each transaction."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    async def items_apply(self, writes, owner):
        self.batches.append(len(writes))
        await asyncio.sleep(0)
        return [True] * len(writes)


def _write(n: int) -> ItemWrite:
    return ItemWrite("p", f"i{n}", 1, "complete", 0, attempts=0)


async def _stream(writer: ResultWriter, count: int, spacing: float) -> list[bool]:
    outcomes: list[asyncio.Future] = []
    for n in range(count):
        future = asyncio.get_running_loop().create_future()
        writer.enqueue(_write(n), future.set_result)
        outcomes.append(future)
        await asyncio.sleep(spacing)
    return list(await asyncio.wait_for(asyncio.gather(*outcomes), timeout=10))


async def test_a_steady_stream_is_written_in_few_transactions() -> None:
    store = RecordingStore()
    writer = ResultWriter(store, "me", batch_size=256, linger=0.05)
    try:
        assert await _stream(writer, 40, 0.001) == [True] * 40
    finally:
        await writer.close(1.0)
    assert store.batches[0] == 1, "the first result, after a quiet spell, is written at once"
    assert sum(store.batches) == 40
    assert len(store.batches) <= 4, store.batches


async def test_without_linger_each_result_is_written_as_it_comes() -> None:
    store = RecordingStore()
    writer = ResultWriter(store, "me", batch_size=256, linger=0.0)
    try:
        assert await _stream(writer, 40, 0.001) == [True] * 40
    finally:
        await writer.close(1.0)
    assert len(store.batches) >= 20, store.batches


async def test_a_full_batch_does_not_wait() -> None:
    store = RecordingStore()
    writer = ResultWriter(store, "me", batch_size=4, linger=30.0)
    try:
        first = asyncio.get_running_loop().create_future()
        writer.enqueue(_write(0), first.set_result)
        await asyncio.wait_for(first, 5)  # written at once: nothing was written before
        rest = []
        for n in range(1, 9):
            future = asyncio.get_running_loop().create_future()
            writer.enqueue(_write(n), future.set_result)
            rest.append(future)
        done, _ = await asyncio.wait(rest[:4], timeout=5)
        assert len(done) == 4, "a full batch goes without waiting out the 30 s linger"
    finally:
        await writer.close(0.5)
    assert store.batches[:2] == [1, 4]
