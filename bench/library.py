"""Library mode: an in-process statefeed watcher against PGQueuer, both draining no-op work.

statefeed: N items over P partitions are inserted first (it runs at its
default concurrency, 32, and at 128); the clock starts as
the watcher starts and stops when the last partition closes (a hook, not
client polling), so it covers leasing, reading, dispatching, writing every
result and closing every partition. The watcher's engine counts its SQL
statements meanwhile.

PGQueuer: N jobs are enqueued first (one batch insert), in their own prefixed
tables; the clock starts as the queue managers start and stops when the N-th
job's completion has been written (its log buffer flushed: the job left the
queue table), which is PGQueuer's equivalent of a written result. It runs
with batch sizes 10 and 100 in one queue manager, and with the setup of
PGQueuer's own drain benchmark (several queue managers, batch size 10). The
ratio compares statefeed with the best of them. Both run on the same asyncio
loop (no uvloop) in this process. "CPU per item" is this process's CPU time
(user + system) during the drain over the items: the client side's cost, less
noisy than rates when other work shares the machine (PostgreSQL's own CPU is
not in it).

PGQueuer runs on PostgreSQL only; on the other databases its rows say so and
its goal is not computed. On SQLite and PostgreSQL the drain is also set against
the database's own floor, in the same rounds: the same rows read in batches and
written with guarded batch writes, with no engine, straight through ``sqlite3`` or
``psycopg`` (:mod:`bench.raw_drains`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from bench.common import (
    Goal,
    Outcome,
    Row,
    Settings,
    best_round,
    cpu_seconds,
    create_partitions,
    libpq_url,
    new_prefix,
    rate_text,
    ratio,
    ratio_goal,
    settle_heap,
    spread,
    statefeed_tables,
)
from bench.counting import DrainHooks, StatementCounter
from bench.raw_drains import RAW_BATCH, RawDrain, raw_psycopg_drain, raw_sqlite_drain
from processor import AsyncClient
from watcher import Result, Store, Watcher, WatcherConfig, WorkItem
from watcher.config import DEFAULT_CONCURRENCY, DEFAULT_RESULT_BUFFER

TITLE = "Library mode: drain no-op items in-process (statefeed Watcher vs PGQueuer)"
TITLE_SQLITE = "Library mode: drain no-op items in-process (statefeed Watcher vs sqlite3's limit)"
ENTRYPOINT = "bench_noop"
ENQUEUE_CHUNK = 10_000
WIDE_CONCURRENCY = 128  # about as many items in hand as PGQueuer's batch of 100


@dataclass(frozen=True)
class Drain:
    """One system's drain: how many items, how long, and the settings used."""

    system: str
    settings: str
    items: int
    seconds: float
    extra: dict[str, Any]
    rounds: tuple[float, ...] = ()  # items/s of every round, when run more than once

    @property
    def per_second(self) -> float:
        """Items drained per second."""
        return self.items / self.seconds

    def as_json(self) -> dict[str, Any]:
        """The drain as a JSON object."""
        return {"system": self.system, "settings": self.settings, "items": self.items,
                "seconds": round(self.seconds, 4), "items_per_s": round(self.per_second, 1),
                "rounds_items_per_s": list(self.rounds), **self.extra}


async def _noop(item: WorkItem) -> Result:
    return Result(done=True)


async def statefeed_drain(settings: Settings, concurrency: int) -> Drain:
    """Drain ``items`` no-op items over ``partitions`` partitions with one watcher.

    Raises:
        TimeoutError: the drain did not finish within the phase timeout.
        RuntimeError: items failed or were left over.
    """
    sizes = settings.sizes
    async with statefeed_tables(settings.db_url, "lib") as prefix:
        async with AsyncClient(settings.db_url, prefix) as client:
            ids = await create_partitions(client, spread(sizes.items, sizes.partitions))
            store = Store.open(settings.db_url, prefix)
            counter = StatementCounter(store)
            hooks = DrainHooks(len(ids), counter)
            # The processor's own variable turns the write buffer on here too.
            config = WatcherConfig(owner_id="bench-library", concurrency=concurrency,
                                   result_buffer=int(os.environ.get(
                                       "PROCESSOR_RESULT_BUFFER", DEFAULT_RESULT_BUFFER)))
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
    if (hooks.failed or hooks.completed_items != sizes.items
            or any(info is None or info.status != "complete" for info in infos)):
        raise RuntimeError(
            f"statefeed drain: {hooks.completed_items} of {sizes.items} items complete, "
            f"{hooks.failed} partitions failed, other outcomes {dict(hooks.other_outcomes)}")
    assert hooks.finished_at is not None and hooks.statements_at_end is not None
    assert hooks.cpu_at_end is not None
    statements = hooks.statements_at_end
    default = " (default)" if concurrency == DEFAULT_CONCURRENCY else ""
    return Drain("statefeed", f"1 watcher, concurrency {concurrency}{default}, "
                 f"{sizes.partitions} partitions", sizes.items, hooks.finished_at - started,
                 {"cpu_us_per_item": _per_item_us(hooks.cpu_at_end - cpu_started, sizes.items),
                  "statements": statements,
                  "statements_per_item": round(statements / sizes.items, 4),
                  "statements_by_kind": hooks.kinds_at_end})


# --------------------------------------------------------------------------- PGQueuer


def pgqueuer_available() -> str | None:
    """None when PGQueuer (with asyncpg) can be imported, otherwise why not."""
    try:
        import asyncpg  # noqa: F401
        import pgqueuer  # noqa: F401
    except ImportError as error:
        return f"not installed ({error.name}); pip install -e '.[bench]'"
    return None


async def pgqueuer_drain(settings: Settings, *, batch_size: int, workers: int) -> Drain:
    """Drain ``items`` no-op jobs with ``workers`` PGQueuer queue managers (asyncpg).

    Raises:
        TimeoutError: the drain did not finish within the phase timeout.
    """
    import asyncpg
    import pgqueuer
    from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager
    from pgqueuer.adapters.persistence.qb import (
        QueryBuilderEnvironment,
        QueryQueueBuilder,
        QuerySchedulerBuilder,
    )
    from pgqueuer.domain.settings import DBSettings
    from pgqueuer.domain.types import Channel

    logging.getLogger("pgqueuer").setLevel(logging.WARNING)
    sizes = settings.sizes
    dsn = libpq_url(settings.db_url)
    names = DBSettings(prefix=new_prefix("pgq"))

    opened: list[Any] = []

    async def queries_on_new_connection() -> Queries:
        connection = await asyncpg.connect(dsn=dsn)
        opened.append(connection)
        return Queries(AsyncpgDriver(connection), qbe=QueryBuilderEnvironment(names),
                       qbq=QueryQueueBuilder(names), qbs=QuerySchedulerBuilder(names))

    admin = await queries_on_new_connection()
    try:
        await admin.install()
        for start in range(0, sizes.items, ENQUEUE_CHUNK):
            count = min(ENQUEUE_CHUNK, sizes.items - start)
            await admin.enqueue([ENTRYPOINT] * count, [b'{"n":0}'] * count, [0] * count)
        acked = 0
        finished: list[float] = []  # the time and this process's CPU time at the end
        done = asyncio.Event()
        managers: list[QueueManager] = []
        for _ in range(workers):
            queries = await queries_on_new_connection()
            log_jobs = queries.log_jobs

            async def counted(job_status: Any, log_jobs: Any = log_jobs) -> None:
                nonlocal acked
                await log_jobs(job_status)
                acked += sum(1 for _, status, _ in job_status if status == "successful")
                if acked >= sizes.items and not done.is_set():
                    finished.extend((time.perf_counter(), cpu_seconds()))
                    done.set()

            queries.log_jobs = counted  # type: ignore[method-assign]
            manager = QueueManager(queries, channel=Channel(names.channel))

            @manager.entrypoint(ENTRYPOINT)
            async def noop(job: Job) -> None:
                return None

            managers.append(manager)
        settle_heap()
        started, cpu_started = time.perf_counter(), cpu_seconds()
        tasks = [asyncio.create_task(manager.run(batch_size=batch_size,
                                                 dequeue_timeout=timedelta(seconds=5)))
                 for manager in managers]
        try:
            async with asyncio.timeout(sizes.phase_timeout):
                await done.wait()
        finally:
            for manager in managers:
                manager.shutdown.set()
            await asyncio.wait(tasks, timeout=30)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        try:
            await admin.uninstall()
        finally:
            for connection in opened:
                await connection.close()
    return Drain("PGQueuer", f"{workers} queue manager{'s' if workers > 1 else ''}, "
                 f"batch {batch_size}, asyncpg", sizes.items, finished[0] - started,
                 {"cpu_us_per_item": _per_item_us(finished[1] - cpu_started, sizes.items),
                  "version": pgqueuer.__version__, "batch_size": batch_size,
                  "queue_managers": workers, "driver": "asyncpg"})


def _raw_rows(outcome: Outcome, ours: Drain, raw: RawDrain | None,
              full_sync: RawDrain | None) -> float | None:
    """The rows of the drains with no engine (``sqlite3``'s, or ``psycopg``'s), beside
    statefeed's at its defaults (``ours``); returns statefeed's ratio to the floor, if
    there is one."""
    over_raw = ratio(ours.per_second, raw.per_second) if raw is not None else None
    driver = "sqlite3" if full_sync is not None else "psycopg"
    if raw is not None:
        outcome.rows.append(Row(f"{driver}, no engine (the floor)", rate_text(raw.per_second),
                                f"{raw.items:,} items in {raw.seconds:.2f} s, {raw.batches} "
                                f"commits of up to {RAW_BATCH}" + _rounds_text(raw.rounds)))
        if over_raw is not None:
            outcome.rows.append(Row(f"ratio statefeed at its defaults / {driver} floor",
                                    f"{over_raw:.2f}x", ours.settings))
    if full_sync is not None:
        outcome.rows.append(Row("sqlite3, no engine, synchronous=FULL (reference)",
                                rate_text(full_sync.per_second),
                                f"sqlite3's default sync level; statefeed at its defaults is "
                                f"{ours.per_second / full_sync.per_second:.2f}x of it"))
    return over_raw


async def run(settings: Settings) -> Outcome:
    """The library-mode scenario (see the module docstring).

    Raises:
        TimeoutError: a drain did not finish within the phase timeout.
        RuntimeError: a drain left items over or failed them.
    """
    sizes = settings.sizes
    on_postgres = settings.database == "postgres"
    on_sqlite = settings.database == "sqlite"
    outcome = Outcome("library", TITLE_SQLITE if on_sqlite else TITLE)
    missing = pgqueuer_available() if on_postgres else None
    # Each system at its defaults and at a setting with about 100 items in hand
    # (PGQueuer's batch of 100; statefeed's concurrency 128); the best of each counts.
    ours_configs = list(dict.fromkeys((sizes.concurrency, WIDE_CONCURRENCY)))
    theirs_configs = ([(10, 1), (100, 1), (10, sizes.pgqueuer_workers)]
                      if on_postgres and missing is None else [])
    ours_runs: dict[int, list[Drain]] = {config: [] for config in ours_configs}
    theirs_runs: dict[tuple[int, int], list[Drain]] = {config: [] for config in theirs_configs}
    raw_runs: list[RawDrain] = []
    for _ in range(settings.rounds):  # interleaved, so a busy moment hits everyone alike
        if on_sqlite:
            raw_runs.append(await raw_sqlite_drain(settings))
        elif on_postgres:
            raw_runs.append(await raw_psycopg_drain(settings))
        for concurrency in ours_configs:
            ours_runs[concurrency].append(await statefeed_drain(settings, concurrency))
        for batch_size, workers in theirs_configs:
            theirs_runs[batch_size, workers].append(
                await pgqueuer_drain(settings, batch_size=batch_size, workers=workers))
    ours = [best_round(runs) for runs in ours_runs.values()]
    theirs = [best_round(runs) for runs in theirs_runs.values()]
    raw = best_round(raw_runs) if raw_runs else None
    # For reference: the same limit syncing the log at every commit, as sqlite3 does by
    # default (what client writes pay); not a goal's denominator.
    full_sync = await raw_sqlite_drain(settings, "FULL") if on_sqlite else None
    ours_best = max(ours, key=lambda drain: drain.per_second)
    best = max(theirs, key=lambda drain: drain.per_second, default=None)
    headline = ratio(ours_best.per_second, best.per_second if best else None)
    at_default = ratio(ours[0].per_second, best.per_second if best else None)
    for drain in ours:
        outcome.rows.append(Row(f"statefeed ({drain.settings})", rate_text(drain.per_second),
                                f"{drain.items:,} items in {drain.seconds:.2f} s; "
                                f"CPU {drain.extra['cpu_us_per_item']:,.0f} us/item; "
                                f"{drain.extra['statements_per_item']:.3f} statements/item"
                                + _rounds_text(drain.rounds)))
    for drain in theirs:
        outcome.rows.append(Row(f"PGQueuer {pgqueuer_version(drain)}({drain.settings})",
                                rate_text(drain.per_second),
                                f"{drain.items:,} jobs in {drain.seconds:.2f} s; "
                                f"CPU {drain.extra['cpu_us_per_item']:,.0f} us/item"))
    if not on_postgres:
        outcome.rows.append(Row("PGQueuer", "PostgreSQL only",
                                f"not run on {settings.database_title}"))
    elif missing is not None:
        outcome.rows.append(Row("PGQueuer", "not installed", missing))
    if best is not None and headline is not None and at_default is not None:
        outcome.rows.append(Row("ratio best statefeed / best PGQueuer", f"{headline:.2f}x",
                                f"{ours_best.settings} vs {best.settings}"))
        outcome.rows.append(Row("ratio statefeed at its defaults / best PGQueuer",
                                f"{at_default:.2f}x", ours[0].settings))
    over_raw = _raw_rows(outcome, ours[0], raw, full_sync)
    # The goal is checked on the default concurrency: fewer items per read, more statements.
    per_item = ours[0].extra["statements_per_item"]
    outcome.rows.append(Row("DB statements per item (statefeed, defaults)", f"{per_item:.3f}",
                            f"{ours[0].extra['statements']:,} statements for {ours[0].items:,} "
                            f"items ({_kinds(ours[0].extra['statements_by_kind'])})"))
    outcome.figures = {
        "items": sizes.items, "partitions": sizes.partitions,
        "statefeed": [drain.as_json() for drain in ours],
        "statements_per_item": per_item,
    }
    if on_postgres:
        outcome.figures.update({
            "pgqueuer": [drain.as_json() for drain in theirs] if missing is None else missing,
            "ratio_statefeed_over_best_pgqueuer":
                None if headline is None else round(headline, 3),
            "ratio_default_statefeed_over_best_pgqueuer":
                None if at_default is None else round(at_default, 3)})
        outcome.goals.append(ratio_goal("library: statefeed vs PGQueuer (best vs best)",
                                        headline, 2.0))
    else:
        outcome.figures["pgqueuer"] = f"PostgreSQL only: not run on {settings.database_title}"
    if raw is not None:
        outcome.figures["raw_sqlite3" if on_sqlite else "raw_psycopg"] = raw.as_json()
        if full_sync is not None:
            outcome.figures["raw_sqlite3_full_sync"] = full_sync.as_json()
        outcome.figures["ratio_library_over_raw"] = (None if over_raw is None
                                                     else round(over_raw, 3))

    outcome.goals.append(Goal("DB statements per item, amortized", "<= 1",
                              f"{per_item:.3f}", per_item <= 1.0))
    return outcome


def _rounds_text(rounds: tuple[float, ...]) -> str:
    """``; rounds [1.0, 2.0]`` when there was more than one round, else ""."""
    return f"; rounds {list(rounds)}" if len(rounds) > 1 else ""


def pgqueuer_version(drain: Drain) -> str:
    """``1.6.0 `` (with a trailing space) or ""."""
    version = drain.extra.get("version")
    return f"{version} " if version else ""


def _per_item_us(cpu: float, items: int) -> float:
    return round(cpu / items * 1e6, 1)


def _kinds(kinds: dict[str, int]) -> str:
    return ", ".join(f"{kind} {count:,}" for kind, count in kinds.items())
