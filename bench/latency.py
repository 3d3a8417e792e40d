"""Latency: insert -> first dispatch, and gate advance, with an idle watcher.

One in-process watcher runs with ``poll_interval`` 1 s (so polling alone would
give about 500 ms). Partitions are created one at a time, each with a few
items that go from gate 0 to gate 1 and then complete; the next one is created
only after the previous one closed, after a random pause, so nothing lines up
with the poll loop.

- insert -> first dispatch: from the moment ``create_partition`` returned (its
  transaction committed) to the processor's first call for an item of it;
- gate advance: from the last gate-0 result written (hook ``item_outcome``) to
  the first gate-1 dispatch (hook ``item_dispatched``).

Every timestamp is ``time.perf_counter()`` in this one process.

PostgreSQL wakes the watcher with LISTEN/NOTIFY as a client commits; the other
databases carry no notifications, so there the first dispatch waits for the
next poll (about half the poll interval on average). Both latencies are
measured everywhere; the 10 ms goal on insert -> first dispatch is checked only
where the database notifies, and the table says which wake-ups were used.
"""

from __future__ import annotations

import asyncio
import random
import time

from bench.common import (
    Goal,
    Outcome,
    Row,
    Settings,
    ms_text,
    percentile,
    statefeed_tables,
    summary_ms,
)
from processor import AsyncClient, NewItem
from watcher import Hooks, Result, Store, Watcher, WatcherConfig, WorkItem

TITLE = ("Latency ({database}): insert -> first dispatch, gate advance; idle watcher, "
         "poll {poll:g} s")
ITEMS_PER_PARTITION = 3
GOAL_MS = 10.0
WARMUP_PARTITIONS = 2


class LatencyHooks(Hooks):
    """Timestamps of the events the gate-advance latency is made of."""

    def __init__(self) -> None:
        self.last_outcome: dict[tuple[str, int], float] = {}
        self.first_dispatch: dict[tuple[str, int], float] = {}
        self.closed: dict[str, asyncio.Event] = {}

    def item_dispatched(self, partition_id: str, item_id: str, gate: int, *,
                        pipeline: str = "default") -> None:
        self.first_dispatch.setdefault((partition_id, gate), time.perf_counter())

    def item_outcome(self, partition_id: str, item_id: str, gate: int, outcome: str,
                     seconds: float, *, pipeline: str = "default") -> None:
        self.last_outcome[(partition_id, gate)] = time.perf_counter()

    def partition_closed(self, partition_id: str, status: str, *,
                         pipeline: str = "default") -> None:
        self.closed.setdefault(partition_id, asyncio.Event()).set()


class TwoGates:
    """Gate 0 moves each item to gate 1; gate 1 completes it. Records its first call."""

    def __init__(self) -> None:
        self.first_call: dict[str, float] = {}

    async def process(self, item: WorkItem) -> Result:
        self.first_call.setdefault(item.partition_id, time.perf_counter())
        return Result(gate=1) if item.gate == 0 else Result(done=True)


async def run(settings: Settings) -> Outcome:
    """The latency scenario (see the module docstring)."""
    sizes = settings.sizes
    outcome = Outcome("latency", TITLE.format(database=settings.database_title,
                                              poll=sizes.latency_poll))
    hooks = LatencyHooks()
    processor = TwoGates()
    inserted: dict[str, float] = {}
    insert_latency: list[float] = []
    advance_latency: list[float] = []
    async with statefeed_tables(settings.db_url, "lat") as prefix:
        store = Store.open(settings.db_url, prefix)
        config = WatcherConfig(owner_id="bench-latency", poll_interval=sizes.latency_poll,
                               lease_duration=max(30.0, sizes.latency_poll * 4))
        watcher = Watcher(store, processor, config, hooks)
        running = asyncio.create_task(watcher.run())
        try:
            async with AsyncClient(settings.db_url, prefix) as client:
                await asyncio.sleep(0.2)  # let the watcher start listening
                for number in range(WARMUP_PARTITIONS + sizes.latency_samples):
                    pid = f"p{number:05d}"
                    hooks.closed[pid] = asyncio.Event()
                    items = [NewItem(f"i{index}", b"{}") for index in range(ITEMS_PER_PARTITION)]
                    await client.create_partition(pid, items)
                    inserted[pid] = time.perf_counter()
                    async with asyncio.timeout(max(10.0, sizes.latency_poll * 5)):
                        await hooks.closed[pid].wait()
                    if number >= WARMUP_PARTITIONS:
                        insert_latency.append(processor.first_call[pid] - inserted[pid])
                        advance_latency.append(hooks.first_dispatch[(pid, 1)]
                                               - hooks.last_outcome[(pid, 0)])
                    # Idle for a random while, so samples fall anywhere in the poll cycle.
                    await asyncio.sleep(random.uniform(0.05, 0.25))
        finally:
            await watcher.stop()
            await running
            await store.close()
    notifies = store.notifies
    for name, samples, key in (("insert -> first dispatch", insert_latency, "insert_to_dispatch"),
                               ("gate advance", advance_latency, "gate_advance")):
        p50, p99 = percentile(samples, 50), percentile(samples, 99)
        outcome.rows.append(Row(f"{name} p50 / p99", f"{ms_text(p50)} / {ms_text(p99)}",
                                f"{len(samples)} samples, max {ms_text(max(samples))}"))
        outcome.figures[key] = summary_ms(samples)
        # Without notifications the first dispatch waits for a poll: the goal assumes them.
        if notifies or key != "insert_to_dispatch":
            outcome.goals.append(Goal(f"{name} p50", f"<= {GOAL_MS:g} ms", ms_text(p50),
                                      p50 * 1000 <= GOAL_MS))
    outcome.figures.update(poll_interval_s=sizes.latency_poll,
                           items_per_partition=ITEMS_PER_PARTITION,
                           listen_notify=notifies)
    outcome.rows.append(Row(
        "wake-ups", "LISTEN/NOTIFY" if notifies else "polling only",
        f"poll interval {sizes.latency_poll:g} s" if notifies else
        f"poll interval {sizes.latency_poll:g} s: {settings.database_title} carries no "
        f"notifications, so insert -> first dispatch waits for a poll (its goal is "
        f"PostgreSQL's)"))
    return outcome
