"""A fleet of ``processor run`` processes on one PostgreSQL through PgBouncer in
transaction mode (the URL says ``pooler=transaction``).

A transaction pooler hands each transaction whichever server session is free, so
statefeed must not prepare statements (a prepared statement lives in one session)
and cannot LISTEN (notifications go to a session another client has next). Behind
it, processors and clients work as they do directly: the partitions drain with
every step applied exactly once, watchers poll and say so once, and nothing reports
a missing prepared statement.
"""

from __future__ import annotations

import asyncio

import pytest

from processor import AsyncClient, NewItem
from tests.acceptance.harness.checks import causality_problems, item_problems, key_problems
from tests.acceptance.harness.cluster import Cluster
from tests.acceptance.harness.handler import RecordingHandler, initial_data
from tests.acceptance.harness.processes import Processor
from watcher.store.drivers.postgresql.pooler import POLLING_REASON

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

PROCESSES = 8
PARTITIONS = 16
ITEMS = 10
# Log fragments that must never appear behind the pooler.
FORBIDDEN = ("prepared statement", "Traceback", "write_failed", "renew_failed",
             "listen_failed")


def _log_problems(procs: list[Processor]) -> list[str]:
    problems: list[str] = []
    for proc in procs:
        output = proc.output()
        problems += [f"{proc.owner}: {line}" for line in output.splitlines()
                     if any(fragment in line for fragment in FORBIDDEN)]
        polling = [line for line in output.splitlines() if "action=listen_off" in line]
        if len(polling) != 1 or POLLING_REASON not in polling[0]:
            problems.append(f"{proc.owner}: expected one action=listen_off line naming "
                            f"the pooler, found {polling}")
    return problems


async def test_a_fleet_drains_exactly_through_pgbouncer(tmp_path, pooled_postgres_url
                                                        ) -> None:
    """8 processors and a client, all through PgBouncer in transaction mode: half the
    partitions are written before the processors start and half while they run (found
    by polling, as nothing is notified); every item ends complete with exactly its
    steps, each from a successful call, and every watcher said once that it polls."""
    handler = RecordingHandler(gates=2, passes=2)
    async with Cluster(tmp_path, handler) as cluster:
        client = AsyncClient(pooled_postgres_url, cluster.prefix)
        try:
            first = {f"early{n:02d}": [f"item{m}" for m in range(ITEMS)]
                     for n in range(PARTITIONS // 2)}
            later = {f"late{n:02d}": [f"item{m}" for m in range(ITEMS)]
                     for n in range(PARTITIONS // 2)}
            for partition_id, item_ids in first.items():
                await client.create_partition(
                    partition_id, [NewItem(item_id, initial_data()) for item_id in item_ids])
            procs = [await cluster.start(None, db_url=pooled_postgres_url)
                     for _ in range(PROCESSES)]
            await asyncio.gather(*(proc.wait_log("action=listen_off", timeout=60)
                                   for proc in procs))
            for partition_id, item_ids in later.items():
                await client.create_partition(partition_id, [])
                await client.add_items(
                    partition_id, [NewItem(item_id, initial_data()) for item_id in item_ids])
            layout = {**first, **later}
            await cluster.wait_settled(layout, timeout=60)
            items = [item for partition_id in layout
                     async for item in client.iter_items(partition_id)]
        finally:
            await client.close()
        problems = item_problems(items, handler.calls, gates=handler.gates,
                                 passes=handler.passes)
        problems += key_problems(handler.calls) + causality_problems(handler.calls)
        problems += handler.violations + _log_problems(procs)
        assert not problems, "\n".join(problems[:20]) + "\n" + cluster.log_tail()
        assert len(items) == PARTITIONS * ITEMS
        callers = {call.caller for call in handler.calls}
    print(f"\n{PROCESSES} processors through PgBouncer: {len(handler.calls)} calls for "
          f"{PARTITIONS * ITEMS * 4} steps, from {len(callers)} processors")
