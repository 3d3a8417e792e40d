"""Helpers for driving watchers in tests: run them in the background, wait on conditions."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from watcher import Watcher
from watcher.records import ItemWrite, LeaseRow, NewItem, PartitionSettings
from watcher.rules.reduce import ReduceWrite
from watcher.store import Store

# wait_until's default deadline: generous, since it bounds a wait and asserts no speed (a
# test passes as soon as its condition holds; only a failing one waits this long).
WAIT_DEADLINE = 30.0


async def wait_until(condition: Callable[[], Any | Awaitable[Any]], *,
                     timeout: float = WAIT_DEADLINE,  # noqa: ASYNC109
                     interval: float = 0.02, message: str = "condition") -> Any:
    """Poll ``condition`` until it returns something truthy; return that value.

    Raises:
        AssertionError: the deadline passed first (the message says what was awaited).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {message}")
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def running(*watchers: Watcher) -> AsyncIterator[list[asyncio.Task[None]]]:
    """Run watchers in the background; stop them gracefully on exit."""
    tasks = [asyncio.create_task(w.run()) for w in watchers]
    try:
        yield tasks
    finally:
        for watcher, task in zip(watchers, tasks, strict=True):
            if not task.done():
                await watcher.stop()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def crash(task: asyncio.Task[None]) -> None:
    """Stop a watcher abruptly (no lease release), as a killed process would."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def count_calls(store: Any, *names: str) -> dict[str, int]:
    """Count calls to the named store methods (the real methods still run).

    Lets a test wait until the engine has made N passes, instead of sleeping.
    """
    counts = dict.fromkeys(names, 0)
    for name in names:
        original = getattr(store, name)

        def make(name: str = name, original: Any = original) -> Any:
            async def counted(*args: Any, **kwargs: Any) -> Any:
                counts[name] += 1
                return await original(*args, **kwargs)
            return counted

        setattr(store, name, make())
    return counts


async def leased_partition(store: Store, partition_id: str, count: int, owner: str
                           ) -> dict[str, int]:
    """Create a partition of ``count`` items (``i0``...) leased to ``owner``; returns
    item id -> version, as a result write must quote it."""
    await store.partition_create(partition_id, [NewItem(f"i{n}", b"x") for n in range(count)])
    await store.leases_take([LeaseRow(partition_id, 1, 0, "")], owner, 60.0)
    return {row.id: row.version for row in await store.items_ready(partition_id, 0, 1000)}


async def create_one_item_partitions(store: Store, ids: Sequence[str],
                                     settings: PartitionSettings, data: bytes = b"{}"
                                     ) -> None:
    """Create one-item partitions ``ids`` (item ``i`` with ``data``) with ``settings``, in
    order, in one transaction: the rows :meth:`Store.partition_create` writes (the same
    statements, in the same order), without a commit per partition, which made a
    burst of 2,000 take 10-20 s of a test. Setup only: the creates themselves are
    tested one by one."""
    if settings.key:
        await store.key_prepare(settings.key)
    items = [NewItem("i", data, 0)]
    async with store._write() as conn:
        for partition_id in ids:
            await store._partition_insert(conn, partition_id, 0, settings)
            await store._items_insert(conn, partition_id, items)
            await store._notify(conn, partition_id)


async def spawning_partition(store: Store, partition_id: str, count: int, owner: str
                             ) -> None:
    """A partition of ``count`` items (``i0``...) leased to ``owner``, as a rewind finds it
    after a long run: every item complete at gate 1 but the first three, which each
    spawned a child at gate 1, and a reduce at gate 0 that spawned one item (the
    statements' plans must not read the completed items to find the spawned ones)."""
    versions = await leased_partition(store, partition_id, count, owner)
    spawning = sorted(versions)[:3]
    assert all(await store.items_apply([
        ItemWrite(partition_id, item_id, version, "available" if item_id in spawning
                  else "complete", 1, 0,
                  spawn=(NewItem(f"{item_id}.c", b"", 1),) if item_id in spawning else ())
        for item_id, version in versions.items()], owner))
    state = await store.reduce_state_read(partition_id)
    assert state is not None
    assert await store.reduce_write(partition_id, state.version, owner, ReduceWrite(
        None, 0, None, None, None, (), (NewItem("summary", b"", 1),), gate=0)) is not None


@contextlib.asynccontextmanager
async def serving_watcher(app: Any, store: Store, config: Any) -> AsyncIterator[None]:
    """Serve the handler ``app`` under uvicorn on loopback and run a watcher over
    ``store`` (with ``config``) that calls it over HTTP, for the block."""
    from processor.http.config import HttpProcessorConfig
    from processor.http.processor import HttpProcessor
    from tests.support.servers import serve_app

    async with serve_app(app) as url:
        processor = HttpProcessor(HttpProcessorConfig(handler_url=f"{url}/"))
        try:
            async with running(Watcher(store, processor, config)):
                yield
        finally:
            await processor.aclose()
