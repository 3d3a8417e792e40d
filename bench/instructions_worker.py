"""The drain the instructions scenario counts, in a process of its own (run under callgrind).

Runs one watcher at the default settings with a no-op processor until the given
number of partitions have closed, then stops. Nothing in it depends on how many
items the partitions hold, so two runs that differ only in their items differ
only by what those items cost.

    python -m bench.instructions_worker --db-url URL --prefix P --partitions N
"""

from __future__ import annotations

import argparse
import asyncio

from watcher import Hooks, Result, Store, Watcher, WatcherConfig, WorkItem


class Closed(Hooks):
    """Sets ``done`` when ``expected`` partitions have closed (a per-partition hook only, so
    the items take the engine's default path: no per-item hook calls)."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.closed = 0
        self.statuses: set[str] = set()
        self.done = asyncio.Event()

    def partition_closed(self, partition_id: str, status: str, *,
                         pipeline: str = "default") -> None:
        self.closed += 1
        self.statuses.add(status)
        if self.closed >= self.expected:
            self.done.set()


async def _noop(item: WorkItem) -> Result:
    return Result(done=True)


async def drain(db_url: str, prefix: str, partitions: int) -> None:
    """Drain the tables under ``prefix``.

    Raises:
        RuntimeError: a partition closed other than complete.
    """
    store = Store.open(db_url, prefix)
    hooks = Closed(partitions)
    watcher = Watcher(store, _noop, WatcherConfig(owner_id="bench-instructions"), hooks)
    running = asyncio.create_task(watcher.run())
    try:
        await hooks.done.wait()
    finally:
        await watcher.stop()
        await running
        await store.close()
    if hooks.statuses != {"complete"}:
        raise RuntimeError(f"partitions closed as {sorted(hooks.statuses)}")


def main() -> None:
    """Parse the arguments and drain."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db-url", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    args = parser.parse_args()
    asyncio.run(drain(args.db_url, args.prefix, args.partitions))


if __name__ == "__main__":
    main()
