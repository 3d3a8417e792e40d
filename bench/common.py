"""What every scenario shares: settings, sizes, result values, namespaces and timing helpers.

A scenario is an ``async def run(settings) -> Outcome``. It creates what it
needs in a fresh table namespace (dropped afterwards), bounds every wait, and
returns plain values: the rows of the printed table, the figures for the JSON
file, and the performance goals checked against its figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import math
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from processor import AsyncClient, NewItem
from watcher.store.db.migrate import downgrade, upgrade
from watcher.store.db.urls import parse_database_url
from watcher.store.sql.schema import tables_for

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "bench" / "results"
PYTHON = sys.executable
PROCESSOR = str(Path(sys.executable).with_name("processor"))

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
POSTGRES_URL_ENV = "PROCESSOR_BENCH_POSTGRES_URL"
DEFAULT_MARIADB_URL = "mysql://root@127.0.0.1:3306/test"
MARIADB_URL_ENV = "PROCESSOR_BENCH_MARIADB_URL"
SQLITE_FILE = "bench.db"

# The databases ``--db`` picks from, in the order they run and print, and their names.
DATABASES = ("sqlite", "postgres", "mariadb")
DATABASE_TITLES = {"sqlite": "SQLite", "postgres": "PostgreSQL", "mariadb": "MariaDB"}

# Scenario names, in the order they run and print.
SCENARIOS = ("library", "flow", "small", "fleet", "pooled", "instructions", "http", "batch",
             "spawn", "ingest", "latency", "failover", "renewals", "rowsize", "scale", "fanin",
             "reduce", "chord", "crawl", "park", "pipelines")
# Scenarios that run on PostgreSQL alone (they compare with PostgreSQL-only systems or
# time PostgreSQL's wake-ups); on the other databases they are reported as not run.
POSTGRES_ONLY = ("fleet", "pooled", "failover", "rowsize", "fanin", "reduce", "chord", "crawl")


def postgres_url() -> str:
    """The benchmark database: ``$PROCESSOR_BENCH_POSTGRES_URL`` or the local test database."""
    return os.environ.get(POSTGRES_URL_ENV, DEFAULT_POSTGRES_URL)


def database_url(name: str, work_dir: Path) -> str:
    """The benchmark URL of database ``name`` (one of :data:`DATABASES`): a SQLite file
    in ``work_dir`` (the caller starts it fresh), or the server at
    ``$PROCESSOR_BENCH_POSTGRES_URL`` / ``$PROCESSOR_BENCH_MARIADB_URL``."""
    if name == "sqlite":
        return f"sqlite:///{work_dir / SQLITE_FILE}"
    if name == "postgres":
        return postgres_url()
    return os.environ.get(MARIADB_URL_ENV, DEFAULT_MARIADB_URL)


def database_of(db_url: str) -> str:
    """Which database ``db_url`` points at: ``sqlite``, ``postgres``, ``mariadb`` (MySQL
    too), or SQLAlchemy's name for any other."""
    backend = parse_database_url(db_url).sync_url.get_backend_name()
    return {"postgresql": "postgres", "mysql": "mariadb"}.get(backend, backend)


def libpq_url(db_url: str) -> str:
    """``db_url`` as a plain ``postgresql://`` URL for psycopg, asyncpg and libpq."""
    url = parse_database_url(db_url).sync_url.set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


# A drain under callgrind (the instructions scenario) runs tens of times slower than
# without, start-up most of all (every import is emulated), and on a busy machine
# slower still: however small the run, each counted drain may take this long.
INSTRUMENTED_TIMEOUT = 480.0


@dataclass(frozen=True)
class Sizes:
    """How big each scenario is. ``for_run`` picks the smoke, default or full set."""

    items: int = 20_000  # library mode: no-op items in all
    partitions: int = 10  # library and HTTP modes: items spread over this many partitions
    concurrency: int = 32  # statefeed's default; the bare HTTP clients use the same
    http_items: int = 10_000  # HTTP per-item mode, per system
    batch_items: int = 20_000  # HTTP batch mode
    batch_size: int = 100
    batch_concurrency: int = 400  # items in flight in batch mode: a few batches at once
    pgqueuer_workers: int = 5  # PGQueuer's own benchmark runs 5 queue managers
    # The systems of an HTTP headline ratio (bare aiohttp, processor run with its default
    # transport, batch mode) run at least this many times each; the best run counts.
    headline_rounds: int = 3
    latency_samples: int = 50
    latency_poll: float = 1.0  # polling alone would give ~poll/2 median latency
    failover_partitions: int = 8
    lease_duration: float = 2.0
    scale_partitions: int = 1_000
    scale_items: int = 50  # per partition
    small_partitions: int = 2_000  # small partitions: this many partitions...
    small_items: int = 20  # ...of this many items each
    fleet_partitions: int = 40  # fleet: partitions drained by 1, 2 and 4 processors...
    fleet_items: int = 2_000  # ...of this many items each (a drain long enough that
    # each processor's one-off start, ~0.1 s of CPU, is not counted as a cost per item)
    pooled_processors: tuple[int, ...] = (1, 2, 4, 8, 16)  # pooled: the scale curve's sizes,
    pooled_partitions: int = 64  # direct and through PgBouncer, draining this many
    pooled_items: int = 1_000  # partitions of this many items each
    instructions_partitions: int = 10  # instructions: two counted drains over this many
    instructions_items: tuple[int, int] = (1_000, 5_000)  # ...partitions, of these items
    flow_items: int = 10_000  # flow: no-op items per library drain, over `partitions`
    flow_rounds: int = 2  # flow: rounds of its drains (at least; --rounds may ask more)
    query_samples: int = 200
    fanin_items: int = 10_000  # fan-in latency: items per reduce gate
    fanin_samples: int = 10  # fan-in latency: partitions, one after another
    reduce_gate_items: tuple[int, ...] = (10_000, 100_000)  # big reduce gates, in turn
    spawn_children: int = 100_000  # spawn: children inserted through answers, in all
    spawn_page: int = 1_000  # spawn: children per answer (and per add_items call)
    ingest_items: int = 50_000  # ingest: items per create, API NDJSON and client alike
    ingest_json_items: int = 10_000  # ingest: items per create with one JSON body
    park_items: int = 100_000  # park: items parked, then completed through the API
    crawl_count: int = 20  # crawl: trees, each one partition (one reduce)
    crawl_fanout: int = 5  # crawl: children per node
    crawl_depth: int = 3  # crawl: levels below the root (5, 3: 156 nodes a tree)
    chord_partitions: int = 20  # fan-out/fan-in against Celery's chord: P partitions x
    chord_items: int = 500  # N items each
    # Celery worker setups ("pool:concurrency"), each run in turn; the best one counts.
    celery_setups: tuple[str, ...] = ("prefork:2", "threads:8", "solo:1")
    phase_timeout: float = 300.0  # seconds any one wait may take before the run gives up

    @classmethod
    def for_run(cls, *, smoke: bool, full: bool, items: int | None = None,
                partitions: int | None = None) -> Sizes:
        """The sizes of a ``--smoke``, default or ``--full`` run, with overrides."""
        if smoke:
            sizes = cls(items=400, partitions=4, http_items=200, batch_items=400,
                        batch_size=20, batch_concurrency=80, pgqueuer_workers=2,
                        headline_rounds=1,
                        latency_samples=5, latency_poll=0.5, failover_partitions=4,
                        lease_duration=1.5, scale_partitions=20, scale_items=20,
                        small_partitions=40, small_items=5, fleet_partitions=8,
                        fleet_items=20, pooled_processors=(1, 2), pooled_partitions=4,
                        pooled_items=20, instructions_partitions=4,
                        instructions_items=(20, 500), flow_items=400, flow_rounds=1,
                        query_samples=20, fanin_items=1_200, fanin_samples=2,
                        reduce_gate_items=(300, 2_500), chord_partitions=3, chord_items=20,
                        spawn_children=2_000, spawn_page=100, ingest_items=2_000,
                        ingest_json_items=500, crawl_count=3, park_items=400,
                        crawl_fanout=3, crawl_depth=2,
                        celery_setups=("prefork:2",), phase_timeout=60.0)
        elif full:
            sizes = cls(items=100_000, http_items=20_000, batch_items=100_000, flow_items=50_000,
                        ingest_items=200_000, ingest_json_items=20_000,
                        latency_samples=200, scale_partitions=10_000, scale_items=100,
                        query_samples=1_000, fanin_samples=30, phase_timeout=1_800.0)
        else:
            sizes = cls()
        changes: dict[str, Any] = {}
        if items is not None:
            changes.update(items=items, http_items=items, batch_items=items, flow_items=items,
                           park_items=items)
        if partitions is not None:
            changes.update(partitions=partitions)
        return sizes.with_(**changes) if changes else sizes

    def with_(self, **changes: Any) -> Sizes:
        """A copy with some sizes changed."""
        return type(self)(**{**self.__dict__, **changes})


@dataclass(frozen=True)
class Settings:
    """One benchmark run: where, how big, and which scenarios."""

    db_url: str
    sizes: Sizes
    mode: str = "default"  # smoke, default or full
    rounds: int = 1  # throughput runs per system, interleaved; the best one counts
    work_dir: Path = field(default_factory=lambda: Path("/tmp"))
    # Figures one scenario measures and another reuses (the bare HTTP baselines, which
    # do not depend on the database: several databases' settings may share them).
    shared: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def database(self) -> str:
        """Which database the run is on: ``sqlite``, ``postgres`` or ``mariadb``."""
        return database_of(self.db_url)

    @property
    def database_title(self) -> str:
        """The database's name as printed: SQLite, PostgreSQL or MariaDB."""
        return DATABASE_TITLES.get(self.database, self.database)


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Row:
    """One line of the printed table."""

    what: str
    figure: str
    detail: str = ""


@dataclass(frozen=True)
class Goal:
    """A performance goal, checked against a figure. ``passed`` is None when not measured."""

    name: str
    target: str
    measured: str
    passed: bool | None

    @property
    def verdict(self) -> str:
        """PASS, MISS, or n/a."""
        return "n/a" if self.passed is None else ("PASS" if self.passed else "MISS")

    def as_json(self) -> dict[str, Any]:
        """The goal as a JSON object."""
        return {"name": self.name, "target": self.target, "measured": self.measured,
                "result": self.verdict}


@dataclass
class Outcome:
    """What one scenario measured. ``status``: ok, skipped (with a reason) or error."""

    name: str
    title: str
    rows: list[Row] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    goals: list[Goal] = field(default_factory=list)
    status: str = "ok"
    reason: str = ""
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        """The outcome as a JSON object: status, figures and goals."""
        return {"title": self.title, "status": self.status, "reason": self.reason,
                "seconds": round(self.seconds, 2), **self.figures,
                "goals": [goal.as_json() for goal in self.goals]}


def best_round(runs: Sequence[Any]) -> Any:
    """The run with the highest ``per_second``, carrying every round's rate in ``rounds``."""
    rates = tuple(round(run.per_second, 1) for run in runs)
    best = max(runs, key=lambda run: run.per_second)
    return dataclasses.replace(best, rounds=rates)


def ratio_goal(name: str, ratio: float | None, at_least: float) -> Goal:
    """A goal "ratio >= at_least"; not measured when ``ratio`` is None."""
    if ratio is None:
        return Goal(name, f">= {at_least:g}x", "-", None)
    return Goal(name, f">= {at_least:g}x", f"{ratio:.2f}x", ratio >= at_least)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or zero."""
    if not numerator or not denominator:
        return None
    return numerator / denominator


# --------------------------------------------------------------------------- numbers


def percentile(values: Sequence[float], percent: float) -> float:
    """The nearest-rank percentile of ``values`` (which must not be empty)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(percent / 100 * len(ordered)))
    return ordered[rank - 1]


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    """p50, p99, max and mean of ``seconds``, in milliseconds, for the JSON file."""
    if not seconds:
        return {}
    return {"samples": len(seconds), "p50_ms": round(percentile(seconds, 50) * 1000, 3),
            "p99_ms": round(percentile(seconds, 99) * 1000, 3),
            "max_ms": round(max(seconds) * 1000, 3),
            "mean_ms": round(sum(seconds) / len(seconds) * 1000, 3)}


def rate_text(per_second: float | None, unit: str = "items/s") -> str:
    """``12,345 items/s`` (or ``-``)."""
    return "-" if per_second is None else f"{per_second:,.0f} {unit}"


def ms_text(seconds: float) -> str:
    """A duration in milliseconds with sensible precision."""
    ms = seconds * 1000
    return f"{ms:.2f} ms" if ms < 10 else f"{ms:.1f} ms" if ms < 100 else f"{ms:,.0f} ms"


# --------------------------------------------------------------------------- database


# Every table prefix this process used, so a run can report them (and a test can check
# that nothing named with them is left behind).
USED_PREFIXES: list[str] = []


def new_prefix(tag: str) -> str:
    """A fresh table prefix such as ``bench_lib_3fa2c1_`` (valid for statefeed and PGQueuer)."""
    prefix = f"bench_{tag}_{uuid.uuid4().hex[:6]}_"
    USED_PREFIXES.append(prefix)
    return prefix


def drop_statefeed_tables(db_url: str, prefix: str) -> None:
    """Downgrade ``prefix`` to nothing, and drop Alembic's version table too (which a
    downgrade keeps), its name quoted as the database quotes names. Raises the driver's
    error when the database refuses."""
    downgrade(db_url, prefix)
    engine = create_engine(parse_database_url(db_url).sync_url)
    try:
        name = engine.dialect.identifier_preparer.quote(tables_for(prefix).version_table)
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {name}"))
    finally:
        engine.dispose()


@contextlib.asynccontextmanager
async def statefeed_tables(db_url: str, tag: str) -> AsyncIterator[str]:
    """Migrate a fresh table prefix; drop its tables on exit. Yields the prefix."""
    prefix = new_prefix(tag)
    await asyncio.to_thread(upgrade, db_url, prefix)
    try:
        yield prefix
    finally:
        await asyncio.to_thread(drop_statefeed_tables, db_url, prefix)


def spread(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` counts that differ by at most one."""
    base, extra = divmod(total, parts)
    return [base + (1 if index < extra else 0) for index in range(parts)]


async def create_partitions(client: AsyncClient, counts: Sequence[int], *,
                            data: bytes | Callable[[int, int], bytes] = b'{"n":0}',
                            name: str = "p", parallel: int = 4,
                            key: Callable[[int], str | None] | None = None,
                            pipeline: Callable[[int], str] | None = None) -> list[str]:
    """Create one partition per count with that many items; returns the partition ids.

    Ids are zero-padded (``p00003``, ``i000042``) so they sort like numbers.
    ``data`` is the bytes of every item, or a function of (partition, item) numbers;
    ``key`` gives a partition's concurrency key from its number (default: none), and
    ``pipeline`` its pipeline (default: ``default``).
    """
    gate = asyncio.Semaphore(parallel)
    ids = [f"{name}{number:05d}" for number in range(len(counts))]

    async def one(number: int) -> None:
        items = [NewItem(f"i{index:06d}",
                         data(number, index) if callable(data) else data)
                 for index in range(counts[number])]
        async with gate:
            await client.create_partition(
                ids[number], items, key=None if key is None else key(number),
                pipeline=None if pipeline is None else pipeline(number))

    await asyncio.gather(*(one(number) for number in range(len(counts))))
    return ids


# --------------------------------------------------------------------------- waiting


async def wait_for(condition: Callable[[], Awaitable[Any]], *, timeout: float,  # noqa: ASYNC109
                   interval: float = 0.01, what: str = "condition") -> Any:
    """Await ``condition()`` every ``interval`` s until it is truthy; return its value.

    Raises:
        TimeoutError: ``timeout`` seconds passed first (the message says what was awaited).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = await condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {timeout:g} s waiting for {what}")
        await asyncio.sleep(interval)


def rss_bytes(pid: int | str = "self") -> int:
    """Resident memory of a process (Linux ``/proc``), or 0 where unavailable."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def cpu_seconds(pid: int | str = "self") -> float:
    """User plus system CPU time a process has used (Linux ``/proc``), or 0.0."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def settle_heap() -> None:
    """Collect garbage and freeze what survives, before a timed phase in this process.

    ``processor run`` freezes its start-up objects (see ``processor/service.py``);
    the systems timed inside the benchmark's own process (the bare HTTP clients,
    PGQueuer, the library-mode watcher) get the same treatment, so that none of
    them pays for full collections over the benchmark's own long-lived objects.
    """
    gc.collect()
    gc.freeze()
