"""The scale scenario's drain, in a process of its own so its memory can be measured alone.

Runs one watcher with a no-op processor over a prepared table prefix until
every partition closed, and writes JSON: the drain time, the process's
resident memory before the start and when 10 % and 90 % of the items were
complete, its peak, and the SQL statements the watcher's engine sent.

    python -m bench.scale_worker --db-url URL --prefix P --partitions N --items M --out F
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import time
from pathlib import Path
from typing import Any

from bench.common import rss_bytes
from bench.counting import DrainHooks, StatementCounter
from watcher import Result, Store, Watcher, WatcherConfig, WorkItem

MB = 1024 * 1024
MARKS = (0.1, 0.9)


async def _noop(item: WorkItem) -> Result:
    return Result(done=True)


async def drain(args: argparse.Namespace) -> dict[str, Any]:
    """Drain the prefix; return the figures. Raises TimeoutError after ``args.timeout`` s."""
    store = Store.open(args.db_url, args.prefix)
    counter = StatementCounter(store)
    rss: dict[str, float] = {}
    at = {round(mark * args.items): f"at_{round(mark * 100)}pct" for mark in MARKS}

    def on_complete(done: int) -> None:
        label = at.get(done)
        if label is not None:
            rss[label] = rss_bytes() / MB

    hooks = DrainHooks(args.partitions, counter, on_complete)
    config = WatcherConfig(owner_id="bench-scale", concurrency=args.concurrency)
    watcher = Watcher(store, _noop, config, hooks)
    await store.ping()  # connect first: the baseline includes the connection pool
    gc.collect()
    rss["start"] = rss_bytes() / MB
    started = time.perf_counter()
    running = asyncio.create_task(watcher.run())
    try:
        async with asyncio.timeout(args.timeout):
            await hooks.done.wait()
    finally:
        await watcher.stop()
        await running
        counter.close()
        await store.close()
    assert hooks.finished_at is not None and hooks.statements_at_end is not None
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "seconds": round(hooks.finished_at - started, 4),
        "items": hooks.completed_items, "partitions_closed": hooks.closed,
        "failed_partitions": hooks.failed, "other_outcomes": dict(hooks.other_outcomes),
        "rss_mb": {key: round(value, 1) for key, value in rss.items()} | {
            "peak": round(peak_kb / 1024, 1)},
        "statements": hooks.statements_at_end,
        "statements_by_kind": hooks.kinds_at_end,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db-url", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--items", type=int, required=True, help="items in all")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    figures = asyncio.run(drain(args))
    args.out.write_text(json.dumps(figures))


if __name__ == "__main__":
    main()
