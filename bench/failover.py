"""Failover after ``kill -9`` and handoff after SIGTERM, between ``processor run`` processes.

Partitions are kept busy for ever: their items answer "run again" after a
short sleep (``loop:<seconds>``), so leases are held, renewed and handed over
with calls in flight, as in production.

1. Three processors start together and share the partitions fairly. Start to first
   lease: from each one's spawn to a live lease of its own in the database (the
   first takes free partitions; the others steal theirs to reach a fair share, and with
   few partitions one may hold none).
2. ``kill -9`` one that holds partitions. Failover time: until the other two
   hold every partition with a live lease (``owner`` and ``until`` read from
   the database every 10 ms). Expect up to one lease duration: the killed
   processor's leases must expire first.
3. SIGTERM another. Handoff time: until the last one holds every partition.
   The stopped one releases its leases as it stops, so expect its shutdown
   plus about one poll interval.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Any

from sqlalchemy import func, select

from bench.common import (
    Outcome,
    Row,
    Settings,
    create_partitions,
    statefeed_tables,
    wait_for,
)
from bench.procs import Child, Processes
from processor import AsyncClient

TITLE = "Failover after kill -9, handoff after SIGTERM: three processor run processes"
HANDLER_SLEEP = 0.05
POLL = 0.1
ITEMS_PER_PARTITION = 2
CONCURRENCY = 4


async def owners(client: AsyncClient) -> Counter[str]:
    """Live leases per owner, read from the database."""
    partitions = client.store.tables.partitions
    async with client.store.engine.connect() as conn:
        rows = await conn.execute(
            select(partitions.c.owner, func.count())
            .where(partitions.c.status == "available", partitions.c.owner != "",
                   partitions.c.until > func.now())
            .group_by(partitions.c.owner))
        return Counter({owner: count for owner, count in rows})


async def run(settings: Settings) -> Outcome:
    """The failover and handoff scenario (see the module docstring)."""
    sizes = settings.sizes
    outcome = Outcome("failover", TITLE)
    total = sizes.failover_partitions
    lease = sizes.lease_duration
    timeout = max(30.0, lease * 10)
    args = ("--lease-duration", str(lease), "--poll-interval", str(POLL),
            "--concurrency", str(CONCURRENCY), "--shutdown-timeout", "5")
    async with statefeed_tables(settings.db_url, "fail") as prefix, \
            AsyncClient(settings.db_url, prefix) as client, \
            Processes(settings.work_dir) as procs:
        handler = await procs.handler("failover-handler")
        await create_partitions(client, [ITEMS_PER_PARTITION] * total,
                                data=f"loop:{HANDLER_SLEEP}".encode())

        async def start(name: str) -> Child:
            return await procs.processor(name, handler_url=f"{handler.url}/",
                                         db_url=settings.db_url, prefix=prefix, args=args)

        def holding(*owners_: Child, alive: tuple[Child, ...]) -> Any:
            """A check: the live processes are running and ``owners_`` hold every partition
            (with no owners given: returns the live leases per owner)."""
            async def check() -> Any:
                for child in alive:
                    if not child.running:
                        raise RuntimeError(f"{child.name} exited ({child.process.returncode})"
                                           f":\n{child.log()[-2000:]}")
                held = await owners(client)
                if not owners_:
                    return held
                return sum(held.get(child.name, 0) for child in owners_) == total
            return check

        started: dict[str, float] = {}
        everyone = []
        for name in ("bench-a", "bench-b", "bench-c"):
            started[name] = time.monotonic()
            everyone.append(await start(name))
        share = math.ceil(total / len(everyone))
        # Start to first lease of each that gets one, from its spawn (interpreter, imports,
        # database check) to a live lease of its own in the database.
        first_lease: dict[str, float] = {}

        async def settled() -> bool:
            # Every partition leased, nobody above the fair share (so no more stealing),
            # and at least two processes hold some (with 4 partitions, 2/2/0 is settled).
            held = await holding(alive=tuple(everyone))()
            now = time.monotonic()
            for child in everyone:
                if held.get(child.name) and child.name not in first_lease:
                    first_lease[child.name] = now - started[child.name]
            return (sum(held.values()) == total and max(held.values()) <= share
                    and len([count for count in held.values() if count]) >= 2)

        await wait_for(settled, timeout=timeout, what="three processors to share the partitions")
        held = await owners(client)
        # The two that hold the most are killed and stopped; the third one survives.
        killed, stopped, survivor = sorted(everyone, key=lambda child: -held[child.name])
        killed.kill()
        killed_at = time.monotonic()
        await wait_for(holding(stopped, survivor, alive=(stopped, survivor)), timeout=timeout,
                       what="the others to take over the killed processor's partitions")
        failover = time.monotonic() - killed_at
        moved_on_kill = held[killed.name]
        held = await owners(client)
        stopped.stop()
        stopped_at = time.monotonic()
        await wait_for(holding(survivor, alive=(survivor,)), timeout=timeout,
                       what="the last processor to take over the stopped one's partitions")
        handoff = time.monotonic() - stopped_at
        moved_on_stop = held[stopped.name]
        exit_code = await stopped.terminate()
        await survivor.terminate()
    leases = sorted(first_lease.values())
    outcome.rows.append(Row("start to first lease", f"{leases[0]:.2f} s",
                            f"the first of three processes started together (the last to "
                            f"get one: {leases[-1]:.2f} s, by stealing); from the spawn, "
                            "imports included"))
    outcome.rows.append(Row("failover after kill -9", f"{failover:.2f} s",
                            f"{moved_on_kill} partitions moved; lease {lease:g} s, "
                            f"poll {POLL:g} s"))
    outcome.rows.append(Row("handoff after SIGTERM", f"{handoff:.2f} s",
                            f"{moved_on_stop} partitions moved; the stopped process exited "
                            f"{exit_code}; lease {lease:g} s, poll {POLL:g} s"))
    outcome.figures = {
        "partitions": total, "lease_duration_s": lease, "poll_interval_s": POLL,
        "failover_after_kill_s": round(failover, 3), "handoff_after_sigterm_s": round(handoff, 3),
        "start_to_first_lease_s": round(leases[0], 3),
        "start_to_first_lease_last_s": round(leases[-1], 3),
        "partitions_moved_on_kill": moved_on_kill, "partitions_moved_on_sigterm": moved_on_stop,
        "handoff_exit_code": exit_code,
    }
    return outcome
