"""Scale: many partitions x items. Poll queries and memory must stay flat as work completes.

1. Insert P partitions of I items (the client API, a few partitions at once).
2. Drain them with one watcher in a process of its own
   (:mod:`bench.scale_worker`): its resident memory when 10 % and when 90 % of
   the items were complete, and the SQL statements its engine sent, per item.
3. Poll query time, with no other load: put the tables in the state "X %
   complete" (the first X % of the partitions closed, and in every other
   partition the first X % of its items complete; X = 90, then 10), refresh
   the planner's statistics (PostgreSQL ``VACUUM ANALYZE``, SQLite ``ANALYZE``,
   MariaDB ``ANALYZE TABLE``), and time ``Store.items_ready`` on random open
   partitions and ``Store.leases_read_free`` (the two queries every poll runs),
   median and p99. Both read the same number of rows in both states, so only
   what they must skip differs.
4. Lease reads as partitions wait: in the 10 % state, add copies of an open
   partition's row (all at one place in the lease queue, as partitions scheduled
   for one start are) until at least as many partitions wait as the lease counts'
   cap (1,000), time a lease cycle's two reads (``leases_read_free`` and
   ``lease_stats``, the counts behind the fair share), add copies until
   :data:`WAITING_GROWTH` times as many wait, and time them again. Both reads are
   bounded (a limit, a capped count), so past their bounds their time should not
   grow with the backlog.

Every step runs on each database the same way.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from datetime import timedelta
from typing import Any

from sqlalchemy import insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from bench.common import (
    PYTHON,
    Goal,
    Outcome,
    Row,
    Settings,
    create_partitions,
    ms_text,
    statefeed_tables,
    summary_ms,
)
from bench.procs import Processes
from processor import AsyncClient
from watcher import Store
from watcher.config import DEFAULT_LEASE_BATCH
from watcher.leasing.keeper import CANDIDATE_SPREAD
from watcher.store.drivers.sql import db_now
from watcher.store.sql.leases import FREE_COUNT_CAP

TITLE = ("Scale ({database}): many partitions x items; poll queries and memory as completed "
         "items accumulate")
# How each database refreshes a table's planner statistics ({name}: the quoted table name).
REFRESH_STATISTICS = {"postgresql": "VACUUM ANALYZE {name}", "sqlite": "ANALYZE {name}",
                      "mysql": "ANALYZE TABLE {name}", "mariadb": "ANALYZE TABLE {name}"}
QUERY_FLAT = 1.5  # bench criterion: the 90 % query time at most this times the 10 % one
WAITING_GROWTH = 10  # lease reads: timed with 1,000 partitions waiting (or more), then 10x
RSS_FLAT = 0.10  # bench criterion: memory grows at most 10 % from 10 % to 90 % complete


async def set_state(store: Store, partition_ids: list[str], items: int, share: float) -> list[str]:
    """Make the tables look ``share`` complete (see the module docstring); returns open ids."""
    p, i = store.tables.partitions, store.tables.items
    closed_count = round(share * len(partition_ids))
    open_ids = partition_ids[closed_count:]
    first_open = open_ids[0]
    cut = f"i{round(share * items):06d}"
    async with store.engine.begin() as conn:
        await conn.execute(update(i).values(status="complete", version=i.c.version + 1))
        await conn.execute(update(p).values(status="complete", owner="", version=p.c.version + 1))
        await conn.execute(update(i).where(i.c.partition_id >= first_open, i.c.id >= cut)
                           .values(status="available", version=i.c.version + 1))
        await conn.execute(update(p).where(p.c.id >= first_open)
                           .values(status="available", owner="", until=db_now(),
                                   gate=0, version=p.c.version + 1))
    async with store.engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        for table in (i, p):
            await refresh_statistics(conn, table.name)
    return open_ids


async def refresh_statistics(conn: AsyncConnection, table: str) -> None:
    """Refresh the planner's statistics of ``table`` as its database does it (outside a
    transaction: ``conn`` in autocommit).

    Raises:
        KeyError: a database this benchmark does not know.
    """
    dialect = conn.dialect
    statement = REFRESH_STATISTICS[dialect.name]
    await conn.execute(text(statement.format(name=dialect.identifier_preparer.quote(table))))


async def time_queries(store: Store, open_ids: list[str], samples: int, limit: int
                       ) -> dict[str, list[float]]:
    """Time ``items_ready`` on random open partitions and ``leases_read_free``, ``samples``
    each (reported as ``leases_free``)."""
    rng = random.Random(7)
    candidates = DEFAULT_LEASE_BATCH * CANDIDATE_SPREAD
    times: dict[str, list[float]] = {"items_ready": [], "leases_free": []}
    for _ in range(5):  # warm the connection and the caches
        await store.items_ready(rng.choice(open_ids), 0, limit)
        await store.leases_read_free(candidates)
    for _ in range(samples):
        started = time.perf_counter()
        ready = await store.items_ready(rng.choice(open_ids), 0, limit)
        times["items_ready"].append(time.perf_counter() - started)
        started = time.perf_counter()
        await store.leases_read_free(candidates)
        times["leases_free"].append(time.perf_counter() - started)
        if not ready:
            raise RuntimeError("items_ready found nothing: the table state is not as set")
    return times


async def add_waiting(store: Store, template_id: str, first: int, count: int) -> None:
    """Insert ``count`` copies of the partition row ``template_id`` (new ids from number
    ``first``, no items): partitions waiting to be leased, as a backlog holds them.

    They all share one place in the lease queue, a moment after the template's, as
    partitions scheduled for one start (or created in one transaction) do: the free
    read must take them in id order from its index, not sort them all."""
    if count <= 0:
        return
    p = store.tables.partitions
    async with store.engine.begin() as conn:
        row = dict((await conn.execute(select(p).where(p.c.id == template_id))).mappings().one())
        place = row["rank_at"] + timedelta(microseconds=1)
        copies = [{**row, "id": f"w{number:07d}", "rank_at": place}
                  for number in range(first, first + count)]
        for start in range(0, count, 5_000):
            await conn.execute(insert(p), copies[start:start + 5_000])
    async with store.engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await refresh_statistics(conn, p.name)


async def time_lease_reads(store: Store, samples: int) -> dict[str, list[float]]:
    """Time a lease cycle's two reads, ``samples`` each: the free partitions and the
    counts behind the fair share."""
    candidates = DEFAULT_LEASE_BATCH * CANDIDATE_SPREAD
    times: dict[str, list[float]] = {"leases_free": [], "lease_counts": []}
    for _ in range(5):  # warm the connection and the caches
        await store.leases_read_free(candidates)
        await store.lease_stats()
    for _ in range(samples):
        started = time.perf_counter()
        await store.leases_read_free(candidates)
        times["leases_free"].append(time.perf_counter() - started)
        started = time.perf_counter()
        await store.lease_stats()
        times["lease_counts"].append(time.perf_counter() - started)
    return times


def _compared(outcome: Outcome, name: str, low_times: list[float], high_times: list[float],
              *, label: str, goal: str, target: str, samples: int
              ) -> tuple[dict[str, float], dict[str, float]]:
    """Add a row ``label`` for query ``name``'s times in two states (p50 and p99 of each)
    and a goal that the second p50 is at most :data:`QUERY_FLAT` times the first;
    returns both summaries."""
    low, high = summary_ms(low_times), summary_ms(high_times)
    outcome.rows.append(Row(label,
                            f"{ms_text(low['p50_ms'] / 1000)} / {ms_text(high['p50_ms'] / 1000)}",
                            f"p99 {ms_text(low['p99_ms'] / 1000)} / "
                            f"{ms_text(high['p99_ms'] / 1000)}; {samples} samples each"))
    change = high["p50_ms"] / low["p50_ms"]
    outcome.goals.append(Goal(f"scale: {name} {goal} (bench criterion)", target,
                              f"{change:.2f}x", change <= QUERY_FLAT))
    return low, high


async def run(settings: Settings) -> Outcome:
    """The scale scenario (see the module docstring)."""
    sizes = settings.sizes
    outcome = Outcome("scale", TITLE.format(database=settings.database_title))
    partitions, per_partition = sizes.scale_partitions, sizes.scale_items
    total = partitions * per_partition
    out = settings.work_dir / "scale-worker.json"
    async with statefeed_tables(settings.db_url, "scale") as prefix:
        async with AsyncClient(settings.db_url, prefix) as client:
            started = time.perf_counter()
            ids = await create_partitions(client, [per_partition] * partitions)
            insert_seconds = time.perf_counter() - started
            async with Processes(settings.work_dir) as procs:
                worker = await procs.start(
                    "scale-worker", PYTHON, "-m", "bench.scale_worker",
                    "--db-url", settings.db_url, "--prefix", prefix,
                    "--partitions", str(partitions), "--items", str(total),
                    "--concurrency", str(sizes.concurrency),
                    "--timeout", str(sizes.phase_timeout), "--out", str(out))
                async with asyncio.timeout(sizes.phase_timeout + 30):
                    code = await worker.process.wait()
                if code != 0:
                    raise RuntimeError(f"the scale worker exited {code}:\n{worker.log()[-3000:]}")
            drain: dict[str, Any] = json.loads(out.read_text())
            if drain["items"] != total or drain["failed_partitions"]:
                raise RuntimeError(f"scale drain: {drain['items']} of {total} items complete, "
                                   f"{drain['failed_partitions']} partitions failed")
            limit = max(1, per_partition - math.ceil(0.9 * per_partition))
            queries: dict[str, dict[str, list[float]]] = {}
            for share in (0.9, 0.1):
                open_ids = await set_state(client.store, ids, per_partition, share)
                queries[f"{round(share * 100)}pct"] = await time_queries(
                    client.store, open_ids, sizes.query_samples, limit)
            # Still in the 10 % state: the open partitions wait, and copies of one of them.
            base = max(len(open_ids), FREE_COUNT_CAP)
            waiting: dict[int, dict[str, list[float]]] = {}
            added = 0
            for count in (base, base * WAITING_GROWTH):
                more = count - len(open_ids) - added
                await add_waiting(client.store, open_ids[0], added, more)
                added += more
                waiting[count] = await time_lease_reads(client.store, sizes.query_samples)
    rss = drain["rss_mb"]
    per_item = drain["statements"] / total
    outcome.rows.append(Row("dataset", f"{partitions:,} x {per_partition:,} items",
                            f"{total:,} items inserted in {insert_seconds:.1f} s"))
    outcome.rows.append(Row("drain (1 watcher, in its own process)",
                            f"{total / drain['seconds']:,.0f} items/s",
                            f"{drain['seconds']:.1f} s, {partitions / drain['seconds']:.1f} "
                            f"partitions closed per s"))
    growth = (rss["at_90pct"] - rss["at_10pct"]) / rss["at_10pct"] if rss.get("at_10pct") else None
    outcome.rows.append(Row("watcher RSS at 10 % / 90 % complete",
                            f"{rss.get('at_10pct', 0):.1f} / {rss.get('at_90pct', 0):.1f} MB",
                            f"start {rss['start']:.1f} MB, peak {rss['peak']:.1f} MB"))
    outcome.rows.append(Row("DB statements per item (scale drain)", f"{per_item:.3f}",
                            f"{drain['statements']:,} statements for {total:,} items"))
    figures_queries: dict[str, Any] = {}
    for name in ("items_ready", "leases_free"):
        low, high = _compared(outcome, name, queries["10pct"][name], queries["90pct"][name],
                              label=f"{name} p50 at 10 % / 90 % complete", goal="time flat",
                              target=f"90 %/10 % <= {QUERY_FLAT:g}x",
                              samples=sizes.query_samples)
        figures_queries[name] = {"at_10pct": low, "at_90pct": high}
    (few, few_times), (many, many_times) = sorted(waiting.items())
    figures_waiting: dict[str, Any] = {"waiting": [few, many]}
    for name in ("leases_free", "lease_counts"):
        low, high = _compared(outcome, name, few_times[name], many_times[name],
                              label=f"{name} p50 with {few:,} / {many:,} partitions waiting",
                              goal="time flat as partitions wait",
                              target=f"{WAITING_GROWTH}x waiting <= {QUERY_FLAT:g}x",
                              samples=sizes.query_samples)
        figures_waiting[name] = {f"waiting_{few}": low, f"waiting_{many}": high}
    outcome.goals.append(Goal("scale: watcher memory flat (bench criterion)",
                              f"+{RSS_FLAT:.0%} at most from 10 % to 90 %",
                              "-" if growth is None else f"{growth:+.1%}",
                              None if growth is None else growth <= RSS_FLAT))
    outcome.figures = {
        "partitions": partitions, "items_per_partition": per_partition, "items": total,
        "insert_seconds": round(insert_seconds, 2), "drain": drain,
        "statements_per_item": round(per_item, 4), "poll_queries": figures_queries,
        "lease_reads": figures_waiting,
        "items_ready_limit": limit,
    }
    return outcome
