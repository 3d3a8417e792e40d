"""Spawn a large fan-out in pages, in library mode on SQLite, and watch memory stay flat.

    python examples/paging_producer.py [files] [database file]

One "listing" item stands for a folder of ``files`` files (100,000 unless told).
Each call of its step spawns the next page of at most PAGE children and answers
at the same gate, not done, with its cursor in its own data, so it is called
again for the next page; the last page completes it. Each child is one file's
step. The processor runs in this process, and the script prints its resident
memory as the children go in: it stays flat, whatever the number of files,
because no call holds more than one page.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from processor import AsyncClient, NewItem
from watcher import Result, Watcher, WatcherConfig, WorkItem
from watcher.store import Store
from watcher.store.db.migrate import upgrade

PAGE = 1000  # the processor's default --max-spawn: the most one answer may carry
REPORT_EVERY = 0.5  # seconds


async def step(item: WorkItem) -> Result:
    """The listing spawns its next page of files; a file's step completes it."""
    if item.id != "listing":
        return Result(done=True)  # one file's work would go here
    state = json.loads(item.data)
    start, total = state["cursor"], state["files"]
    end = min(start + PAGE, total)
    files = [NewItem(f"file-{n:07d}", json.dumps({"n": n}).encode())
             for n in range(start, end)]
    cursor = json.dumps({"files": total, "cursor": end}).encode()
    return Result(done=end == total, data=cursor, spawn=files)


def resident_mb() -> float:
    """This process's resident memory in MB (Linux ``/proc``; 0 elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


async def main(files: int, database: Path) -> int:
    db_url = f"sqlite:///{database}"
    upgrade(db_url)
    store = Store.open(db_url)
    watcher = Watcher(store, step, WatcherConfig(owner_id="paging", max_spawn=PAGE))
    started = time.monotonic()
    async with AsyncClient(db_url) as client:
        await client.create_partition("folder", [NewItem(
            "listing", json.dumps({"files": files, "cursor": 0}).encode())])
        running = asyncio.create_task(watcher.run())
        try:
            info = await client.partition("folder")
            while info.status == "available":
                await asyncio.sleep(REPORT_EVERY)
                info = await client.partition("folder")
                print(f"rss {resident_mb():6.1f} MB  spawned {info.spawned:>7}/{files}  "
                      f"complete {info.counts.get('complete', 0):>7}", flush=True)
        finally:
            await watcher.stop()
            await running
            await store.close()
    seconds = time.monotonic() - started
    if info.status != "complete" or info.spawned != files:
        print(f"the folder ended {info.status} with {info.spawned} children", file=sys.stderr)
        return 1
    print(f"done: {files} children complete in {seconds:.1f} s "
          f"({files / seconds:,.0f} per second); rss {resident_mb():.1f} MB")
    return 0


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(scratch) / "paging.db"
        sys.exit(asyncio.run(main(count, path)))
