"""One processor of the fleet scenario, in a process of its own.

Opens its store and connects it (the engine and the driver), touches its ready file,
then waits for SIGUSR1, the go (so that every processor of the fleet starts at once,
imports and connections done), runs one watcher at the default settings
with a no-op processor until SIGTERM, and writes JSON: the CPU time (user +
system) this process spent from the go to the stop, the items it completed, the
statements it sent, and the leases it took, stole and lost.

    python -m bench.fleet_worker --db-url URL --prefix P --owner W --ready F --out F
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from pathlib import Path

from sqlalchemy.engine import make_url

from bench.counting import StatementCounter
from watcher import Hooks, Result, Store, Watcher, WatcherConfig, WorkItem


class Completed(Hooks):
    """Counts the items this processor completed, and the leases it took, stole and lost."""

    def __init__(self) -> None:
        self.items = 0
        self.taken = 0
        self.stolen = 0
        self.lost = 0

    def item_outcome(self, partition_id: str, item_id: str, gate: int, outcome: str,
                     seconds: float, *, pipeline: str = "default") -> None:
        if outcome == "complete":
            self.items += 1

    def lease_acquired(self, partition_id: str, *, stolen_from: str | None) -> None:
        if stolen_from is None:
            self.taken += 1
        else:
            self.stolen += 1

    def lease_lost(self, partition_id: str) -> None:
        self.lost += 1


async def _noop(item: WorkItem) -> Result:
    return Result(done=True)


async def serve(args: argparse.Namespace) -> dict[str, float | int]:
    """Run until SIGTERM; return the figures."""
    # Named after the processor, so that the benchmark finds its database sessions.
    url = make_url(args.db_url)
    if url.get_backend_name() == "postgresql" and "application_name" not in url.query:
        url = url.update_query_dict({"application_name": args.owner})
    store = Store.open(url.render_as_string(hide_password=False), args.prefix)
    hooks = Completed()
    watcher = Watcher(store, _noop, WatcherConfig(owner_id=args.owner), hooks)
    stop, go = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, go.set)
    # Connected before the go: the engine's first connection (dialect set-up) and the
    # driver's are paid once in a processor's life, not per item.
    await store.ping()
    await store.leases_read_free(1)
    await asyncio.to_thread(Path(args.ready).touch)
    await go.wait()
    counter = StatementCounter(store)
    cpu_started = time.process_time()
    running = asyncio.create_task(watcher.run())
    await stop.wait()
    cpu = time.process_time() - cpu_started
    await watcher.stop()
    await running
    counter.close()
    await store.close()
    return {"cpu_seconds": cpu, "items": hooks.items, "stopped_at": time.time(),
            "statements": counter.total, "leases_taken": hooks.taken,
            "leases_stolen": hooks.stolen, "leases_lost": hooks.lost}


def main() -> None:
    """Parse the arguments, serve, write the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    for name in ("--db-url", "--prefix", "--owner", "--ready", "--out"):
        parser.add_argument(name, required=True)
    args = parser.parse_args()
    figures = asyncio.run(serve(args))
    Path(args.out).write_text(json.dumps(figures))


if __name__ == "__main__":
    main()
