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
from dataclasses import dataclass

import pytest

from tests.acceptance.harness.checks import (
    causality_problems,
    duplicate_calls,
    gate_order_problems,
    item_problems,
    key_problems,
)
from tests.acceptance.harness.cluster import Cluster
from tests.acceptance.harness.faults import pause_outside_transaction
from tests.acceptance.harness.handler import RecordingHandler
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
    kills = pauses = drops = 0
    async with Cluster(tmp_path, handler, name="c") as cluster:
        layout = await cluster.create(chaos.partitions, chaos.items)
        for _ in range(3):
            await cluster.start()
        done = asyncio.Event()

        async def blows() -> None:
            nonlocal kills, pauses, drops
            blow = 0
            while not done.is_set() and blow < chaos.max_blows:
                await _unless(done, rng.uniform(*chaos.kill_every))
                if done.is_set():
                    return
                blow += 1
                alive = [proc for proc in cluster.processors if proc.running and not proc.paused]
                victim = rng.choice(alive)
                if rng.random() < chaos.pause_share:
                    await pause_outside_transaction(victim, cluster.db)
                    pauses += 1
                    await _unless(done, rng.uniform(1.0, 4.0))
                    victim.resume()
                else:
                    victim.kill()
                    kills += 1
                    await cluster.start()
                if drops < chaos.db_drops and blow % 3 == 2:
                    await cluster.db.terminate()
                    drops += 1

        chaos_task = asyncio.create_task(blows())
        started = time.monotonic()
        try:
            await cluster.wait_settled(layout, timeout=chaos.timeout)
        finally:
            done.set()
            await chaos_task
        elapsed = time.monotonic() - started
        items = await cluster.items(layout)
        cluster.assert_no_tracebacks()
        log_tail = cluster.log_tail()

    problems = item_problems(items, handler.calls, gates=chaos.gates, passes=chaos.passes)
    lost = len({problem.split(":")[0] for problem in problems})
    summary = (f"chaos: items={len(items)} kills={kills} "
               f"duplicate_calls={duplicate_calls(handler.calls)} lost={lost}")
    print(f"\n{summary}")
    extra = (f"seed={seed} pauses={pauses} db_drops={drops} calls={len(handler.calls)} "
             f"processes={len(cluster.processors)} seconds={elapsed:.1f}")
    assert not problems, "\n".join([extra, *problems[:20], log_tail])
    problems = key_problems(handler.calls) + causality_problems(handler.calls)
    problems += gate_order_problems(handler.calls, layout, passes=chaos.passes)
    problems += handler.violations
    assert not problems, "\n".join([extra, *problems[:20]])
    assert len(items) == chaos.partitions * chaos.items
    assert kills + pauses >= 3, f"too little chaos: {extra}"
    assert drops == chaos.db_drops, extra
    return summary


async def _unless(done: asyncio.Event, seconds: float) -> None:
    """Let ``seconds`` pass (the random schedule is the test's input), or less if done."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await done.wait()


@pytest.mark.timeout(180)
async def test_chaos(tmp_path) -> None:
    await run_chaos(tmp_path, Chaos(partitions=20, items=5, gates=3), SEED)


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
