"""The big-gate scenario's reducer, in a process of its own so its memory is measured alone.

Runs one watcher (defaults, the ranking reduce of :mod:`bench.ranking`) over a
prepared table prefix until the given partition closed, and writes JSON: the
reduce's duration (first reduce call -> partition closed), the calls per pass,
CPU time per item, and the process's resident memory before the reduce, at its
peak during it, and after it.

The peak is the kernel's VmHWM, reset just before the watcher starts
(``/proc/self/clear_refs``), so imports and start-up do not count; where the
reset is refused it is the highest of RSS samples taken every 10 ms.

    python -m bench.reduce_worker --db-url URL --prefix P --partition big --out F
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import time
from pathlib import Path
from typing import Any

from bench.common import cpu_seconds, rss_bytes
from bench.ranking import LibraryRanker
from watcher import Hooks, Result, Store, Watcher, WatcherConfig, WorkItem

MB = 1024 * 1024
SAMPLE_EVERY = 0.01


class Closed(Hooks):
    """Sets ``done`` when the partition closes."""

    def __init__(self, partition_id: str) -> None:
        self.partition_id = partition_id
        self.status = ""
        self.at = 0.0
        self.done = asyncio.Event()

    def partition_closed(self, partition_id: str, status: str, *,
                         pipeline: str = "default") -> None:
        if partition_id == self.partition_id:
            self.status, self.at = status, time.monotonic()
            self.done.set()


async def _unexpected_step(item: WorkItem) -> Result:
    raise AssertionError(f"item {item.id!r} reached the per-item step; it sits at a reduce gate")


def reset_peak_rss() -> bool:
    """Reset this process's VmHWM (Linux 4.0+); whether the kernel took it."""
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """This process's VmHWM, or 0 where ``/proc`` does not say."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


async def reduce(args: argparse.Namespace) -> dict[str, Any]:
    """Reduce the partition; return the figures.

    Raises:
        TimeoutError: not closed within ``args.timeout`` s.
        RuntimeError: the partition closed other than complete.
    """
    store = Store.open(args.db_url, args.prefix)
    hooks = Closed(args.partition)
    ranker = LibraryRanker()
    config = WatcherConfig(owner_id="bench-reduce")
    watcher = Watcher(store, _unexpected_step, config, hooks, reduce=ranker)
    await store.ping()  # connect first: the baseline includes the connection pool
    gc.collect()
    highest = 0

    async def sample() -> None:
        nonlocal highest
        while True:
            highest = max(highest, rss_bytes())
            await asyncio.sleep(SAMPLE_EVERY)

    start_rss = rss_bytes()
    reset = reset_peak_rss()
    sampler = asyncio.create_task(sample())
    cpu_started = cpu_seconds()
    running = asyncio.create_task(watcher.run())
    try:
        async with asyncio.timeout(args.timeout):
            await hooks.done.wait()
        cpu = cpu_seconds() - cpu_started
    finally:
        await watcher.stop()
        await running
        sampler.cancel()
        await store.close()
    if hooks.status != "complete":
        raise RuntimeError(f"partition {args.partition!r} closed {hooks.status!r}")
    first = ranker.first_call[args.partition]
    peak = max(peak_rss_bytes(), highest) if reset else highest
    sampled = f"sampled every {SAMPLE_EVERY * 1000:g} ms"
    return {
        "seconds": round(hooks.at - first, 4),
        "reduce_seconds": round(ranker.answered[args.partition] - first, 4),
        "calls": dict(ranker.calls), "pages": sum(ranker.calls.values()),
        "reduce_page_items": config.reduce_page_items,
        "cpu_seconds": round(cpu, 3),
        "rss_mb": {"start": round(start_rss / MB, 1), "peak": round(peak / MB, 1),
                   "end": round(rss_bytes() / MB, 1),
                   "peak_source": "VmHWM" if reset else sampled},
    }


def main() -> None:
    """Parse the options, reduce, write the JSON figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db-url", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--partition", required=True)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    figures = asyncio.run(reduce(args))
    args.out.write_text(json.dumps(figures))


if __name__ == "__main__":
    main()
