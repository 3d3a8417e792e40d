"""Spawn under chaos (PostgreSQL, ``processor run`` subprocesses): producers page their
children through answers (50 per call, the cursor in their own data) while processors
are killed with kill -9, frozen past their lease, their database sessions ended, and
their connections cut by a proxy between them and PostgreSQL.

The end state must be exact: every producer complete with its last cursor, exactly
``producers x children`` children, none doubled (a double would fail on the primary
key, and the partitions' ``spawned`` counters would disagree with the rows), every
child complete and naming its producer as its parent.

The default run is 20 producers of 100 children; ``STATEFEED_SOAK=1`` adds the full
200 x 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
from collections import Counter
from typing import Any

import pytest

from tests.acceptance.harness.cluster import Cluster
from tests.acceptance.harness.database import postgres_address, via
from tests.acceptance.harness.faults import TcpProxy
from tests.acceptance.harness.handler import Call, RecordingHandler
from tests.acceptance.test_chaos import SEED, Chaos, inflict
from tests.conftest import require_postgres

pytestmark = pytest.mark.postgres

PAGE = 50
CUT_EVERY = (1.0, 3.0)  # seconds between two cuts of every processor connection


def producer_answers(children: int) -> Any:
    """The handler's answers: a producer (``prod...``) spawns its next page and keeps its
    cursor; a child completes. Each call takes a little while, so blows land mid-call."""

    def respond(call: Call) -> tuple[int, Any] | None:
        if "-c" in call.item_id:  # a child
            return 200, {"done": True, "data": {"parent_seen": json.loads(call.body)["parent"]}}
        cursor = json.loads(call.body)["cursor"]
        end = min(cursor + PAGE, children)
        spawn = [{"id": f"{call.item_id}-c{n:05d}", "data": {"parent": call.item_id}}
                 for n in range(cursor, end)]
        return 200, {"done": end == children, "data": {"cursor": end}, "spawn": spawn}

    return respond


async def run_spawn_chaos(tmp_path, *, partitions: int, producers: int, children: int,
                          chaos: Chaos, seed: int) -> str:
    require_postgres()
    rng = random.Random(seed)
    delays = random.Random(seed + 1)
    handler = RecordingHandler(respond=producer_answers(children),
                               delay=lambda call: delays.uniform(*chaos.call_seconds))
    layout = {f"spawn{p:02d}": [f"prod{p:02d}{n:03d}" for n in range(producers)]
              for p in range(partitions)}
    cuts = 0
    async with Cluster(tmp_path, handler, name="sp") as cluster, \
            TcpProxy(*postgres_address()) as proxy:
        for partition_id, producer_ids in layout.items():
            await cluster.client.create_partition(partition_id, [
                _producer(item_id) for item_id in producer_ids])
        # The processors reach the database through a proxy that drops every connection
        # now and then (the test's own client and checks go direct).
        proxy.forward()
        cluster.db_url = via(cluster.db_url, proxy.port)
        stop_cutting = asyncio.Event()

        async def cut_now_and_then() -> None:
            nonlocal cuts
            while not stop_cutting.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop_cutting.wait(), rng.uniform(*CUT_EVERY))
                if not stop_cutting.is_set():
                    proxy.cut()
                    cuts += 1

        cutter = asyncio.create_task(cut_now_and_then())
        try:
            blows = await inflict(cluster, chaos, rng, layout)
        finally:
            stop_cutting.set()
            await cutter
        infos = await cluster.partitions()
        items = await cluster.items(layout)
        cluster.assert_no_tracebacks()
        log_tail = cluster.log_tail()

    extra = (f"seed={seed} kills={blows.kills} pauses={blows.pauses} drops={blows.drops} "
             f"proxy_cuts={cuts} "
             f"calls={len(handler.calls)} seconds={blows.seconds:.1f}")
    total_producers = partitions * producers
    expected_children = total_producers * children
    problems: list[str] = []
    for partition_id in layout:
        info = infos[partition_id]
        if info.status != "complete":
            problems.append(f"{partition_id} is {info.status}: {info.counts}")
        if info.spawned != producers * children:
            problems.append(f"{partition_id} counts {info.spawned} spawned, expected "
                            f"{producers * children}")
    by_id = Counter((item.partition_id, item.id) for item in items)
    problems += [f"{key} stored {count} times" for key, count in by_id.items() if count > 1]
    children_rows = [item for item in items if "-c" in item.id]
    producer_rows = [item for item in items if "-c" not in item.id]
    if len(children_rows) != expected_children:
        problems.append(f"{len(children_rows)} children stored, expected {expected_children}")
    if len(producer_rows) != total_producers:
        problems.append(f"{len(producer_rows)} producers stored, expected {total_producers}")
    for item in children_rows:
        parent = item.id.split("-c")[0]
        if item.parent != parent:
            problems.append(f"{item.id}: parent {item.parent!r}, expected {parent!r}")
        if item.status != "complete":
            problems.append(f"{item.id} is {item.status}: {item.last_error}")
    for item in producer_rows:
        if item.status != "complete" or json.loads(item.data) != {"cursor": children}:
            problems.append(f"{item.id} is {item.status} with {item.data[:60]!r}")
    assert not problems, "\n".join([extra, *problems[:20], log_tail])
    assert blows.kills + blows.pauses >= 3 and cuts >= 1, f"too little chaos: {extra}"
    # Pages answered more than once (a kill between the call and its write) spawned once.
    pages = Counter((call.item_id, json.loads(call.body)["cursor"]) for call in handler.calls
                    if "-c" not in call.item_id and call.ok)
    repeated = sum(count > 1 for count in pages.values())
    summary = (f"spawn chaos: children={len(children_rows)} producers={len(producer_rows)} "
               f"pages_answered_again={repeated} {extra}")
    print(f"\n{summary}")
    return summary


def _producer(item_id: str) -> Any:
    from processor import NewItem

    return NewItem(item_id, json.dumps({"cursor": 0}).encode())


@pytest.mark.timeout(240)
async def test_spawn_chaos(tmp_path) -> None:
    await run_spawn_chaos(tmp_path, partitions=4, producers=5, children=100,
                          chaos=Chaos(partitions=0, items=0, gates=1, failure_rate=0.0,
                                      call_seconds=(0.02, 0.2), pause_share=0.3,
                                      kill_every=(0.5, 1.5), db_drops=1, timeout=150),
                          seed=SEED + 24)


@pytest.mark.soak
@pytest.mark.skipif(not os.environ.get("STATEFEED_SOAK"),
                    reason="soak test: set STATEFEED_SOAK=1 to run it")
@pytest.mark.timeout(3600)
async def test_spawn_chaos_soak(tmp_path) -> None:
    await run_spawn_chaos(tmp_path, partitions=20, producers=10, children=500,
                          chaos=Chaos(partitions=0, items=0, gates=1, failure_rate=0.0,
                                      call_seconds=(0.01, 0.1), pause_share=0.3,
                                      kill_every=(1.0, 3.0), db_drops=3, max_blows=100,
                                      timeout=3000),
                          seed=SEED + 25)
