"""Flow control's cost: the library drain with and without concurrency keys and limits.

The same N no-op items over P partitions are drained in library mode, as the
statefeed side of :mod:`bench.library` drains them (one in-process watcher at
concurrency 32, timed from its start to the last partition closed), in these
setups, interleaved round by round (the best round of each counts):

- **no keys**: the defaults; no partition has a key (flow control's promise, "default settings
  with no keys or limits set");
- **one key**: every partition under the same key, with no limit: the key's pool
  and its one read of limits a lease cycle;
- **one key, limit 16**: the same key with a fleet-wide in-flight limit of half the
  default concurrency (``client.set_key_limit``), so the grants are written and
  renewed through the drain; the drain runs at most 16 calls at once;
- **no keys, concurrency 16**: a reference for the one above: the same number of
  calls in flight with no key, so what the limit costs beyond the smaller
  concurrency shows;
- **a key each, rate limited**: each partition its own key, each key limited to
  :data:`KEY_RATE` calls per second (the most a rate may be): P times that in
  all, far above the drain rate, so it measures the token claims, not the limit
  (the calls held for want of tokens are counted; they are only the start-up's).

Items/s, this process's CPU per item (on SQLite the database's CPU too), and the
statements per item; the ratio of each setup to "no keys". The goal is a
benchmark criterion, not a documented goal: one key without a limit keeps at least 95 %
of the no-keys drain (flow control bounds what flow control costs the no-keys drain
at 5 %; that is measured against the code before it, see
docs/explanation/performance.md).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.common import (
    Goal,
    Outcome,
    Row,
    Settings,
    best_round,
    cpu_seconds,
    create_partitions,
    rate_text,
    ratio,
    settle_heap,
    spread,
    statefeed_tables,
)
from bench.counting import DrainHooks, StatementCounter
from bench.library import Drain
from processor import AsyncClient
from watcher import Result, Store, Watcher, WatcherConfig, WorkItem
from watcher.config import DEFAULT_CONCURRENCY
from watcher.rules.checks import MAX_RATE

TITLE = "Flow control: the library drain with no keys, one key, a key limit, and key rates"
KEY = "tenant-a"
KEY_LIMIT = DEFAULT_CONCURRENCY // 2  # half the default concurrency: 16
KEY_RATE = MAX_RATE  # calls per second per key, in the rate-limited setup
AT_LEAST = 0.95  # one key without a limit vs no keys, items/s (a bench criterion)


@dataclass(frozen=True)
class Setup:
    """One way of draining the same items: keys, limits and concurrency."""

    name: str  # its key in the JSON figures
    label: str  # its row in the table
    key: Callable[[int], str | None] | None = None  # a partition's key from its number
    key_limit: int | None = None  # set for KEY before the drain
    rate_per_key: float | None = None  # --rate-limit-per-key
    concurrency: int = DEFAULT_CONCURRENCY


SETUPS = (
    Setup("no_keys", "no keys (defaults)"),
    Setup("one_key", "one key, no limit", key=lambda number: KEY),
    Setup("key_limit", f"one key, in-flight limit {KEY_LIMIT}", key=lambda number: KEY,
          key_limit=KEY_LIMIT),
    Setup("no_keys_half", f"no keys, concurrency {KEY_LIMIT} (reference for the limit)",
          concurrency=KEY_LIMIT),
    Setup("key_rates", f"a key per partition, {KEY_RATE:,.0f} calls/s each",
          key=lambda number: f"tenant-{number:05d}", rate_per_key=KEY_RATE),
)


class FlowHooks(DrainHooks):
    """A drain's hooks, counting the key grants written and the calls a rate held."""

    def __init__(self, partitions: int, counter: StatementCounter) -> None:
        super().__init__(partitions, counter)
        self.grants = 0
        self.most_granted = 0
        self.throttled: Counter[str] = Counter()

    def key_grant(self, key: str, in_flight: int, granted: int, limit: int) -> None:
        self.grants += 1
        self.most_granted = max(self.most_granted, granted)

    def calls_throttled(self, scope: str, reason: str, count: int) -> None:
        self.throttled[f"{scope} {reason}"] += count


async def _noop(item: WorkItem) -> Result:
    return Result(done=True)


async def flow_drain(settings: Settings, setup: Setup) -> Drain:
    """Drain the scenario's items with one watcher in ``setup``.

    Raises:
        TimeoutError: the drain did not finish within the phase timeout.
        RuntimeError: items failed or were left over, or the key limit was not kept.
    """
    sizes = settings.sizes
    async with statefeed_tables(settings.db_url, "flow") as prefix:
        async with AsyncClient(settings.db_url, prefix) as client:
            ids = await create_partitions(client, spread(sizes.flow_items, sizes.partitions),
                                          key=setup.key)
            if setup.key_limit is not None:
                await client.set_key_limit(KEY, setup.key_limit)
            store = Store.open(settings.db_url, prefix)
            counter = StatementCounter(store)
            hooks = FlowHooks(len(ids), counter)
            config = WatcherConfig(owner_id="bench-flow", concurrency=setup.concurrency,
                                   rate_limit_per_key=setup.rate_per_key)
            watcher = Watcher(store, _noop, config, hooks)
            try:
                settle_heap()
                started, cpu_started = time.perf_counter(), cpu_seconds()
                running = asyncio.create_task(watcher.run())
                try:
                    async with asyncio.timeout(sizes.phase_timeout):
                        await hooks.done.wait()
                finally:
                    await watcher.stop()
                    await running
            finally:
                counter.close()
                await store.close()
            infos = [await client.store.partition_get(pid) for pid in ids[:3]]
    if (hooks.failed or hooks.completed_items != sizes.flow_items
            or any(info is None or info.status != "complete" for info in infos)):
        raise RuntimeError(
            f"flow drain ({setup.label}): {hooks.completed_items} of {sizes.flow_items} items "
            f"complete, {hooks.failed} partitions failed, other outcomes "
            f"{dict(hooks.other_outcomes)}")
    if setup.key_limit is not None and not 0 < hooks.most_granted <= setup.key_limit:
        raise RuntimeError(f"flow drain ({setup.label}): grants of up to "
                           f"{hooks.most_granted} slots (limit {setup.key_limit})")
    assert hooks.finished_at is not None and hooks.statements_at_end is not None
    assert hooks.cpu_at_end is not None
    statements, items = hooks.statements_at_end, sizes.flow_items
    return Drain("statefeed", setup.label, items, hooks.finished_at - started,
                 {"cpu_us_per_item": round((hooks.cpu_at_end - cpu_started) / items * 1e6, 1),
                  "concurrency": setup.concurrency, "key_limit": setup.key_limit,
                  "rate_limit_per_key": setup.rate_per_key,
                  "statements": statements,
                  "statements_per_item": round(statements / items, 4),
                  "statements_by_kind": hooks.kinds_at_end,
                  "key_grants": hooks.grants, "most_slots_granted": hooks.most_granted,
                  "calls_throttled": dict(hooks.throttled)})


async def run(settings: Settings) -> Outcome:
    """The flow scenario (see the module docstring).

    Raises:
        TimeoutError: a drain did not finish within the phase timeout.
        RuntimeError: a drain left items over or failed them, or a limit was not kept.
    """
    sizes = settings.sizes
    outcome = Outcome("flow", f"{TITLE} ({settings.database_title})")
    rounds = max(settings.rounds, sizes.flow_rounds)
    runs: dict[str, list[Drain]] = {setup.name: [] for setup in SETUPS}
    for _ in range(rounds):  # interleaved, so a busy moment hits every setup alike
        for setup in SETUPS:
            runs[setup.name].append(await flow_drain(settings, setup))
    best = {name: best_round(drains) for name, drains in runs.items()}
    base = best["no_keys"]
    ratios: dict[str, float | None] = {}
    for setup in SETUPS:
        drain = best[setup.name]
        ratios[setup.name] = ratio(drain.per_second, base.per_second)
        outcome.rows.append(Row(drain.settings, rate_text(drain.per_second), _detail(drain)))
    for name in ("one_key", "key_limit", "key_rates"):
        share = ratios[name]
        if share is not None:
            outcome.rows.append(Row(f"ratio {best[name].settings} / no keys", f"{share:.2f}x",
                                    "items/s, best rounds"))
    half = ratio(best["key_limit"].per_second, best["no_keys_half"].per_second)
    if half is not None:
        outcome.rows.append(Row(f"ratio one key, limit {KEY_LIMIT} / no keys, concurrency "
                                f"{KEY_LIMIT}", f"{half:.2f}x",
                                "what the grants cost beyond the smaller concurrency"))
    outcome.figures = {
        "items": sizes.flow_items, "partitions": sizes.partitions, "rounds": rounds,
        "key_limit": KEY_LIMIT, "rate_limit_per_key": KEY_RATE,
        "setups": {name: drain.as_json() for name, drain in best.items()},
        **{f"ratio_{name}_over_no_keys": _rounded(ratios[name])
           for name in ("one_key", "key_limit", "no_keys_half", "key_rates")},
        "ratio_key_limit_over_no_keys_half": _rounded(half),
    }
    one_key = ratios["one_key"]
    outcome.goals.append(Goal(
        "flow: one key without a limit vs no keys, items/s (bench criterion)",
        f">= {AT_LEAST:g}x", "-" if one_key is None else f"{one_key:.2f}x",
        None if one_key is None else one_key >= AT_LEAST))
    return outcome


def _detail(drain: Drain) -> str:
    extra: dict[str, Any] = drain.extra
    text = (f"{drain.items:,} items in {drain.seconds:.2f} s; CPU "
            f"{extra['cpu_us_per_item']:,.0f} us/item; {extra['statements_per_item']:.3f} "
            f"statements/item")
    if extra["key_grants"]:
        text += f"; {extra['key_grants']} grants of up to {extra['most_slots_granted']} slots"
    throttled = sum(extra["calls_throttled"].values())
    if throttled:
        text += f"; {throttled:,} calls waited for tokens"
    if len(drain.rounds) > 1:
        text += f"; rounds {list(drain.rounds)}"
    return text


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
