"""Row size: what the hot path's updates cost the partitions table on PostgreSQL.

16 long-lived partitions take one item at a time, round robin, from a producer while
one in-process watcher drains them with a no-op handler, so each partition closes and
re-opens over and over. Read from ``pg_stat_user_tables`` and the catalogue over
that phase: updates, HOT updates and dead tuples of the partitions table per item
done, the average partitions row (``pg_column_size``) and the table's size
(``pg_total_relation_size``). A second phase does the same while another session
holds a transaction open (the vacuum horizon stays put), and reports how far the
table grew. The same figures for ``partition_timelines`` (the timelines' own rows,
revision 0013) follow, and dead tuples a job of both tables together.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from bench.common import Outcome, Row, Settings, statefeed_tables
from processor import AsyncClient, NewItem
from watcher import Result, Store, Watcher, WatcherConfig, WorkItem
from watcher.store.sql.schema import tables_for

TITLE = "Row size (PostgreSQL): the partitions table under 16 partitions closing and re-opening"
PARTITIONS = 16
STATS_FLUSH = 1.5  # seconds: backends report their counters at most once a second


async def _noop(item: WorkItem) -> Result:
    return Result(done=True)


async def _table_figures(conn: AsyncConnection, table: str) -> dict[str, float]:
    await conn.execute(text("SELECT pg_stat_clear_snapshot()"))
    row = (await conn.execute(text(
        "SELECT n_tup_upd, n_tup_hot_upd, n_dead_tup, pg_total_relation_size(relid) "
        "FROM pg_stat_user_tables WHERE relname = :t"), {"t": table})).first()
    if row is None:  # a table this revision does not have
        return {"updates": 0, "hot": 0, "dead": 0, "bytes": 0, "row_bytes": 0.0}
    width = (await conn.execute(text(
        f'SELECT coalesce(avg(pg_column_size(p.*)), 0) FROM "{table}" p'))).scalar_one()
    return {"updates": row[0], "hot": row[1], "dead": row[2], "bytes": row[3],
            "row_bytes": float(width)}


async def _phase(client: AsyncClient, admin: AsyncConnection, tables: tuple[str, str],
                 seconds: float, hold: bool, db_url: str) -> dict[str, Any]:
    """Feed items for ``seconds`` (holding a transaction open if ``hold``); the deltas
    of the partitions table, and under ``"timelines"`` those of the timelines'."""
    holder_engine = create_async_engine(db_url)
    holder = await holder_engine.connect() if hold else None
    try:
        if holder is not None:
            await holder.execute(text("SELECT txid_current()"))  # pins the horizon
        await asyncio.sleep(STATS_FLUSH)
        befores = [await _table_figures(admin, table) for table in tables]
        done_before = await _done(client)
        deadline, n = time.monotonic() + seconds, 0
        while time.monotonic() < deadline:
            n += 1
            await client.add_items(f"p{n % PARTITIONS:02d}", [NewItem(f"x{time.time_ns()}", b"")])
            await asyncio.sleep(0.005)
        await asyncio.sleep(STATS_FLUSH + 1.0)
        afters = [await _table_figures(admin, table) for table in tables]
        jobs = max(1, await _done(client) - done_before)
    finally:
        if holder is not None:
            await holder.rollback()
            await holder.close()
        await holder_engine.dispose()
    figures = _deltas(befores[0], afters[0], jobs)
    figures["timelines"] = _deltas(befores[1], afters[1], jobs)
    figures["dead_per_job_both"] = round(
        figures["dead_per_job"] + figures["timelines"]["dead_per_job"], 3)
    return figures


def _deltas(before: dict[str, float], after: dict[str, float], jobs: int) -> dict[str, Any]:
    updates = after["updates"] - before["updates"]
    hot = after["hot"] - before["hot"]
    return {"jobs": jobs, "updates_per_job": round(updates / jobs, 3),
            "hot_pct": round(100 * hot / updates, 1) if updates else 0.0,
            "dead_per_job": round((after["dead"] - before["dead"]) / jobs, 3),
            "row_bytes": round(after["row_bytes"]), "bytes_before": before["bytes"],
            "bytes_after": after["bytes"]}


async def _done(client: AsyncClient) -> int:
    total = 0
    for number in range(PARTITIONS):
        total += sum(1 for item in await client.items(f"p{number:02d}")
                     if item.status == "complete")
    return total


async def run(settings: Settings) -> Outcome:
    """The rowsize scenario (see the module docstring); PostgreSQL only.

    Raises:
        RuntimeError: the watcher stopped early.
    """
    outcome = Outcome("rowsize", TITLE)
    seconds = 2.0 if settings.mode == "smoke" else 30.0
    async_url = settings.db_url.replace("postgresql://", "postgresql+asyncpg://", 1)
    async with statefeed_tables(settings.db_url, "rows") as prefix:
        names = tables_for(prefix)
        tables = (names.partitions.name, names.timelines.name)
        async with AsyncClient(settings.db_url, prefix) as client:
            for number in range(PARTITIONS):
                await client.create_partition(f"p{number:02d}", [NewItem("seed", b"")])
            store = Store.open(settings.db_url, prefix)
            watcher = Watcher(store, _noop, WatcherConfig(owner_id="bench-rowsize"))
            running = asyncio.create_task(watcher.run())
            admin_engine = create_async_engine(async_url, isolation_level="AUTOCOMMIT")
            try:
                async with admin_engine.connect() as admin:
                    free = await _phase(client, admin, tables, seconds, False, async_url)
                    held = await _phase(client, admin, tables, seconds, True, async_url)
            finally:
                await watcher.stop()
                await running
                await store.close()
                await admin_engine.dispose()
    for key, name, figures in (("steady", "steady", free),
                               ("held", f"a transaction held {seconds:g} s", held)):
        outcome.rows.append(Row(
            f"{name}: dead tuples a job", f"{figures['dead_per_job']:g}",
            f"{figures['jobs']} jobs; {figures['updates_per_job']:g} updates a job, "
            f"{figures['hot_pct']:g} % HOT; row {figures['row_bytes']} B; table "
            f"{figures['bytes_before'] / 1e6:.2f} -> {figures['bytes_after'] / 1e6:.2f} MB"))
        side = figures["timelines"]
        outcome.rows.append(Row(
            f"{name}: timelines' dead tuples a job", f"{side['dead_per_job']:g}",
            f"{side['updates_per_job']:g} updates a job, {side['hot_pct']:g} % HOT; row "
            f"{side['row_bytes']} B; table {side['bytes_before'] / 1e6:.2f} -> "
            f"{side['bytes_after'] / 1e6:.2f} MB; both tables "
            f"{figures['dead_per_job_both']:g} dead tuples a job"))
        outcome.figures[key] = figures
    return outcome
