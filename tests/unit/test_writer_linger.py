"""The result writer's linger: a result after a quiet spell goes at once, a steady
stream is written in few, larger transactions. The store is the typed stand-in
(tests/support/fake_store.py); the database side of the writer is tested in
tests/conformance/test_items.py."""

from __future__ import annotations

import asyncio

from tests.support.fake_store import FakeStore
from watcher.dispatch.writer import ResultWriter
from watcher.records import ItemWrite


def _write(n: int) -> ItemWrite:
    return ItemWrite("p", f"i{n}", 1, "complete", 0, attempts=0)


async def _stream(writer: ResultWriter, count: int, spacing: float,
                  span: list[float] | None = None) -> list[bool]:
    """Enqueue ``count`` results ``spacing`` seconds apart; ``span`` gets the loop's
    times of the first and the last (on a busy machine the stream takes longer)."""
    outcomes: list[asyncio.Future] = []
    loop = asyncio.get_running_loop()
    for n in range(count):
        if span is not None and n in (0, count - 1):
            span.append(loop.time())
        future = asyncio.get_running_loop().create_future()
        writer.enqueue(_write(n), future.set_result)
        outcomes.append(future)
        await asyncio.sleep(spacing)
    return list(await asyncio.wait_for(asyncio.gather(*outcomes), timeout=10))


async def test_a_steady_stream_is_written_in_few_transactions() -> None:
    store = FakeStore()
    writer = ResultWriter(store, "me", batch_size=256, linger=0.05)
    span: list[float] = []
    try:
        assert await _stream(writer, 40, 0.001, span) == [True] * 40
    finally:
        await writer.close(1.0)
    assert store.asked.batches[0] == 1, "the first result, after a quiet spell, is written at once"
    assert sum(store.asked.batches) == 40
    # One write at once, then at most one a linger while the stream lasts (40 ms when
    # the loop keeps time, longer on a busy machine), and one after its last result.
    most = 2 + int((span[1] - span[0]) / 0.05)
    assert len(store.asked.batches) <= most, (store.asked.batches,
                                              f"a stream of {span[1] - span[0]:.3f} s")


async def test_without_linger_each_result_is_written_as_it_comes() -> None:
    store = FakeStore()
    writer = ResultWriter(store, "me", batch_size=256, linger=0.0)
    try:
        assert await _stream(writer, 40, 0.001) == [True] * 40
    finally:
        await writer.close(1.0)
    assert len(store.asked.batches) >= 20, store.asked.batches


async def test_a_full_batch_does_not_wait() -> None:
    store = FakeStore()
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
    assert store.asked.batches[:2] == [1, 4]


async def test_with_no_call_running_the_writer_does_not_wait_for_more() -> None:
    """A key limit can hold the calls in flight below the batch size: once every one's
    result is queued, none can come to join the batch, so lingering would only keep
    the limit's slots idle."""
    store = FakeStore()
    running = {"calls": 0}
    writer = ResultWriter(store, "me", batch_size=256, linger=30.0,
                          calls_running=lambda: running["calls"])
    try:
        first = asyncio.get_running_loop().create_future()
        writer.enqueue(_write(0), first.set_result)
        await asyncio.wait_for(first, 5)  # written at once: nothing was written before
        second = asyncio.get_running_loop().create_future()
        writer.enqueue(_write(1), second.set_result)
        assert await asyncio.wait_for(second, 5), "no call runs: written without the 30 s linger"
        running["calls"] = 3
        third = asyncio.get_running_loop().create_future()
        writer.enqueue(_write(2), third.set_result)
        done, _ = await asyncio.wait([third], timeout=0.3)
        assert not done, "calls run: the writer lingers for their results"
    finally:
        await writer.close(0.5)
