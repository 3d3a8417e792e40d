"""Renewals: what one renewal of a watcher's leases costs, as its lease count grows.

For each count (the slots' backlog a watcher leases for, two lease batches of 16,
and the most one statement names, 128):
create that many partitions, take them all under one owner, then renew them
``query_samples`` times in a row (at least 20), each renewal carrying progress for
every lease (two items done), as a keeper's does when its partitions are busy, with
the holder's copies of the timelines kept as the keeper keeps them. Reported per
renewal: the wall time (median and p99), this process's CPU, and the statements
sent (through the engine and the driver's own path). A release of them all ends it.
"""

from __future__ import annotations

import time

from bench.common import (
    Outcome,
    Row,
    Settings,
    ms_text,
    statefeed_tables,
    summary_ms,
)
from bench.counting import StatementCounter
from processor import NewItem
from watcher import Store
from watcher.config import DEFAULT_LEASE_BATCH
from watcher.rules.timeline import Progress
from watcher.store.codecs import LEASE_CHUNK

TITLE = "Renewals ({database}): one renewal of a watcher's leases, with progress for each"
MIN_SAMPLES = 20


async def _renewals(settings: Settings, count: int, samples: int) -> dict[str, object]:
    """Renew ``count`` leases ``samples`` times; the figures of one count.

    Raises:
        RuntimeError: a lease was not taken, renewed or released.
    """
    async with statefeed_tables(settings.db_url, "renew") as prefix:
        store = Store.open(settings.db_url, prefix)
        try:
            for number in range(count):
                await store.partition_create(f"p{number:05d}", [NewItem("i", b"x")])
            won = await store.leases_take(await store.leases_read_free(count), "bench", 60.0)
            if len(won) != count:
                raise RuntimeError(f"renewals: took {len(won)} of {count} leases")
            versions = {row.id: row.version for row in won}
            copies = {row.id: row.timeline for row in won}
            counter = StatementCounter(store)
            times: list[float] = []
            cpu_started = time.process_time()
            for _ in range(samples):
                started = time.perf_counter()
                renewal = await store.leases_renew(
                    versions, "bench", 60.0, {pid: Progress(0, 2, 0.5) for pid in versions},
                    copies)
                times.append(time.perf_counter() - started)
                if len(renewal.held) != count:
                    raise RuntimeError(f"renewals: renewed {len(renewal.held)} of {count}")
                versions = {pid: version for pid, (version, _) in renewal.held.items()}
                copies.update(renewal.timelines)
                copies.update(renewal.timelines_read)
            cpu_ms = (time.process_time() - cpu_started) * 1000 / samples
            statements = counter.total / samples
            counter.close()
            if await store.leases_release(versions, "bench") != count:
                raise RuntimeError("renewals: not every lease was released")
        finally:
            await store.close()
    return {"leases": count, "renewal": summary_ms(times), "cpu_ms": round(cpu_ms, 3),
            "statements": round(statements, 2)}


async def run(settings: Settings) -> Outcome:
    """The renewals scenario (see the module docstring).

    Raises:
        RuntimeError: a lease was not taken, renewed or released.
    """
    outcome = Outcome("renewals", TITLE.format(database=settings.database_title))
    samples = max(MIN_SAMPLES, settings.sizes.query_samples // 10)
    for count in (2 * DEFAULT_LEASE_BATCH, LEASE_CHUNK):
        figures = await _renewals(settings, count, samples)
        timing = figures["renewal"]
        assert isinstance(timing, dict)
        outcome.rows.append(Row(
            f"renew {count} leases", ms_text(timing["p50_ms"] / 1000),
            f"p50 of {samples}; p99 {ms_text(timing['p99_ms'] / 1000)}; CPU "
            f"{figures['cpu_ms']:.2f} ms; {figures['statements']:g} statements a renewal"))
        outcome.figures[f"leases_{count}"] = figures
    return outcome
