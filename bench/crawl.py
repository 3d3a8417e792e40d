"""Crawl: a fan-out whose size is known only as it runs, then a fan-in, against Celery.

Each crawl is a tree: the root node finds ``fanout`` children, each of them
``fanout`` more, down to ``depth`` levels below the root; once every node is
visited, one reduce counts the nodes. Every result is checked (the exact count).

- statefeed, library mode: one partition per crawl, one in-process watcher at
  its defaults. A node's step spawns its children at gate 0 and moves itself to
  gate 1; gate 1 is a reduce gate, so the reduce runs once the whole tree has
  left gate 0 (the barrier includes every spawned node).
- Celery: a ``crawl_node`` task per node sends its children's tasks; the fan-in
  is what Celery users build by hand for a fan-out of unknown size (a chord's
  header is fixed when it is sent, and ``replace`` inside a chord loses the
  body): two Redis counters per crawl, and the node that finishes last sends
  ``crawl_reduce`` (:mod:`bench.celery_app`). Redis is broker and backend; the
  worker setups are the chord scenario's, and the best one counts.

The clock starts before the first crawl is created (or root sent) and stops
when the last crawl's reduce ran; each crawl's latency runs from its creation
to its reduce. Goals: statefeed leads by at least 5x in nodes per
second and in p99 crawl completion. PostgreSQL only, like the chord scenario.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from bench.celery_side import (
    STARTUP_TIMEOUT,
    STOP_TIMEOUT,
    CeleryClient,
    celery_unavailable,
    celery_version,
    delete_queue,
    redis_url,
    setup_label,
    shown_url,
    start_worker,
)
from bench.chord import ChordRun
from bench.common import (
    Goal,
    Outcome,
    Row,
    Settings,
    best_round,
    ms_text,
    rate_text,
    ratio,
    ratio_goal,
    settle_heap,
    statefeed_tables,
)
from bench.procs import Processes
from processor import AsyncClient, NewItem
from watcher import Result, Store, Watcher, WatcherConfig, WorkItem
from watcher.protocol import ProcessCall, ReduceCall, ReduceResult

TITLE = ("Crawl: {crawls} trees of {nodes:,} nodes (fan-out {fanout}, depth {depth}), "
         "visited by spawning, then a reduce counts them: statefeed vs Celery")
LEAD_GOAL = 5.0  # statefeed over the best Celery setup, nodes/s and p99, at least
POLL = 0.02


def tree_size(fanout: int, depth: int) -> int:
    """Nodes in a tree ``depth`` levels below its root, ``fanout`` children per node."""
    return sum(fanout ** level for level in range(depth + 1))


def crawl_step(fanout: int, depth: int) -> ProcessCall:
    """A node's step: spawn its children at gate 0, and go on to the reduce gate."""

    async def process(item: WorkItem) -> Result:
        children = ([NewItem(f"{item.id}.{n}", b"{}") for n in range(fanout)]
                    if item.id.count(".") < depth else [])
        return Result(gate=1, spawn=children)

    return process


class NodeCounter:
    """The reduce of gate 1: counts the nodes, and when each crawl's count came back."""

    def __init__(self) -> None:
        self.answered: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.awaited: set[str] = set()
        self.all_answered = asyncio.Event()

    def expect(self, partition_ids: set[str]) -> asyncio.Event:
        """The event set once every one of ``partition_ids`` has been reduced."""
        self.awaited = set(partition_ids)
        self.all_answered = asyncio.Event()
        return self.all_answered

    async def __call__(self, call: ReduceCall) -> ReduceResult:
        self.counts[call.partition_id] = len(call.items)
        self.answered[call.partition_id] = time.monotonic()
        if self.awaited <= self.answered.keys():
            self.all_answered.set()
        return ReduceResult(result=str(len(call.items)).encode())


async def statefeed_crawls(settings: Settings) -> ChordRun:
    """The crawls through one in-process watcher at its defaults.

    Raises:
        TimeoutError: not done within the phase timeout.
        RuntimeError: a crawl did not complete with the exact count.
    """
    sizes = settings.sizes
    fanout, depth = sizes.crawl_fanout, sizes.crawl_depth
    nodes = tree_size(fanout, depth)
    ids = [f"c{number:05d}" for number in range(sizes.crawl_count)]
    counter = NodeCounter()
    created: dict[str, float] = {}
    async with statefeed_tables(settings.db_url, "crawl") as prefix, \
            AsyncClient(settings.db_url, prefix) as client:
        store = Store.open(settings.db_url, prefix)
        watcher = Watcher(store, crawl_step(fanout, depth),
                          WatcherConfig(owner_id="bench-crawl"), reduce=counter)
        running = asyncio.create_task(watcher.run())
        try:
            warm = counter.expect({"warmup"})
            await client.create_partition("warmup", [NewItem("n", b"{}")], reduce_gates=[1])
            await asyncio.wait_for(warm.wait(), STARTUP_TIMEOUT)
            settle_heap()
            finished = counter.expect(set(ids))
            started = time.monotonic()
            for pid in ids:
                created[pid] = time.monotonic()
                await client.create_partition(pid, [NewItem("n", b"{}")], reduce_gates=[1])
            await asyncio.wait_for(finished.wait(), sizes.phase_timeout)
        finally:
            await watcher.stop()
            await running
            await store.close()
    wrong = {pid: counter.counts[pid] for pid in ids if counter.counts[pid] != nodes}
    if wrong:
        raise RuntimeError(f"statefeed crawl: wrong node counts {wrong} (expected {nodes})")
    return ChordRun("statefeed library mode (1 watcher, defaults)", len(ids), len(ids) * nodes,
                    max(counter.answered.values()) - started,
                    tuple(counter.answered[pid] - created[pid] for pid in ids), {})


def celery_crawls(queue: str, crawls: list[str], fanout: int, depth: int, timeout: float,
                  stopping: Any) -> tuple[float, dict[str, float], dict[str, tuple[int, float]]]:
    """Send every crawl's root, wait for every crawl's reduce; returns the start, when each
    crawl began and each one's (node count, time its reduce ran).

    Raises:
        TimeoutError: a crawl did not finish within ``timeout`` s.
        RuntimeError: ``stopping`` was set.
    """
    from bench.celery_app import app, crawl_start

    client = app.backend.client
    keys = {crawl: f"bench-crawl:{crawl}:result" for crawl in crawls}
    client.delete(*keys.values())
    deadline = time.monotonic() + timeout
    created: dict[str, float] = {}
    settle_heap()
    started = time.monotonic()
    for crawl in crawls:
        created[crawl] = time.monotonic()
        crawl_start(crawl, depth, fanout, queue)
    results: dict[str, tuple[int, float]] = {}
    while len(results) < len(crawls):
        if stopping.is_set():
            raise RuntimeError("the Celery client was stopped")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(crawls) - len(results)} Celery crawls unfinished")
        for crawl, key in keys.items():
            if crawl not in results and (value := client.get(key)) is not None:
                count, done_at = value.decode().split()
                results[crawl] = (int(count), float(done_at))
        time.sleep(POLL)
    client.delete(*keys.values())
    return started, created, results


async def celery_runs(settings: Settings, procs: Processes, client: CeleryClient,
                      setup: str) -> list[ChordRun]:
    """Start a worker of ``setup``, warm it up, run the rounds, stop it and delete its queue.

    Raises:
        RuntimeError: the worker exited, or a count is wrong.
        TimeoutError: the crawls did not finish in time.
    """
    sizes = settings.sizes
    fanout, depth = sizes.crawl_fanout, sizes.crawl_depth
    nodes = tree_size(fanout, depth)
    _, _, label = setup_label(setup)
    queue = f"bench-crawl-{uuid.uuid4().hex[:8]}"
    worker = await start_worker(procs, setup, queue)
    runs: list[ChordRun] = []

    async def crawls(names: list[str], timeout: float) -> Any:  # noqa: ASYNC109
        work = asyncio.ensure_future(client.call(celery_crawls, queue, names, fanout, depth,
                                                 timeout, client.stopping))
        try:
            while not work.done():
                await asyncio.wait([work], timeout=0.2)
                if not worker.running and not work.done():
                    raise RuntimeError(f"the Celery worker ({label}) exited "
                                       f"({worker.process.returncode}):\n{worker.log()[-2000:]}")
        except BaseException:
            client.stop()
            work.add_done_callback(lambda done: done.cancelled() or done.exception())
            raise
        return work.result()

    try:
        await crawls([f"warmup-{queue}"], STARTUP_TIMEOUT)
        for round_ in range(settings.rounds):
            names = [f"{queue}-r{round_}-c{number:05d}" for number in range(sizes.crawl_count)]
            started, created, results = await crawls(names, sizes.phase_timeout)
            wrong = {name: count for name, (count, _) in results.items() if count != nodes}
            if wrong:
                raise RuntimeError(f"Celery crawl: wrong node counts {wrong} (expected {nodes})")
            runs.append(ChordRun(
                f"Celery ({label}), Redis counters", len(names), len(names) * nodes,
                max(done for _, done in results.values()) - started,
                tuple(results[name][1] - created[name] for name in names), {"setup": setup}))
    finally:
        await worker.terminate(STOP_TIMEOUT)
        await asyncio.to_thread(delete_queue, queue, "redis")
    return runs


async def run(settings: Settings) -> Outcome:
    """The crawl scenario (see the module docstring)."""
    sizes = settings.sizes
    nodes = tree_size(sizes.crawl_fanout, sizes.crawl_depth)
    outcome = Outcome("crawl", TITLE.format(crawls=sizes.crawl_count, nodes=nodes,
                                            fanout=sizes.crawl_fanout,
                                            depth=sizes.crawl_depth))
    library = best_round([await statefeed_crawls(settings) for _ in range(settings.rounds)])
    skipped = await asyncio.to_thread(celery_unavailable)
    celery_best: list[ChordRun] = []
    if skipped is None:
        client = CeleryClient()
        try:
            async with Processes(settings.work_dir) as procs:
                for setup in sizes.celery_setups:
                    celery_best.append(best_round(await celery_runs(settings, procs, client,
                                                                    setup)))
        finally:
            client.stop()
    best = max(celery_best, key=lambda run: run.per_second, default=None)
    quickest = min(celery_best, key=lambda run: run.p99, default=None)
    lead = ratio(library.per_second, best.per_second if best else None)
    p99_lead = ratio(quickest.p99 if quickest else None, library.p99)
    outcome.rows.append(Row(library.system, rate_text(library.per_second, "nodes/s"),
                            library.detail()))
    version = celery_version() if skipped is None else ""
    for celery_run in celery_best:
        outcome.rows.append(Row(celery_run.system.replace("Celery", f"Celery {version}"),
                                rate_text(celery_run.per_second, "nodes/s"),
                                celery_run.detail()))
    if skipped is not None:
        outcome.rows.append(Row("Celery", "skipped", skipped))
    if lead is not None and p99_lead is not None and best and quickest:
        outcome.rows.append(Row("statefeed / best Celery, nodes/s", f"{lead:.2f}x",
                                f"best: {best.system}"))
        outcome.rows.append(Row("best Celery p99 / statefeed p99", f"{p99_lead:.2f}x",
                                f"{ms_text(quickest.p99)} vs {ms_text(library.p99)}"))
    outcome.figures = {
        "crawls": sizes.crawl_count, "nodes_per_crawl": nodes, "fanout": sizes.crawl_fanout,
        "depth": sizes.crawl_depth, "statefeed_library": library.as_json(),
        "celery": ({"skipped": skipped} if skipped is not None else
                   {"version": version, "redis": shown_url(redis_url()),
                    "setups": [run.as_json() for run in celery_best]}),
        "lead_nodes_per_second": None if lead is None else round(lead, 3),
        "lead_p99": None if p99_lead is None else round(p99_lead, 3),
    }
    outcome.goals.append(ratio_goal("crawl: statefeed vs best Celery, nodes/s", lead,
                                    LEAD_GOAL))
    outcome.goals.append(Goal("crawl: best Celery p99 / statefeed p99", f">= {LEAD_GOAL:g}x",
                              "-" if p99_lead is None else f"{p99_lead:.2f}x",
                              None if p99_lead is None else p99_lead >= LEAD_GOAL))
    return outcome
