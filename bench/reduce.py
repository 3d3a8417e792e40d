"""Reduce gates on PostgreSQL: fan-in latency, and a big gate reduced in bounded memory.

Fan-in latency (``fanin``): one in-process watcher at its defaults. Partitions
are created one at a time, each with N items (10,000 by default) that a
per-item step scores at gate 0 and a reduce ranks at gate 1
(:mod:`bench.ranking`; a gate over ``reduce_page_items``, 1,000 by default,
goes in two passes of pages). The next partition is created only after the
previous one closed. From the moment the last gate-0 result was written (hook
``item_outcome``), it measures:

- -> reduce called: the barrier (the gate steps on, the reduce's first read);
- -> reduce answered: the last reduce call (the one call, or the last apply
  page) returned;
- -> partition complete: the last page written, the partition closed (hook
  ``partition_closed``).

Big gate (``reduce``): a partition whose N items are inserted straight at the
reduce gate 0 (10,000, then 100,000 by default), reduced by one watcher in a
process of its own (:mod:`bench.reduce_worker`), so its memory is measured
alone: its resident memory before the reduce and its peak during it (VmHWM,
reset just before), the reduce's duration and rate. Every result is checked
against the one computed here.

Every timestamp is ``time.monotonic()`` (one clock for every process).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from bench.common import (
    PYTHON,
    Goal,
    Outcome,
    Row,
    Settings,
    ms_text,
    percentile,
    statefeed_tables,
    summary_ms,
)
from bench.procs import Processes
from bench.ranking import (
    LibraryRanker,
    check_result,
    item_id,
    library_step,
    number_data,
    score_data,
)
from processor import AsyncClient, NewItem
from watcher import Hooks, Store, Watcher, WatcherConfig
from watcher.config import DEFAULT_REDUCE_PAGE_ITEMS

TITLE_FANIN = ("Fan-in latency (PostgreSQL, library mode, defaults): last gate-0 result written "
               "-> reduce -> partition complete")
TITLE_BIG = "Big reduce gate (PostgreSQL): fold + apply pages, the reducing process's memory"
WARMUP_ITEMS = 20
RSS_BOUNDED = 0.10  # bench criterion: peak RSS at the largest gate within 10 % of the smallest's


class FanInHooks(Hooks):
    """When each partition's last gate-0 result was written, and when it closed."""

    def __init__(self) -> None:
        self.last_settled: dict[str, float] = {}
        self.closed: dict[str, tuple[float, str]] = {}
        self.events: dict[str, asyncio.Event] = {}

    def item_outcome(self, partition_id: str, item_id: str, gate: int, outcome: str,
                     seconds: float, *, pipeline: str = "default") -> None:
        if gate == 0:
            self.last_settled[partition_id] = time.monotonic()

    def partition_closed(self, partition_id: str, status: str, *,
                         pipeline: str = "default") -> None:
        self.closed[partition_id] = (time.monotonic(), status)
        self.events.setdefault(partition_id, asyncio.Event()).set()


def _items(count: int, data: Any, gate: int = 0) -> list[NewItem]:
    return [NewItem(item_id(number), data(number), gate) for number in range(count)]


async def run_fanin(settings: Settings) -> Outcome:
    """The fan-in latency scenario (see the module docstring)."""
    sizes = settings.sizes
    outcome = Outcome("fanin", TITLE_FANIN)
    count = sizes.fanin_items
    hooks = FanInHooks()
    ranker = LibraryRanker()
    samples: dict[str, list[float]] = {"to_reduce_called": [], "to_reduce_answered": [],
                                       "to_complete": [], "reduce_seconds": [],
                                       "gate0_seconds": []}
    async with statefeed_tables(settings.db_url, "fanin") as prefix:
        store = Store.open(settings.db_url, prefix)
        watcher = Watcher(store, library_step, WatcherConfig(owner_id="bench-fanin"), hooks,
                          reduce=ranker)
        running = asyncio.create_task(watcher.run())
        try:
            async with AsyncClient(settings.db_url, prefix) as client:
                await asyncio.sleep(0.2)  # let the watcher start listening
                for number in range(1 + sizes.fanin_samples):  # the first one warms up
                    pid = f"p{number:05d}"
                    size = WARMUP_ITEMS if number == 0 else count
                    hooks.events[pid] = asyncio.Event()
                    await client.create_partition(pid, _items(size, number_data),
                                                  reduce_gates=[1])
                    created = time.monotonic()
                    async with asyncio.timeout(sizes.phase_timeout):
                        await hooks.events[pid].wait()
                    closed, status = hooks.closed[pid]
                    info = await client.partition(pid)
                    if status != "complete" or info.counts != {"complete": size}:
                        raise RuntimeError(f"fan-in partition {pid}: {status}, items "
                                           f"{info.counts}, last error {info.last_error!r}")
                    check_result(pid, info.result_json(), range(size))
                    if number == 0:
                        continue
                    settled = hooks.last_settled[pid]
                    samples["to_reduce_called"].append(ranker.first_call[pid] - settled)
                    samples["to_reduce_answered"].append(ranker.answered[pid] - settled)
                    samples["to_complete"].append(closed - settled)
                    samples["reduce_seconds"].append(ranker.answered[pid]
                                                     - ranker.first_call[pid])
                    samples["gate0_seconds"].append(settled - created)
        finally:
            await watcher.stop()
            await running
            await store.close()
    page_items = DEFAULT_REDUCE_PAGE_ITEMS
    pages = -(-count // page_items)
    shape = ("one call" if pages == 1
             else f"fold + apply, {pages} pages of {page_items:,} each")
    for key, what in (("to_reduce_called", "gate-0 settled -> reduce called"),
                      ("to_reduce_answered", "gate-0 settled -> reduce answered"),
                      ("to_complete", "gate-0 settled -> partition complete")):
        values = samples[key]
        outcome.rows.append(Row(f"{what} p50 / p99",
                                f"{ms_text(percentile(values, 50))} / "
                                f"{ms_text(percentile(values, 99))}",
                                f"{len(values)} partitions of {count:,} items; "
                                f"max {ms_text(max(values))}"))
    reduce_p50 = percentile(samples["reduce_seconds"], 50)
    gate0_p50 = percentile(samples["gate0_seconds"], 50)
    outcome.rows.append(Row("the reduce itself (first call -> last answer) p50",
                            ms_text(reduce_p50),
                            f"{shape}; {count / reduce_p50:,.0f} items/s"))
    outcome.rows.append(Row("gate 0 (created -> last item written) p50", ms_text(gate0_p50),
                            f"{count / gate0_p50:,.0f} items/s, concurrency 32 (default)"))
    outcome.figures = {
        "items_per_gate": count, "partitions": sizes.fanin_samples,
        "reduce_page_items": page_items, "reduce_calls": dict(ranker.calls),
        **{key: summary_ms(values) for key, values in samples.items()},
    }
    return outcome


# --------------------------------------------------------------------------- big gate


async def big_gate(settings: Settings, procs: Processes, count: int) -> dict[str, Any]:
    """Insert ``count`` items at reduce gate 0 and reduce them in a worker process.

    Raises:
        RuntimeError: the worker failed, or the partition's items or result are wrong.
        TimeoutError: the worker did not finish within the phase timeout.
    """
    sizes = settings.sizes
    out = settings.work_dir / f"reduce-worker-{count}.json"
    async with statefeed_tables(settings.db_url, "reduce") as prefix:
        async with AsyncClient(settings.db_url, prefix) as client:
            # In one call: a partition at its reduce gate takes no more items at that gate
            # (its reduce sees a fixed set).
            items = [NewItem(item_id(number), score_data(number)) for number in range(count)]
            started = time.monotonic()
            await client.create_partition("big", items, reduce_gates=[0])
            inserted = time.monotonic() - started
            del items
            worker = await procs.start(
                f"reduce-worker-{count}", PYTHON, "-m", "bench.reduce_worker",
                "--db-url", settings.db_url, "--prefix", prefix, "--partition", "big",
                "--timeout", str(sizes.phase_timeout), "--out", str(out))
            async with asyncio.timeout(sizes.phase_timeout + 30):
                code = await worker.process.wait()
            if code != 0:
                raise RuntimeError(f"the reduce worker exited {code}:\n{worker.log()[-3000:]}")
            figures: dict[str, Any] = json.loads(out.read_text())
            info = await client.partition("big")
            if info.status != "complete" or info.counts != {"complete": count}:
                raise RuntimeError(f"big reduce of {count:,} items: {info.status}, items "
                                   f"{info.counts}, last error {info.last_error!r}")
            check_result("big", info.result_json(), range(count))
    return {"items": count, "insert_seconds": round(inserted, 2), **figures,
            "items_per_s": round(count / figures["seconds"], 1),
            "cpu_us_per_item": round(figures["cpu_seconds"] / count * 1e6, 1)}


async def run_big(settings: Settings) -> Outcome:
    """The big-gate scenario (see the module docstring)."""
    sizes = settings.sizes
    outcome = Outcome("reduce", TITLE_BIG)
    runs: list[dict[str, Any]] = []
    async with Processes(settings.work_dir) as procs:
        for count in sizes.reduce_gate_items:
            runs.append(await big_gate(settings, procs, count))
    for run in runs:
        rss = run["rss_mb"]
        calls = run["calls"]
        shape = ("one call" if "all" in calls else
                 f"fold {calls.get('fold', 0)} + apply {calls.get('apply', 0)} pages")
        outcome.rows.append(Row(f"reduce of a {run['items']:,}-item gate",
                                f"{run['items_per_s']:,.0f} items/s",
                                f"{run['seconds']:.2f} s ({shape} of up to "
                                f"{run['reduce_page_items']:,}); CPU "
                                f"{run['cpu_us_per_item']:,.0f} us/item; inserted in "
                                f"{run['insert_seconds']:.1f} s"))
        outcome.rows.append(Row(f"  reducing process RSS, {run['items']:,} items",
                                f"peak {rss['peak']:.1f} MB",
                                f"{rss['start']:.1f} MB before the reduce, {rss['end']:.1f} MB "
                                f"after (peak {rss['peak_source']})"))
    smallest, largest = runs[0], runs[-1]
    growth = None
    if largest is not smallest and smallest["rss_mb"]["peak"]:
        growth = largest["rss_mb"]["peak"] / smallest["rss_mb"]["peak"] - 1
        outcome.goals.append(Goal(
            "reduce: memory bounded as the gate grows (bench criterion)",
            f"peak +{RSS_BOUNDED:.0%} at most from {smallest['items']:,} to "
            f"{largest['items']:,} items", f"{growth:+.1%}", growth <= RSS_BOUNDED))
    outcome.figures = {"gates": runs,
                       "peak_rss_growth": None if growth is None else round(growth, 4)}
    return outcome
