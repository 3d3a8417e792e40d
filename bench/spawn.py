"""Spawn: items inserted through answers against the client's ``add_items``, on one database.

Both insert the same children in the same pieces (``spawn_page`` per call, the
default ``--max-spawn``), into one partition per producer:

- ``add_items``: the client adds each page of children to its partition, pages
  of different partitions in parallel (one per producer), as a producer outside
  statefeed would;
- spawn: each partition holds one producer item; an in-process watcher at the
  default settings calls it once per page, and its answer spawns the page (at
  gate 1, so the children wait there and the figure is the insert, not their
  processing) and asks to run again, with the cursor in its data, until the
  last page. The clock stops when the hook ``items_spawned`` has counted every
  child (the answers written).

The figure is children per second, and per child the ratio of the two costs.
The goal: spawning costs at most 1.5x the client insert per child.
"""

from __future__ import annotations

import asyncio
import json
import time

from bench.common import (
    Goal,
    Outcome,
    Row,
    Settings,
    rate_text,
    statefeed_tables,
)
from processor import AsyncClient, NewItem
from watcher import Hooks, Result, Store, Watcher, WatcherConfig, WorkItem
from watcher.protocol import ProcessCall

TITLE = ("Spawn ({database}): {children:,} children in pages of {page:,} through answers, "
         "against the client's add_items")
COST_GOAL = 1.5  # spawn cost per child / add_items cost per child, at most


class SpawnCount(Hooks):
    """Counts the children spawned; ``all_in`` is set once ``expected`` are written."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.spawned = 0
        self.all_in = asyncio.Event()

    def items_spawned(self, partition_id: str, count: int, *,
                      pipeline: str = "default") -> None:
        self.spawned += count
        if self.spawned >= self.expected:
            self.all_in.set()


def producer(page: int, total: int) -> ProcessCall:
    """The producers' step: spawn the next page at gate 1, keep the cursor."""

    async def process(item: WorkItem) -> Result:
        cursor = json.loads(item.data)["cursor"]
        end = min(cursor + page, total)
        children = [NewItem(f"c{n:07d}", b'{"n":0}', 1) for n in range(cursor, end)]
        return Result(done=end == total, data=json.dumps({"cursor": end}).encode(),
                      spawn=children)

    return process


async def add_items_rate(db_url: str, producers: int, per_producer: int, page: int) -> float:
    """Children per second added by the client, a page per call, producers in parallel."""
    async with statefeed_tables(db_url, "spa") as prefix, AsyncClient(db_url, prefix) as client:
        ids = [f"p{number:04d}" for number in range(producers)]
        for pid in ids:
            await client.create_partition(pid, [NewItem("seed", b"{}")])

        async def fill(pid: str) -> None:
            for start in range(0, per_producer, page):
                await client.add_items(pid, [
                    NewItem(f"c{n:07d}", b'{"n":0}', 1)
                    for n in range(start, min(start + page, per_producer))])

        started = time.perf_counter()
        await asyncio.gather(*(fill(pid) for pid in ids))
        seconds = time.perf_counter() - started
    return producers * per_producer / seconds


async def spawn_rate(db_url: str, producers: int, per_producer: int, page: int) -> float:
    """Children per second spawned by producers' answers through an in-process watcher."""
    async with statefeed_tables(db_url, "sps") as prefix, AsyncClient(db_url, prefix) as client:
        for number in range(producers):
            await client.create_partition(f"p{number:04d}", [
                NewItem("producer", json.dumps({"cursor": 0}).encode())])
        hooks = SpawnCount(producers * per_producer)
        store = Store.open(db_url, prefix)
        watcher = Watcher(store, producer(page, per_producer),
                          WatcherConfig(owner_id="bench-spawn", max_spawn=page), hooks)
        started = time.perf_counter()
        running = asyncio.create_task(watcher.run())
        try:
            await asyncio.wait_for(hooks.all_in.wait(), timeout=600)
            seconds = time.perf_counter() - started
        finally:
            await watcher.stop()
            await running
            await store.close()
    return producers * per_producer / seconds


async def run(settings: Settings) -> Outcome:
    """The spawn scenario (see the module docstring)."""
    sizes = settings.sizes
    producers, page = sizes.partitions, sizes.spawn_page
    per_producer = max(page, sizes.spawn_children // producers)
    children = producers * per_producer
    outcome = Outcome("spawn", TITLE.format(database=settings.database_title,
                                            children=children, page=page))
    added, spawned = [], []
    for _ in range(settings.rounds):  # interleaved; the best of each counts
        added.append(await add_items_rate(settings.db_url, producers, per_producer, page))
        spawned.append(await spawn_rate(settings.db_url, producers, per_producer, page))
    add_best, spawn_best = max(added), max(spawned)
    cost = add_best / spawn_best
    outcome.rows += [
        Row("client add_items", rate_text(add_best, "children/s"),
            f"{producers} partitions in parallel, {page:,} per call"),
        Row("spawn through answers", rate_text(spawn_best, "children/s"),
            f"{producers} producers, {page:,} per answer, in-process watcher"),
        Row("cost per child, spawn / add_items", f"{cost:.2f}x",
            "1.0x: as cheap as the client insert"),
    ]
    outcome.figures.update(children=children, page=page, producers=producers,
                           add_items_per_second=round(add_best, 1),
                           spawn_per_second=round(spawn_best, 1),
                           rounds={"add_items": [round(r, 1) for r in added],
                                   "spawn": [round(r, 1) for r in spawned]},
                           cost_ratio=round(cost, 3))
    outcome.goals.append(Goal("spawn cost per child vs add_items", f"<= {COST_GOAL:g}x",
                              f"{cost:.2f}x", cost <= COST_GOAL))
    return outcome

