"""Running the scenarios on one database or several, and what a run prints and writes.

``python -m bench`` (:mod:`bench.__main__`) and ``python -m bench.databases``
both come here with a plan: which scenarios run on which database. Without
``--db`` the plan is every selected scenario on PostgreSQL, printed and
written as it always was (JSON ``format`` 1). With ``--db`` each chosen
database gets the selected scenarios (those that run on PostgreSQL alone are
reported as not run on the others), a heading and its tables; then the goals
of every scenario per database, and the cross-database goals on the figures of the
same run (JSON ``format`` 2, the figures under ``databases``).

A database that does not answer is skipped with a one-line message; when no
chosen database answers, the run stops with exit status 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console
from sqlalchemy import text

from bench.common import (
    DATABASE_TITLES,
    DATABASES,
    INSTRUMENTED_TIMEOUT,
    MARIADB_URL_ENV,
    POSTGRES_ONLY,
    POSTGRES_URL_ENV,
    REPO,
    RESULTS_DIR,
    SCENARIOS,
    USED_PREFIXES,
    Goal,
    Outcome,
    Row,
    Settings,
    Sizes,
    database_url,
    percentile,
    rate_text,
    ratio,
    ratio_goal,
)
from bench.report import print_goals, print_outcome, write_json
from watcher.store.db.urls import redact_url

Runner = Callable[[Settings], Awaitable[Outcome]]
PACKAGES = ("sqlalchemy", "psycopg", "httpx", "aiohttp", "uvicorn", "pgqueuer", "asyncpg",
            "celery", "kombu", "redis", "aiosqlite", "aiomysql", "pymysql")
# The statement that reads the server's version, by SQLAlchemy dialect name.
VERSION_QUERIES = {"postgresql": "SHOW server_version", "sqlite": "SELECT sqlite_version()",
                   "mysql": "SELECT VERSION()", "mariadb": "SELECT VERSION()"}
URL_ENVIRONMENT = {"postgres": POSTGRES_URL_ENV, "mariadb": MARIADB_URL_ENV}
NOT_SELECTED = {"status": "not run", "reason": "not selected (--only)"}
POSTGRES_ONLY_REASON = "PostgreSQL only"
GOALS_TITLE_ACROSS = "Goals across databases (one run)"
GOALS_TITLE_PER_DATABASE = "Goals, per database"
# Scenarios whose own waits outlast four phase timeouts of a small run: the
# instruction count's two drains under callgrind.
SCENARIO_MIN_BOUNDS = {"instructions": 2 * INSTRUMENTED_TIMEOUT + 60.0}


def runners() -> dict[str, Runner]:
    """Each scenario's entry point, by name."""
    from bench import (
        chord,
        crawl,
        failover,
        fleet,
        flow,
        http_mode,
        ingest,
        instructions,
        latency,
        library,
        park,
        pipelines,
        pooled,
        reduce,
        renewals,
        rowsize,
        scale,
        small,
        spawn,
    )

    return {"library": library.run, "flow": flow.run, "small": small.run, "fleet": fleet.run,
            "pooled": pooled.run,
            "instructions": instructions.run,
            "http": http_mode.run_per_item,
            "batch": http_mode.run_batch, "spawn": spawn.run, "ingest": ingest.run,
            "latency": latency.run,
            "failover": failover.run,
            "renewals": renewals.run, "rowsize": rowsize.run, "scale": scale.run,
            "fanin": reduce.run_fanin, "reduce": reduce.run_big,
            "chord": chord.run, "crawl": crawl.run, "park": park.run,
            "pipelines": pipelines.run}


def plan_for(databases: Sequence[str], scenarios: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Every one of ``scenarios`` on each of ``databases`` (``all``: every database), in
    the order they run."""
    chosen = DATABASES if "all" in databases else databases
    ordered = [name for name in DATABASES if name in chosen]
    return {name: tuple(scenario for scenario in SCENARIOS if scenario in scenarios)
            for name in ordered}


# --------------------------------------------------------------------------- environment


async def database_facts(db_url: str) -> dict[str, Any]:
    """The database's version and the round trip of a trivial read (p50 of 100).

    Raises the driver's error when the database cannot be reached (TimeoutError
    after 15 s).
    """
    from watcher import Store

    store = Store.open(db_url)
    try:
        async with asyncio.timeout(15):
            await store.ping()
            trips = []
            for _ in range(100):
                started = time.perf_counter()
                await store.ping()
                trips.append(time.perf_counter() - started)
            async with store.engine.connect() as conn:
                query = VERSION_QUERIES.get(conn.dialect.name)
                version = ((await conn.execute(text(query))).scalar_one() if query
                           else conn.dialect.name)
    finally:
        await store.close()
    return {"server_version": str(version),
            "read_round_trip_p50_ms": round(percentile(trips, 50) * 1000, 3)}


def git_revision() -> str:
    """The commit checked out, with ``+dirty`` when the tree has changes; "" without git."""
    git = shutil.which("git")
    if git is None:
        return ""
    try:
        commit = subprocess.run([git, "rev-parse", "--short", "HEAD"], cwd=REPO, check=True,
                                capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run([git, "status", "--porcelain"], cwd=REPO, check=True,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return commit + ("+dirty" if dirty else "")


def versions() -> dict[str, str]:
    """Installed versions of the packages the figures depend on."""
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def first_line(error: BaseException, limit: int = 200) -> str:
    """``TypeName: the first line of the message`` (at most ``limit`` characters of it)."""
    message = str(error).splitlines()[0][:limit] if str(error) else ""
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


# --------------------------------------------------------------------------- running


@dataclass
class DatabaseRun:
    """One database of a run: where, what it is, and what its scenarios measured."""

    name: str  # sqlite, postgres or mariadb
    url: str
    work_dir: Path  # its subprocess logs (and SQLite's file)
    facts: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None  # why it does not answer (the error's first line)
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    prefixes: list[str] = field(default_factory=list)  # table prefixes its scenarios used

    @property
    def title(self) -> str:
        """SQLite, PostgreSQL or MariaDB."""
        return DATABASE_TITLES.get(self.name, self.name)

    @property
    def skipped(self) -> str | None:
        """Why it was not measured (None when it was)."""
        if self.problem is None:
            return None
        return f"{redact_url(self.url)} does not answer ({self.problem})"

    def scenario_json(self, name: str) -> dict[str, Any]:
        """Scenario ``name`` as a JSON object: its figures, or why it did not run here."""
        if name in self.outcomes:
            return self.outcomes[name].as_json()
        if name in POSTGRES_ONLY and self.name != "postgres":
            return {"status": "not run", "reason": POSTGRES_ONLY_REASON}
        return dict(NOT_SELECTED)

    def goals(self) -> list[Goal]:
        """Its scenarios' goals, in the order they ran."""
        return [goal for outcome in self.outcomes.values() for goal in outcome.goals]

    def as_json(self) -> dict[str, Any]:
        """The database's part of the JSON document (``format`` 2)."""
        return {"title": self.title, "url": redact_url(self.url),
                "status": "skipped" if self.skipped else "ok", "reason": self.skipped or "",
                **self.facts,
                "scenarios": {name: self.scenario_json(name) for name in SCENARIOS},
                "goals": [goal.as_json() for goal in self.goals()],
                "table_prefixes": self.prefixes}


async def run_one(name: str, runner: Runner, settings: Settings, console: Console) -> Outcome:
    """Run one scenario within its time bound (four phase timeouts a round, or its
    minimum in :data:`SCENARIO_MIN_BOUNDS`); a failure becomes an "error" outcome."""
    started = time.perf_counter()
    bound = max(settings.sizes.phase_timeout * 4 * max(1, settings.rounds),
                SCENARIO_MIN_BOUNDS.get(name, 0.0))
    try:
        with console.status(f"running {name} on {settings.database_title} ..."):
            async with asyncio.timeout(bound):
                outcome = await runner(settings)
    except Exception as error:
        traceback.print_exc(file=sys.stderr)
        outcome = Outcome(name, name, status="error", reason=first_line(error, 300))
    outcome.seconds = time.perf_counter() - started
    return outcome


def _figure(runs: Mapping[str, DatabaseRun], database: str, scenario: str,
            *path: str | int) -> float | None:
    """A number from a scenario's figures (``path`` of keys and list indexes), or None when
    the database, the scenario or the figure is missing."""
    run = runs.get(database)
    outcome = run.outcomes.get(scenario) if run is not None else None
    if outcome is None or outcome.status != "ok":
        return None
    value: Any = outcome.figures
    for key in path:
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            return None
    return value if isinstance(value, int | float) else None


def _library_rate(runs: Mapping[str, DatabaseRun], database: str) -> float | None:
    """The database's library drain at statefeed's defaults, items/s."""
    return _figure(runs, database, "library", "statefeed", 0, "items_per_s")


def goals_of(runs: Mapping[str, DatabaseRun]) -> list[Goal]:
    """The cross-database goals on this run's figures (not measured where a side is missing),
    the engine's second round: SQLite's library drain at least 0.6x the
    sqlite3 floor, SQLite's HTTP per item at least half bare aiohttp's, MariaDB's library
    drain at least 0.6x PostgreSQL's, PostgreSQL's HTTP per item at least 0.75x bare
    aiohttp's, PostgreSQL's library drain at the default concurrency at least 2.5x
    PGQueuer's best setup and at least 0.7x the psycopg floor."""
    return [
        ratio_goal("SQLite library drain vs the sqlite3 floor",
                   ratio(_library_rate(runs, "sqlite"),
                         _figure(runs, "sqlite", "library", "raw_sqlite3", "items_per_s")), 0.6),
        ratio_goal("SQLite HTTP per item vs bare aiohttp",
                   _figure(runs, "sqlite", "http", "ratio_processor_over_bare_aiohttp"), 0.5),
        ratio_goal("MariaDB library drain vs PostgreSQL's",
                   ratio(_library_rate(runs, "mariadb"), _library_rate(runs, "postgres")), 0.6),
        ratio_goal("PostgreSQL HTTP per item vs bare aiohttp",
                   _figure(runs, "postgres", "http", "ratio_processor_over_bare_aiohttp"), 0.75),
        ratio_goal("PostgreSQL library at the default concurrency vs PGQueuer's best",
                   _figure(runs, "postgres", "library",
                           "ratio_default_statefeed_over_best_pgqueuer"), 2.5),
        ratio_goal("PostgreSQL library at the default concurrency vs the psycopg floor",
                   ratio(_library_rate(runs, "postgres"),
                         _figure(runs, "postgres", "library", "raw_psycopg", "items_per_s")),
                   0.7),
    ]


def summary_of(runs: Mapping[str, DatabaseRun]) -> Outcome:
    """The figures the cross-database goals are made of, a row per database and figure."""
    summary = Outcome("databases", "Every database: the figures of the cross-database goals")
    for run in runs.values():
        if run.skipped is not None:
            summary.rows.append(Row(run.title, "skipped", run.skipped))
            continue
        drain = _library_rate(runs, run.name)
        if drain is not None:
            summary.rows.append(Row(f"{run.title}: library drain, statefeed at its defaults",
                                    rate_text(drain)))
        for key, driver in (("raw_sqlite3", "sqlite3"), ("raw_psycopg", "psycopg")):
            raw = _figure(runs, run.name, "library", key, "items_per_s")
            if raw is not None:
                summary.rows.append(Row(f"{run.title}: {driver}, no engine (the floor)",
                                        rate_text(raw)))
        processor = _figure(runs, run.name, "http", "processor", 0, "items_per_s")
        bare = _figure(runs, run.name, "http", "bare", 0, "items_per_s")
        if processor is not None and bare is not None:
            summary.rows.append(Row(f"{run.title}: HTTP per item, processor run / bare aiohttp",
                                    f"{processor / bare:.2f}x",
                                    f"{processor:,.0f} / {bare:,.0f} req/s"))
    return summary


# A file in every log directory the benchmark made: only such a directory is emptied.
LOG_MARKER = ".statefeed-bench-logs"


def fresh_log_directory(logs: Path) -> str | None:
    """Empty ``logs`` (or make it) for a run's subprocess logs and SQLite file; returns
    why not, or None. A directory the benchmark did not make (no :data:`LOG_MARKER`) is
    never emptied: ``--json`` may point anywhere, and its folder's ``logs`` may be a user's."""
    ours = logs.resolve() == (RESULTS_DIR / "logs").resolve()  # the default place
    if logs.exists() and not ours and not (logs / LOG_MARKER).exists():
        if not logs.is_dir() or any(logs.iterdir()):
            return (f"{logs} exists and was not made by the benchmark; it is left as it is. "
                    f"Write the figures elsewhere (--json) or remove it.")
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True, exist_ok=True)
    (logs / LOG_MARKER).write_text("subprocess logs of python -m bench; emptied every run\n")
    return None


async def check_databases(plan: Mapping[str, Sequence[str]], logs: Path, *,
                          per_database: bool, console: Console) -> dict[str, DatabaseRun]:
    """Each planned database with its work directory (``logs/<name>``, or ``logs`` itself
    without ``per_database``), its URL (SQLite: a fresh file in that directory) and its
    facts, or why it does not answer (printed on one line when several were chosen)."""
    runs: dict[str, DatabaseRun] = {}
    for name in plan:
        work_dir = logs / name if per_database else logs
        work_dir.mkdir(parents=True, exist_ok=True)
        run = DatabaseRun(name, database_url(name, work_dir), work_dir)
        try:
            run.facts = await database_facts(run.url)
        except Exception as error:
            run.problem = first_line(error)
            if len(plan) > 1:
                console.print(f"[yellow]bench: {run.title} skipped:[/] {run.skipped}",
                              soft_wrap=True)
        runs[name] = run
    return runs


def unreachable_message(run: DatabaseRun) -> str:
    """What to print when the only database chosen does not answer."""
    variable = URL_ENVIRONMENT.get(run.name)
    hint = (f"\nSet {variable} to a database the benchmark may create and drop tables in."
            if variable else "")
    return (f"[bold red]bench: {run.title} at {redact_url(run.url)} is not reachable:[/] "
            f"{run.problem}{hint}")


def print_header(console: Console, live: Sequence[DatabaseRun], *, per_database: bool,
                 mode: str, rounds: int, revision: str) -> None:
    """The run's first lines: sizes, rounds, each database and its read round trip, the
    machine and the revision."""
    s = "s" if rounds > 1 else ""
    machine = f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; revision {revision or '?'}"

    def where(run: DatabaseRun) -> str:
        return (f"{run.title} {run.facts['server_version']} at {redact_url(run.url)}: read "
                f"round trip p50 {run.facts['read_round_trip_p50_ms']:.2f} ms")

    if not per_database:
        console.print(f"[bold]statefeed benchmark[/] ({mode}, {rounds} round{s}) on "
                      f"{where(live[0])}; {machine}")
        return
    console.print(f"[bold]statefeed benchmark[/] ({mode}, {rounds} round{s}) on "
                  f"{', '.join(run.title for run in live)}; {machine}")
    for run in live:
        console.print(f"  {where(run)}")


async def run_database(run: DatabaseRun, scenarios: Sequence[str], settings: Settings, *,
                       per_database: bool, console: Console) -> None:
    """Run ``scenarios`` on one database, printing each table as it ends; those that run
    on PostgreSQL alone are listed as not run on the others."""
    if per_database:
        console.rule(f"[bold]{run.title}[/] at {redact_url(run.url)}")
    table = runners()
    used_before = len(USED_PREFIXES)
    not_here = []
    for name in scenarios:
        if name in POSTGRES_ONLY and run.name != "postgres":
            not_here.append(name)
            continue
        outcome = await run_one(name, table[name], settings, console)
        run.outcomes[name] = outcome
        print_outcome(console, outcome)
    run.prefixes = USED_PREFIXES[used_before:]
    if not_here:
        console.print(f"[dim]not run on {run.title}: {', '.join(not_here)} "
                      f"({POSTGRES_ONLY_REASON})[/]")


async def run_plan(plan: Mapping[str, Sequence[str]], *, sizes: Sizes, mode: str, rounds: int,
                   json_path: Path, command: str, per_database: bool,
                   console: Console, logs: Path | None = None) -> int:
    """Run ``plan`` (database -> scenarios), print and write the figures; returns the exit
    status: 0 when every scenario ran, 1 when one failed, 2 when no database answers.

    ``per_database`` False (one PostgreSQL, no ``--db``): today's tables and JSON format 1.
    Subprocess logs (and SQLite's file) go to ``logs``, emptied first (default: ``logs``
    next to the JSON file).
    """
    # SIGTERM stops the run as Ctrl-C does: the running scenario is cancelled, so its
    # subprocesses (Celery workers in their own process groups among them) are stopped.
    main_task = asyncio.current_task()
    if main_task is not None:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    logs = logs or json_path.parent / "logs"
    problem = fresh_log_directory(logs)
    if problem is not None:
        console.print(f"[bold red]bench:[/] {problem}", soft_wrap=True)
        return 2
    runs = await check_databases(plan, logs, per_database=per_database, console=console)
    live = [run for run in runs.values() if run.skipped is None]
    if not live:
        if len(runs) == 1:
            console.print(unreachable_message(next(iter(runs.values()))), soft_wrap=True)
        else:
            console.print("[bold red]bench: no chosen database answers[/] (see above)")
        return 2
    started_at = datetime.datetime.now(datetime.UTC)
    started = time.perf_counter()
    revision = git_revision()
    environment: dict[str, Any] = {
        "python": platform.python_version(), "platform": platform.platform(),
        "cpus": os.cpu_count(), "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "packages": versions(), "statefeed_revision": revision,
        "event_loop": "asyncio (no uvloop) for every Python process",
        "handler": "raw ASGI app, uvicorn with h11 and the asyncio loop, its own process",
    }
    if per_database:
        environment["databases"] = {run.name: {"url": redact_url(run.url), **run.facts}
                                    for run in live}
    else:
        environment["database"] = {"url": redact_url(live[0].url), **live[0].facts}
    print_header(console, live, per_database=per_database, mode=mode, rounds=rounds,
                 revision=revision)
    shared: dict[str, Any] = {}  # the bare HTTP baselines, measured once for every database
    for run in live:
        settings = Settings(run.url, sizes, mode=mode, rounds=rounds, work_dir=run.work_dir,
                            shared=shared)
        await run_database(run, plan[run.name], settings, per_database=per_database,
                           console=console)
    environment["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    document: dict[str, Any] = {
        "format": 2 if per_database else 1,
        "started_at": started_at.isoformat(timespec="seconds"), "mode": mode,
        "command": command, "environment": environment, "sizes": sizes.__dict__,
        "rounds": rounds,
    }
    if per_database:
        goals = [Goal(f"{run.title}: {goal.name}", goal.target, goal.measured, goal.passed)
                 for run in live for goal in run.goals()]
        print_goals(console, goals, title=GOALS_TITLE_PER_DATABASE)
        summary = summary_of(runs)
        summary.seconds = time.perf_counter() - started
        print_outcome(console, summary)
        across_goals = goals_of(runs)
        print_goals(console, across_goals, title=GOALS_TITLE_ACROSS)
        document.update({
            "databases": {run.name: run.as_json() for run in runs.values()},
            "goals": [goal.as_json() for goal in across_goals],
        })
    else:
        goals = live[0].goals()
        print_goals(console, goals)
        document.update({
            "scenarios": {name: live[0].scenario_json(name) for name in SCENARIOS},
            "goals": [goal.as_json() for goal in goals],
        })
    document["table_prefixes"] = list(USED_PREFIXES)  # all dropped again
    write_json(json_path, document)
    console.print(f"figures written to {json_path}")
    failed = [f"{name} ({run.title})" if per_database else name
              for run in live for name, outcome in run.outcomes.items()
              if outcome.status == "error"]
    if failed:
        console.print(f"[bold red]failed:[/] {', '.join(failed)} (see the messages above and "
                      f"the logs in {logs})")
        return 1
    return 0


def main_with(plan: Mapping[str, Sequence[str]], **options: Any) -> int:
    """Run :func:`run_plan` on a fresh event loop with a wide console; returns the exit
    status (130 after Ctrl-C, 143 after SIGTERM, its subprocesses stopped first)."""
    console = Console(width=max(120, shutil.get_terminal_size((140, 40)).columns))
    try:
        return asyncio.run(run_plan(plan, console=console, **options))
    except KeyboardInterrupt:
        return 130
    except asyncio.CancelledError:  # SIGTERM
        return 128 + signal.SIGTERM
