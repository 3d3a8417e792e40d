"""Several ``processor run`` processes on one SQLite file, on one machine.

SQLite takes one writer at a time for the whole file. Each processor writes its
results on a connection of its own that never waits inside SQLite (another
process holding the lock makes it pause and try again), and its other writes
wait on the busy timeout; leases, guards and fencing are the same statements
as on any database. So several processes on one file share the partitions
fairly, survive one of them being killed, and apply every step exactly once,
and none reports "database is locked".
"""

from __future__ import annotations

import asyncio

import pytest

from tests.acceptance.harness.checks import causality_problems, item_problems, key_problems
from tests.acceptance.harness.cluster import Cluster
from tests.acceptance.harness.handler import RecordingHandler
from tests.acceptance.harness.processes import LEASE, Processor, warning_lines
from tests.support.engine import wait_until

pytestmark = pytest.mark.timeout(180)

PARTITIONS = 12
ITEMS = 25
PROCESSES = 3


def _problems_in_logs(procs: list[Processor]) -> list[str]:
    problems: list[str] = []
    for proc in procs:
        output = proc.output()
        if "database is locked" in output or "Traceback" in output:
            problems.append(f"{proc.owner}:\n{output[-3000:]}")
        # A killed processor's partitions are taken over: that is no warning's business,
        # but a failed result write or lease renewal is.
        problems += [f"{proc.owner}: {line}" for line in warning_lines(output)
                     if "write_failed" in line or "renew_failed" in line]
    return problems


async def test_processes_share_one_sqlite_file_fairly_and_exactly(tmp_path) -> None:
    """3 processors over 12 partitions settle at 4 ± 1 each; one is killed with
    ``kill -9`` while results are written as fast as the handler answers; the
    others finish every partition, each step applied exactly once."""
    db_url = f"sqlite:///{tmp_path / 'statefeed.db'}"
    hold = asyncio.Event()
    handler = RecordingHandler(gates=2, passes=2, hold=lambda call: None if hold.is_set()
                               else hold)
    async with Cluster(tmp_path, handler, db_url=db_url) as cluster:
        layout = await cluster.create(PARTITIONS, ITEMS)
        procs = [await cluster.start(None, db_url=db_url) for _ in range(PROCESSES)]
        await asyncio.gather(*(proc.wait_log("action=watcher_started") for proc in procs))

        async def fair() -> dict[str, int] | None:
            live = {owner: len(ids) for owner, ids in (await cluster.live_owners()).items()}
            share = PARTITIONS // PROCESSES
            fits = (len(live) == PROCESSES and sum(live.values()) == PARTITIONS
                    and all(share - 1 <= count <= share + 1 for count in live.values()))
            return live if fits else None

        shares = await wait_until(fair, timeout=8 * LEASE, interval=0.05,
                                  message=f"{PARTITIONS // PROCESSES} ± 1 partitions each")
        hold.set()
        handler.release_all()
        # Let every processor write for a while, then kill one mid-stream.
        await wait_until(lambda: len(handler.calls) > PARTITIONS * ITEMS, timeout=30,
                         message="a gate's worth of calls")
        victim = procs[0]
        held = (await cluster.live_owners()).get(victim.owner, [])
        victim.kill()
        assert held, "the killed processor held no partition: nothing was taken over"
        await cluster.wait_settled(layout, timeout=60)
        items = await cluster.items(layout)
        problems = item_problems(items, handler.calls, gates=handler.gates,
                                 passes=handler.passes)
        problems += key_problems(handler.calls) + causality_problems(handler.calls)
        problems += handler.violations + _problems_in_logs(procs)
        assert not problems, "\n".join(problems[:20]) + "\n" + cluster.log_tail()
        assert len(items) == PARTITIONS * ITEMS
    print(f"\nsqlite, {PROCESSES} processes on one file: shares {sorted(shares.values())}; "
          f"killed one holding {len(held)}; {len(handler.calls)} calls for "
          f"{PARTITIONS * ITEMS * 4} steps")
