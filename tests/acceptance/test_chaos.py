"""Chaos: three processors, random handler failures, a random processor killed with
kill -9 every 1-3 s and replaced, database connections dropped mid-run; every
item must still end with exactly the right pass counter, in gate order.

The kill schedule is random by design (it is the test's input, not a wait);
``STATEFEED_CHAOS_SEED`` replays one. ``STATEFEED_SOAK=1`` also runs the long
soak (marked ``slow``), which adds SIGSTOP/SIGCONT pauses.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from tests.acceptance.harness.checks import (
    causality_problems,
    duplicate_calls,
    gate_order_problems,
    item_problems,
    key_problems,
    reduce_causality_problems,
    reduce_item_problems,
    reduce_key_problems,
    reduce_order_problems,
    reduce_result_problems,
)
from tests.acceptance.harness.cluster import Cluster
from tests.acceptance.harness.faults import pause_outside_transaction
from tests.acceptance.harness.handler import RecordingHandler
from tests.acceptance.harness.processes import Processor
from tests.conftest import require_postgres

pytestmark = pytest.mark.postgres

SEED = int(os.environ.get("STATEFEED_CHAOS_SEED", "20261121"))


@dataclass(frozen=True)
class Chaos:
    """The size of a chaos run and how rough it gets."""

    partitions: int
    items: int
    gates: int
    passes: int = 2
    failure_rate: float = 0.1
    call_seconds: tuple[float, float] = (0.1, 0.5)
    kill_every: tuple[float, float] = (1.0, 3.0)
    max_blows: int = 10  # then the run is left to finish, so a slow machine gets no more
    pause_share: float = 0.0  # share of the blows that are SIGSTOP/SIGCONT instead of kill -9
    db_drops: int = 1
    timeout: float = 90.0


async def run_chaos(tmp_path, chaos: Chaos, seed: int) -> str:
    """Run one chaos scenario and check everything; returns the summary line."""
    require_postgres()
    rng = random.Random(seed)
    delays = random.Random(seed + 1)
    low, high = chaos.call_seconds
    handler = RecordingHandler(gates=chaos.gates, passes=chaos.passes,
                               failure_rate=chaos.failure_rate, seed=seed + 2,
                               delay=lambda call: delays.uniform(low, high))
    async with Cluster(tmp_path, handler, name="c") as cluster:
        layout = await cluster.create(chaos.partitions, chaos.items)
        blows = await inflict(cluster, chaos, rng, layout)
        items = await cluster.items(layout)
        cluster.assert_no_tracebacks()
        log_tail = cluster.log_tail()

    kills, pauses, drops = blows.kills, blows.pauses, blows.drops
    problems = item_problems(items, handler.calls, gates=chaos.gates, passes=chaos.passes)
    lost = len({problem.split(":")[0] for problem in problems})
    summary = (f"chaos: items={len(items)} kills={kills} "
               f"duplicate_calls={duplicate_calls(handler.calls)} lost={lost}")
    print(f"\n{summary}")
    extra = (f"seed={seed} pauses={pauses} db_drops={drops} calls={len(handler.calls)} "
             f"processes={len(cluster.processors)} seconds={blows.seconds:.1f}")
    assert not problems, "\n".join([extra, *problems[:20], log_tail])
    problems = key_problems(handler.calls) + causality_problems(handler.calls)
    problems += gate_order_problems(handler.calls, layout, passes=chaos.passes)
    problems += handler.violations
    assert not problems, "\n".join([extra, *problems[:20]])
    assert len(items) == chaos.partitions * chaos.items
    assert kills + pauses >= 3, f"too little chaos: {extra}"
    assert drops == chaos.db_drops, extra
    return summary


@dataclass
class Blows:
    """What a chaos run inflicted, and how long it took to settle."""

    kills: int = 0
    pauses: int = 0
    drops: int = 0
    seconds: float = 0.0


async def inflict(cluster: Cluster, chaos: Chaos, rng: random.Random,
                  layout: dict[str, list[str]], *args: str,
                  choose: Callable[[list[Processor]], list[Processor]] | None = None
                  ) -> Blows:
    """Start three processors (with ``args``), deal blows on the random schedule of
    ``chaos`` until every partition of ``layout`` has settled; returns what was dealt.

    Each blow picks its victim among the running processors (among ``choose`` of
    them when that is not empty), kills it (and starts a replacement) or pauses it
    for a while; every third blow also drops the database sessions, up to
    ``chaos.db_drops`` times.

    Raises:
        AssertionError: the partitions did not settle within ``chaos.timeout``.
    """
    blows = Blows()
    for _ in range(3):
        await cluster.start(None, *args)
    done = asyncio.Event()

    async def deal() -> None:
        blow = 0
        while not done.is_set() and blow < chaos.max_blows:
            await _unless(done, rng.uniform(*chaos.kill_every))
            if done.is_set():
                return
            blow += 1
            alive = [proc for proc in cluster.processors if proc.running and not proc.paused]
            victim = rng.choice((choose(alive) if choose else None) or alive)
            if rng.random() < chaos.pause_share:
                await pause_outside_transaction(victim, cluster.db)
                blows.pauses += 1
                await _unless(done, rng.uniform(1.0, 4.0))
                victim.resume()
            else:
                victim.kill()
                blows.kills += 1
                await cluster.start(None, *args)
            if blows.drops < chaos.db_drops and blow % 3 == 2:
                await cluster.db.terminate()
                blows.drops += 1

    chaos_task = asyncio.create_task(deal())
    started = time.monotonic()
    try:
        await cluster.wait_settled(layout, timeout=chaos.timeout)
    finally:
        done.set()
        await chaos_task
    blows.seconds = time.monotonic() - started
    return blows


async def _unless(done: asyncio.Event, seconds: float) -> None:
    """Let ``seconds`` pass (the random schedule is the test's input), or less if done."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await done.wait()


@pytest.mark.timeout(180)
async def test_chaos(tmp_path) -> None:
    await run_chaos(tmp_path, Chaos(partitions=20, items=5, gates=3), SEED)


REDUCE_GATE = 1
REDUCE_PAGE_ITEMS = 4


@pytest.mark.timeout(180)
async def test_chaos_with_reduce_gates(tmp_path) -> None:
    """Chaos over partitions whose gate 1 is a reduce: gate 0 and gate 2 take two
    per-item passes, gate 1 is one reduce call for the small partitions and a fold
    then an apply pass of several pages for the others (``--reduce-page-items``).
    Blows prefer a processor with a reduce in flight. Every partition must
    complete with the reduce counter's exact result over all its items, folded
    once each, and every item with its reduce answer applied exactly once and
    each per-item step exactly once, in gate order.
    """
    require_postgres()
    seed = SEED + 14
    chaos = Chaos(partitions=16, items=0, gates=3, pause_share=0.3)
    rng = random.Random(seed)
    delays = random.Random(seed + 1)
    low, high = chaos.call_seconds
    handler = RecordingHandler(gates=chaos.gates, passes=chaos.passes,
                               failure_rate=chaos.failure_rate, seed=seed + 2,
                               delay=lambda call: delays.uniform(low, high),
                               reduce_next_gate=REDUCE_GATE + 1,
                               reduce_delay=lambda request: delays.uniform(low, high))
    # Sizes around the page: one call (up to a page), or two to four pages.
    sizes = [3, 10, 4, 13, 2, 9, 1, 16]
    layout = {f"part{n:03d}": [f"item{m:03d}" for m in range(sizes[n % len(sizes)])]
              for n in range(chaos.partitions)}
    reducers_struck = 0

    def reducers(alive: list[Processor]) -> list[Processor]:
        nonlocal reducers_struck
        chosen = [proc for proc in alive if handler.reduces_in_flight(proc.owner)]
        reducers_struck += bool(chosen)
        return chosen

    async with Cluster(tmp_path, handler, name="cr") as cluster:
        await cluster.create_layout(layout, reduce_gates=[REDUCE_GATE])
        blows = await inflict(cluster, chaos, rng, layout,
                              "--reduce-page-items", str(REDUCE_PAGE_ITEMS), choose=reducers)
        infos = await cluster.partitions()
        items = await cluster.items(layout)
        cluster.assert_no_tracebacks()
        log_tail = cluster.log_tail()

    reduces = handler.reduces
    interrupted = [r for r in reduces if r.outcome in ("abandoned", "cancelled")]
    ok_pages = [(r.partition_id, r.pass_, r.page) for r in reduces if r.ok]
    extra = (f"seed={seed} kills={blows.kills} pauses={blows.pauses} "
             f"db_drops={blows.drops} calls={len(handler.calls)} reduces={len(reduces)} "
             f"reducers_struck={reducers_struck} interrupted_reduces={len(interrupted)} "
             f"processes={len(cluster.processors)} seconds={blows.seconds:.1f}")
    problems = [f"{pid}: {info.status} at gate {info.gate}: {info.last_error}"
                for pid, info in infos.items() if info.status != "complete"]
    problems += reduce_item_problems(items, handler.calls, reduces, gates=chaos.gates,
                                     passes=chaos.passes, reduce_gate=REDUCE_GATE)
    problems += reduce_result_problems({pid: infos[pid].result_json() for pid in layout},
                                       layout, items, reduces, reduce_gate=REDUCE_GATE)
    assert not problems, "\n".join([extra, *problems[:20], log_tail])
    problems = key_problems(handler.calls) + reduce_key_problems(reduces)
    problems += reduce_causality_problems(handler.calls, reduces)
    problems += reduce_order_problems(handler.calls, reduces, layout, passes=chaos.passes,
                                      reduce_gate=REDUCE_GATE)
    problems += handler.violations
    assert not problems, "\n".join([extra, *problems[:20]])
    assert len(items) == sum(len(ids) for ids in layout.values())
    assert {r.pass_ for r in reduces if r.ok} == {"all", "fold", "apply"}
    assert blows.kills + blows.pauses >= 3, f"too little chaos: {extra}"
    assert blows.drops == chaos.db_drops, extra
    print(f"\nchaos with reduce gates: items={len(items)} {extra} "
          f"duplicate_calls={duplicate_calls(handler.calls)} "
          f"duplicate_reduce_pages={len(ok_pages) - len(set(ok_pages))}")


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("STATEFEED_SOAK"),
                    reason="soak test: set STATEFEED_SOAK=1 to run it")
@pytest.mark.timeout(1800)
async def test_chaos_soak(tmp_path) -> None:
    rounds = int(os.environ.get("STATEFEED_SOAK_ROUNDS", "3"))
    for round_ in range(rounds):
        path = tmp_path / f"round{round_}"
        path.mkdir()
        await run_chaos(path, Chaos(
            partitions=60, items=8, gates=4, passes=3, failure_rate=0.15,
            call_seconds=(0.05, 0.6), pause_share=0.3, db_drops=3, max_blows=200,
            timeout=600),
            SEED + round_)
