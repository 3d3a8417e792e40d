"""Every database: the library drain and the HTTP hop on SQLite, PostgreSQL and MariaDB,
and SQLite's own limit, in one run.

    .venv/bin/python -m bench.databases --db all        # about 3 minutes
    .venv/bin/python -m bench.databases --db sqlite --rounds 3
    .venv/bin/python -m bench.databases --db all --smoke

- **Library drain** (each database): one in-process watcher drains N no-op
  items over P partitions at concurrency 32 (:func:`bench.library.statefeed_drain`,
  the library scenario's own drain, timed to the last partition closed).
- **SQLite's limit**: the same reads and guarded writes with no engine, through
  ``sqlite3`` on the same kind of file (the migrated tables, WAL, the result
  writer's ``synchronous=NORMAL``): read up to 256 ready rows of a partition with
  the store's ready query, write each one with a guarded ``UPDATE ... WHERE
  <primary key> AND version = ?`` through one ``executemany``, commit, next
  partition; until nothing is ready. The time is read once per statement and
  bound, as the SQLite driver does. It is the denominator of SQLite's ratio.
- **HTTP per item** (SQLite unless told otherwise): ``processor run
  --concurrency 32`` drains N items through the benchmark handler, against a
  bare ``aiohttp`` client posting the same N payloads to the same handler
  (:mod:`bench.http_mode`'s measures, best of at least three runs each).

The goals of issue 15 are checked on the figures of the same run: SQLite's
drain at least half its limit, SQLite's HTTP hop at least half the bare
client's, MariaDB's drain at least half PostgreSQL's. Databases that do not
answer are skipped with a message. The figures go to
``bench/results/databases.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from sqlalchemy import create_engine, text

import bench.common
from bench.common import (
    RESULTS_DIR,
    Goal,
    Outcome,
    Row,
    Settings,
    Sizes,
    best_round,
    create_partitions,
    postgres_url,
    rate_text,
    ratio,
    ratio_goal,
    settle_heap,
    spread,
    statefeed_tables,
)
from bench.library import Drain, statefeed_drain
from bench.report import print_goals, print_outcome, write_json
from processor import AsyncClient
from watcher.dburl import parse_database_url, redact_url
from watcher.migrate import downgrade
from watcher.schema import tables_for

DATABASES = ("sqlite", "postgres", "mariadb")
DEFAULT_MARIADB_URL = "mysql://root@127.0.0.1:3306/test"
MARIADB_URL_ENV = "PROCESSOR_BENCH_MARIADB_URL"
CONCURRENCY = 32  # the default; the table is at the default
RAW_BATCH = 256  # rows per read and per commit in SQLite's limit (the result batch)
HEADLINE_ROUNDS = 3  # both sides of the HTTP ratio run at least this many times
JSON_PATH = RESULTS_DIR / "databases.json"


def database_url(name: str, work_dir: Path) -> str:
    """The benchmark URL of ``name``: a fresh SQLite file in ``work_dir``, or the
    server at ``$PROCESSOR_BENCH_POSTGRES_URL`` / ``$PROCESSOR_BENCH_MARIADB_URL``."""
    if name == "sqlite":
        return f"sqlite:///{work_dir / 'bench.db'}"
    if name == "postgres":
        return postgres_url()
    return os.environ.get(MARIADB_URL_ENV, DEFAULT_MARIADB_URL)


def unreachable(db_url: str) -> str | None:
    """None when ``db_url`` answers ``SELECT 1``, otherwise why not (one line)."""
    try:
        engine = create_engine(parse_database_url(db_url).sync_url)
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        finally:
            engine.dispose()
    except Exception as error:  # any failure means "skip this database"
        first = str(error).splitlines()[0] if str(error) else ""
        return f"{type(error).__name__}: {first}"
    return None


def drop_tables(db_url: str, prefix: str) -> None:
    """Downgrade ``prefix`` to nothing and drop its Alembic version table, quoting the
    name as the database does (``bench.common``'s drop quotes it the standard way,
    which MariaDB refuses)."""
    downgrade(db_url, prefix)
    engine = create_engine(parse_database_url(db_url).sync_url)
    try:
        name = engine.dialect.identifier_preparer.quote(tables_for(prefix).version_table)
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {name}"))
    finally:
        engine.dispose()


# --------------------------------------------------------------------------- SQLite's limit


@dataclass(frozen=True)
class RawDrain:
    """SQLite's limit: items written, seconds, statements sent."""

    items: int
    seconds: float
    batches: int
    rounds: tuple[float, ...] = ()

    @property
    def per_second(self) -> float:
        """Items written per second."""
        return self.items / self.seconds

    def as_json(self) -> dict[str, Any]:
        """The drain as a JSON object."""
        return {"items": self.items, "seconds": round(self.seconds, 4),
                "items_per_s": round(self.per_second, 1), "batches": self.batches,
                "rounds_items_per_s": list(self.rounds)}


def _now() -> str:
    # The time as SQLite stores it, read once per statement (as the SQLite driver does).
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def _raw_drain(path: str, prefix: str, partition_ids: Sequence[str]) -> tuple[int, int]:
    """Drain every ready item of ``partition_ids`` with plain ``sqlite3``; returns
    (items written, batches)."""
    items = tables_for(prefix).items.name
    read = (f"SELECT id, version, gate, data, attempts FROM {items} WHERE partition_id = ? "
            f"AND status = 'available' AND gate = ? AND retry_at <= ? "
            f"ORDER BY retry_at, id LIMIT {RAW_BATCH}")
    write = (f"UPDATE {items} SET version = version + 1, status = 'complete', attempts = ?, "
             f"last_error = NULL, updated_at = ?, retry_at = ? "
             f"WHERE partition_id = ? AND id = ? AND version = ?")
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA synchronous=NORMAL")
        written = batches = 0
        pending = list(partition_ids)
        while pending:
            for partition_id in list(pending):
                rows = conn.execute(read, (partition_id, 0, _now())).fetchall()
                if not rows:
                    pending.remove(partition_id)
                    continue
                conn.execute("BEGIN IMMEDIATE")
                now = _now()
                changed = conn.executemany(write, [
                    (attempts + 1, now, now, partition_id, item_id, version)
                    for item_id, version, _, _, attempts in rows])
                conn.execute("COMMIT")
                written += changed.rowcount
                batches += 1
        return written, batches
    finally:
        conn.close()


async def raw_sqlite_drain(sizes: Sizes, work_dir: Path) -> RawDrain:
    """SQLite's limit on the library drain's items (see the module docstring).

    Raises:
        RuntimeError: not every item was written.
    """
    db_url = database_url("sqlite", work_dir)
    path = str(parse_database_url(db_url).sync_url.database)
    async with statefeed_tables(db_url, "raw") as prefix:
        async with AsyncClient(db_url, prefix) as client:
            ids = await create_partitions(client, spread(sizes.items, sizes.partitions))
        settle_heap()
        started = time.perf_counter()
        written, batches = _raw_drain(path, prefix, ids)
        seconds = time.perf_counter() - started
    if written != sizes.items:
        raise RuntimeError(f"sqlite3 drain: {written} of {sizes.items} items written")
    return RawDrain(written, seconds, batches)


# --------------------------------------------------------------------------- HTTP


async def http_per_item(settings: Settings, rounds: int) -> tuple[Any, Any]:
    """``processor run`` per item and the bare aiohttp client on one handler, each the
    best of ``rounds`` runs taken in turns; returns (processor run, bare aiohttp)."""
    from bench import http_mode
    from bench.procs import Processes

    sizes = settings.sizes
    system = f"processor run (concurrency {sizes.concurrency})"
    async with Processes(settings.work_dir) as procs:
        handler = await procs.handler()
        await http_mode.warm_up(handler)
        ours: list[Any] = []
        bare: list[Any] = []
        for _ in range(rounds):
            bare.append(await http_mode.measure_bare(
                handler, "bare aiohttp", http_mode.bare_aiohttp, sizes.http_items,
                sizes.concurrency, sizes.phase_timeout))
            ours.append(await http_mode.measure_processor(
                settings, procs, handler, system=system, items=sizes.http_items,
                args=("--concurrency", str(sizes.concurrency))))
    return best_round(ours), best_round(bare)


# --------------------------------------------------------------------------- scenarios


@dataclass
class DatabaseRun:
    """What one database measured."""

    name: str
    db_url: str
    drain: Drain | None = None
    raw: RawDrain | None = None
    http: tuple[Any, Any] | None = None
    skipped: str | None = None


async def measure(name: str, sizes: Sizes, rounds: int, work_dir: Path, *,
                  http: bool) -> DatabaseRun:
    """Measure one database: its library drain (and for SQLite its limit, the two
    interleaved), and with ``http`` the HTTP hop."""
    directory = work_dir / name
    directory.mkdir(parents=True, exist_ok=True)
    db_url = database_url(name, directory)
    run = DatabaseRun(name, db_url)
    problem = unreachable(db_url)
    if problem is not None:
        run.skipped = f"{redact_url(db_url)} does not answer ({problem})"
        return run
    settings = Settings(db_url=db_url, sizes=sizes, rounds=rounds, work_dir=directory)
    drains: list[Drain] = []
    raws: list[RawDrain] = []
    for _ in range(rounds):  # interleaved, so a busy moment hits both alike
        if name == "sqlite":
            raws.append(await raw_sqlite_drain(sizes, directory))
        drains.append(await statefeed_drain(settings, sizes.concurrency))
    run.drain = best_round(drains)
    run.raw = best_round(raws) if raws else None
    if http:
        run.http = await http_per_item(settings, max(rounds, HEADLINE_ROUNDS))
    return run


def outcome_of(run: DatabaseRun) -> Outcome:
    """The table of one database."""
    outcome = Outcome(f"db-{run.name}", f"{run.name}: library drain and HTTP per item "
                      f"({redact_url(run.db_url)})")
    if run.skipped is not None:
        outcome.status, outcome.reason = "skipped", run.skipped
        outcome.rows.append(Row(run.name, "skipped", run.skipped))
        return outcome
    figures: dict[str, Any] = {"url": redact_url(run.db_url)}
    if run.drain is not None:
        drain = run.drain
        outcome.rows.append(Row(f"library drain ({drain.settings})", rate_text(drain.per_second),
                                f"{drain.items:,} items in {drain.seconds:.2f} s; CPU "
                                f"{drain.extra['cpu_us_per_item']:,.0f} us/item; "
                                f"{drain.extra['statements_per_item']:.3f} statements/item; "
                                f"rounds {list(drain.rounds)}"))
        figures["library"] = drain.as_json()
    if run.raw is not None:
        raw = run.raw
        outcome.rows.append(Row("sqlite3, no engine (the limit)", rate_text(raw.per_second),
                                f"{raw.items:,} items in {raw.seconds:.2f} s, {raw.batches} "
                                f"commits of up to {RAW_BATCH}; rounds {list(raw.rounds)}"))
        figures["raw_sqlite3"] = raw.as_json()
        limit = ratio(run.drain.per_second if run.drain else None, raw.per_second)
        if limit is not None:
            outcome.rows.append(Row("ratio library drain / sqlite3 limit", f"{limit:.2f}x"))
        figures["ratio_library_over_raw"] = None if limit is None else round(limit, 3)
    if run.http is not None:
        ours, bare = run.http
        for one in (ours, bare):
            outcome.rows.append(Row(one.system, rate_text(one.per_second, "req/s"),
                                    one.detail() + f"; rounds {list(one.rounds)}"))
        hop = ratio(ours.per_second, bare.per_second)
        if hop is not None:
            outcome.rows.append(Row("ratio processor run / bare aiohttp", f"{hop:.2f}x"))
        figures["http"] = {"processor": ours.as_json(), "bare_aiohttp": bare.as_json(),
                           "ratio": None if hop is None else round(hop, 3)}
    outcome.figures = figures
    return outcome


def goals_of(runs: dict[str, DatabaseRun]) -> list[Goal]:
    """Issue 15's goals on this run's figures (not measured when a side is missing)."""
    sqlite, postgres, mariadb = (runs.get(name) for name in DATABASES)

    def rate(run: DatabaseRun | None, attribute: str) -> float | None:
        value = getattr(run, attribute, None) if run is not None else None
        return None if value is None else value.per_second

    hop = None
    if sqlite is not None and sqlite.http is not None:
        hop = ratio(sqlite.http[0].per_second, sqlite.http[1].per_second)
    return [
        ratio_goal("SQLite library drain vs the sqlite3 limit",
                   ratio(rate(sqlite, "drain"), rate(sqlite, "raw")), 0.5),
        ratio_goal("SQLite HTTP per item vs bare aiohttp", hop, 0.5),
        ratio_goal("MariaDB library drain vs PostgreSQL's",
                   ratio(rate(mariadb, "drain"), rate(postgres, "drain")), 0.5),
    ]


async def run(databases: Sequence[str], sizes: Sizes, *, rounds: int = 1,
              http: Sequence[str] = ("sqlite",), work_dir: Path | None = None
              ) -> tuple[list[Outcome], list[Goal]]:
    """Measure ``databases`` in turn (the HTTP hop on those in ``http``); returns a table
    per database and the goals."""
    async with AsyncExitStack() as stack:
        if work_dir is None:
            work_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(
                prefix="statefeed-bench-")))
        # bench.common drops a namespace's version table with standard quoting,
        # which MariaDB refuses; use the database's own while this runs.
        original = bench.common.drop_statefeed_tables
        bench.common.drop_statefeed_tables = drop_tables
        stack.callback(setattr, bench.common, "drop_statefeed_tables", original)
        runs: dict[str, DatabaseRun] = {}
        for name in databases:
            runs[name] = await measure(name, sizes, rounds, work_dir, http=name in http)
    return [outcome_of(one) for one in runs.values()], goals_of(runs)


async def outcomes(settings: Settings, databases: Sequence[str],
                   http: Sequence[str] = ("sqlite",)) -> list[Outcome]:
    """For ``python -m bench --db ...``: a table per database, then a summary table
    (``databases``) that carries the ratios and issue 15's goals, at
    ``settings``' sizes (the concurrency set to 32) and rounds."""
    sizes = settings.sizes.with_(concurrency=CONCURRENCY)
    tables, goals = await run(databases, sizes, rounds=settings.rounds, http=http,
                              work_dir=settings.work_dir / "databases")
    summary = Outcome("databases", "Every database: issue 15's ratios, in one run")
    summary.rows = [Row(goal.name, goal.measured, f"goal {goal.target}") for goal in goals]
    summary.goals = goals
    summary.figures = {"tables": {table.name: table.as_json() for table in tables}}
    return [*tables, summary]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command-line options."""
    parser = argparse.ArgumentParser(prog="python -m bench.databases",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--db", action="append", choices=(*DATABASES, "all"),
                        help="a database to measure (repeatable; default: all)")
    parser.add_argument("--http", action="append", choices=(*DATABASES, "all", "none"),
                        help="where to time the HTTP hop too (repeatable; default: sqlite)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="tiny sizes, to check it runs")
    size.add_argument("--items", type=int, metavar="N",
                      help="items per drain and per HTTP run (default 20,000 and 10,000)")
    parser.add_argument("--rounds", type=int, default=1, metavar="R",
                        help="runs per system, interleaved; the best counts (default 1)")
    parser.add_argument("--json", type=Path, default=JSON_PATH, metavar="PATH",
                        help="where to write the figures (default: %(default)s)")
    args = parser.parse_args(argv)
    if not 1 <= args.rounds <= 10:
        parser.error("--rounds must be from 1 to 10")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the measurements, print the tables and goals, write the JSON; returns 0."""
    args = parse_args(argv)
    chosen = args.db or ["all"]
    databases = list(DATABASES) if "all" in chosen else list(dict.fromkeys(chosen))
    http_on = args.http or ["sqlite"]
    http = (list(DATABASES) if "all" in http_on else
            [] if "none" in http_on else list(dict.fromkeys(http_on)))
    sizes = Sizes.for_run(smoke=args.smoke, full=False, items=args.items)
    sizes = sizes.with_(concurrency=CONCURRENCY)
    console = Console()
    started = time.monotonic()
    outcomes, goals = asyncio.run(run(databases, sizes, rounds=args.rounds, http=http))
    for outcome in outcomes:
        print_outcome(console, outcome)
    print_goals(console, goals)
    write_json(args.json, {
        "python": sys.version.split()[0], "sqlite": sqlite3.sqlite_version,
        "seconds": round(time.monotonic() - started, 1), "rounds": args.rounds,
        "sizes": {"items": sizes.items, "partitions": sizes.partitions,
                  "http_items": sizes.http_items, "concurrency": sizes.concurrency},
        "databases": {outcome.name: outcome.as_json() for outcome in outcomes},
        "goals": [goal.as_json() for goal in goals]})
    console.print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
