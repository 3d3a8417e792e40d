"""Run statefeed's benchmark suite: ``python -m bench`` (from the repository root).

Every scenario compares systems in the same run on the same PostgreSQL
(``$PROCESSOR_BENCH_POSTGRES_URL``, default
``postgresql://postgres@127.0.0.1:5432/test``), prints a table per scenario
and the issue's goals as PASS/MISS, and writes the same figures as JSON
(``bench/results/latest.json``; subprocess logs in ``logs/`` next to it).

    .venv/bin/python -m bench                  # the default sizes, about 5 minutes
    .venv/bin/python -m bench --smoke          # every scenario at tiny sizes, about 1 minute
    .venv/bin/python -m bench --full           # the issue's sizes (10,000 x 100 scale)
    .venv/bin/python -m bench --only latency --only failover
    .venv/bin/python -m bench --items 50000 --partitions 20

Scenarios: library (in-process watcher vs PGQueuer), http (processor run vs
bare httpx and aiohttp clients), batch (--handler-batch-size), latency
(insert -> dispatch, gate advance), failover (kill -9, SIGTERM), scale (poll
queries, memory and statements per item as completed items accumulate), fanin
(last gate-0 result -> reduce -> partition complete, 10,000 items a gate),
reduce (a 100,000-item reduce gate in pages, and the reducer's memory), chord
(P partitions x N items, a step then a reduce: statefeed vs Celery's chord on
Redis at ``$PROCESSOR_BENCH_REDIS_URL``, default ``redis://127.0.0.1:6379/0``;
Celery is skipped with a message where no Redis answers).
Exit status: 0 when every scenario ran (goals missed or not), 1 when one
failed, 2 when the database cannot be reached or an option is wrong, 130 or
143 when stopped by Ctrl-C or SIGTERM (its subprocesses stopped first).
"""

from __future__ import annotations

import argparse
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
from collections.abc import Awaitable, Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.common import (
    REPO,
    RESULTS_DIR,
    SCENARIOS,
    USED_PREFIXES,
    Outcome,
    Settings,
    Sizes,
    percentile,
    postgres_url,
)
from bench.report import print_goals, print_outcome, write_json
from watcher.dburl import redact_url

Runner = Callable[[Settings], Awaitable[Outcome]]
PACKAGES = ("sqlalchemy", "psycopg", "httpx", "aiohttp", "uvicorn", "pgqueuer", "asyncpg",
            "celery", "kombu", "redis")


def runners() -> dict[str, Runner]:
    """Each scenario's entry point, by name."""
    from bench import chord, failover, http_mode, latency, library, reduce, scale

    return {"library": library.run, "http": http_mode.run_per_item,
            "batch": http_mode.run_batch, "latency": latency.run, "failover": failover.run,
            "scale": scale.run, "fanin": reduce.run_fanin, "reduce": reduce.run_big,
            "chord": chord.run}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command-line options; exits with status 2 (and a message) when one is wrong."""
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__.splitlines()[0],
        epilog="Sizes: --smoke and --full pick a whole set; --items and --partitions "
        "override the library and HTTP sizes of any set.")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true",
                      help="every scenario at tiny sizes (about a minute)")
    size.add_argument("--full", action="store_true",
                      help="the issue's sizes: 10,000 partitions x 100 items at scale")
    parser.add_argument("--items", type=int, metavar="N",
                        help="items per library/HTTP run (default 20,000 library, 10,000 HTTP)")
    parser.add_argument("--partitions", type=int, metavar="P",
                        help="partitions the library/HTTP items are spread over (default 10)")
    parser.add_argument("--rounds", type=int, default=1, metavar="R",
                        help="throughput runs per system, interleaved; the best counts "
                        "(default 1; 3 for steadier ratios on a busy machine)")
    parser.add_argument("--only", action="append", choices=SCENARIOS, metavar="NAME",
                        help=f"run only this scenario (repeatable): {', '.join(SCENARIOS)}")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "latest.json",
                        metavar="PATH", help="where to write the JSON (default: %(default)s)")
    args = parser.parse_args(argv)
    if not 1 <= args.rounds <= 10:
        parser.error("--rounds must be from 1 to 10")
    if args.items is not None and not 1 <= args.items <= 10_000_000:
        parser.error("--items must be from 1 to 10,000,000")
    if args.partitions is not None and not 1 <= args.partitions <= 100_000:
        parser.error("--partitions must be from 1 to 100,000")
    if args.items is not None and args.partitions is not None and args.partitions > args.items:
        parser.error("--partitions must not exceed --items")
    return args


# --------------------------------------------------------------------------- environment


async def database_facts(db_url: str) -> dict[str, Any]:
    """PostgreSQL's version and the round trip of a trivial read (p50 of 100).

    Raises the driver's error when the database cannot be reached.
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
                from sqlalchemy import text

                version = (await conn.execute(text("SHOW server_version"))).scalar_one()
    finally:
        await store.close()
    return {"server_version": version,
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


# --------------------------------------------------------------------------- running


async def run_one(name: str, runner: Runner, settings: Settings, console: Console) -> Outcome:
    """Run one scenario within its time bound; a failure becomes an "error" outcome."""
    started = time.perf_counter()
    try:
        with console.status(f"running {name} ..."):
            async with asyncio.timeout(settings.sizes.phase_timeout * 4):
                outcome = await runner(settings)
    except Exception as error:
        traceback.print_exc(file=sys.stderr)
        outcome = Outcome(name, name, status="error",
                          reason=f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
                          if str(error) else type(error).__name__)
    outcome.seconds = time.perf_counter() - started
    return outcome


async def main_async(args: argparse.Namespace, console: Console) -> int:
    """Run the selected scenarios, print and write the figures; returns the exit status."""
    # SIGTERM stops the run as Ctrl-C does: the running scenario is cancelled, so its
    # subprocesses (Celery workers in their own process groups among them) are stopped.
    main_task = asyncio.current_task()
    if main_task is not None:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    mode = "smoke" if args.smoke else "full" if args.full else "default"
    sizes = Sizes.for_run(smoke=args.smoke, full=args.full, items=args.items,
                          partitions=args.partitions)
    db_url = postgres_url()
    try:
        database = await database_facts(db_url)
    except Exception as error:
        console.print(f"[bold red]bench: PostgreSQL at {redact_url(db_url)} is not reachable:"
                      f"[/] {type(error).__name__}: {str(error).splitlines()[0][:200]}\n"
                      f"Set PROCESSOR_BENCH_POSTGRES_URL to a database the benchmark may "
                      f"create and drop tables in.")
        return 2
    logs = args.json.parent / "logs"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True, exist_ok=True)
    settings = Settings(db_url, sizes, mode=mode, rounds=args.rounds, work_dir=logs)
    selected = [name for name in SCENARIOS if not args.only or name in args.only]
    started_at = datetime.datetime.now(datetime.UTC)
    environment = {
        "python": platform.python_version(), "platform": platform.platform(),
        "cpus": os.cpu_count(), "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "database": {"url": redact_url(db_url), **database}, "packages": versions(),
        "statefeed_revision": git_revision(),
        "event_loop": "asyncio (no uvloop) for every Python process",
        "handler": "raw ASGI app, uvicorn with h11 and the asyncio loop, its own process",
    }
    console.print(
        f"[bold]statefeed benchmark[/] ({mode}, {args.rounds} round"
        f"{'s' if args.rounds > 1 else ''}) on PostgreSQL {database['server_version']} at "
        f"{redact_url(db_url)}: read round trip p50 {database['read_round_trip_p50_ms']:.2f} ms; "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; "
        f"revision {environment['statefeed_revision'] or '?'}")
    table = runners()
    outcomes: dict[str, Outcome] = {}
    for name in selected:
        outcome = await run_one(name, table[name], settings, console)
        outcomes[name] = outcome
        print_outcome(console, outcome)
    goals = [goal for outcome in outcomes.values() for goal in outcome.goals]
    print_goals(console, goals)
    environment["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    document = {
        "format": 1, "started_at": started_at.isoformat(timespec="seconds"),
        "mode": mode, "command": " ".join(["python -m bench", *sys.argv[1:]]),
        "environment": environment, "sizes": sizes.__dict__, "rounds": args.rounds,
        "scenarios": {name: (outcomes[name].as_json() if name in outcomes
                             else {"status": "not run", "reason": "not selected (--only)"})
                      for name in SCENARIOS},
        "goals": [goal.as_json() for goal in goals],
        "table_prefixes": list(USED_PREFIXES),  # all dropped again
    }
    write_json(args.json, document)
    console.print(f"figures written to {args.json}")
    failed = [name for name, outcome in outcomes.items() if outcome.status == "error"]
    if failed:
        console.print(f"[bold red]failed:[/] {', '.join(failed)} (see the messages above and "
                      f"the logs in {logs})")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run the selected scenarios, return the exit status."""
    args = parse_args(argv)
    console = Console(width=max(120, shutil.get_terminal_size((140, 40)).columns))
    try:
        return asyncio.run(main_async(args, console))
    except KeyboardInterrupt:
        return 130
    except asyncio.CancelledError:  # SIGTERM
        return 128 + signal.SIGTERM


if __name__ == "__main__":
    raise SystemExit(main())
