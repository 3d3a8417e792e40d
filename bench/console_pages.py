"""How long the web console's pages take with many partitions: ``python -m
bench.console_pages`` (from the repository root).

Fills a fresh namespace with ``--partitions`` partitions of three items each (written
straight to the tables, as the console's 10,000-partition test does), then asks every
page the operators use through the console's own ASGI app, ``--rounds`` times each,
and prints the median and the slowest answer of each page, with the goal: every page's
median under ``--goal`` seconds (PASS/MISS). The test (tests/integration/
test_console.py) holds the pages to a bounded number of statements; the time they take
is measured here, where a loaded machine makes a figure, not a failure.

    .venv/bin/python -m bench.console_pages                       # SQLite, 10,000 partitions
    .venv/bin/python -m bench.console_pages --db postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from sqlalchemy import create_engine, insert

from processor import AsyncClient
from processor.console.app import create_app, settings_for
from watcher.store.db.migrate import downgrade, upgrade
from watcher.store.db.urls import parse_database_url
from watcher.store.sql.schema import tables_for

DEFAULT_PARTITIONS = 10_000
DEFAULT_ROUNDS = 5
# The goal for a console page with 10,000 partitions: the budget the console's test held
# each page to (on a shared two-core machine) before the time moved here.
DEFAULT_GOAL = 2.0
ORIGIN = "http://127.0.0.1:8090"


def fill(db_url: str, prefix: str, partitions: int) -> None:
    """``partitions`` partitions of 3 items (at gates 0, 1 and 2), in bulk."""
    tables = tables_for(prefix)
    start = datetime.now(UTC).replace(tzinfo=None) - timedelta(hours=2)
    statuses = ["available", "complete", "failed", "cancelled"]
    rows, items = [], []
    for n in range(partitions):
        moment = start + timedelta(seconds=n)
        status = statuses[n % 4]
        rows.append({"id": f"job-{n:05}", "version": 1, "gate": n % 3, "status": status,
                     "owner": f"w{n % 7}" if status == "available" else "",
                     "until": moment + timedelta(hours=4), "created_at": moment,
                     "updated_at": moment, "on_item_failure": "fail",
                     "reduce_page": 0, "reduce_attempts": 0})
        for gate in range(3):
            items.append({"partition_id": f"job-{n:05}", "id": f"item-{gate}", "version": 1,
                          "gate": gate, "status": "complete" if gate < n % 3 else "available",
                          "data": b"{}", "attempts": 0, "retry_at": moment,
                          "created_at": moment, "updated_at": moment})
    engine = create_engine(parse_database_url(db_url).sync_url)
    try:
        with engine.begin() as conn:
            for chunk in range(0, len(rows), 2000):
                conn.execute(insert(tables.partitions), rows[chunk:chunk + 2000])
            for chunk in range(0, len(items), 5000):
                conn.execute(insert(tables.items), items[chunk:chunk + 5000])
    finally:
        engine.dispose()


async def measure(db_url: str, prefix: str, partitions: int, rounds: int
                  ) -> dict[str, list[float]]:
    """Seconds of each answer, per page."""
    url = parse_database_url(db_url)
    middle = f"job-{partitions // 2:05}"
    async with AsyncClient(url, prefix) as client:
        app = create_app(settings_for(url, prefix, host="127.0.0.1", port=8090, token=None,
                                      read_only=False), client)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url=ORIGIN) as web:
            first = (await web.get("/partitions")).text
            cursor = re.search(r'href="/partitions\?after=([^"&]+)"', first)
            paths = ["/", "/live/overview", "/partitions", "/partitions?status=failed",
                     "/partitions?prefix=job-09", "/partitions?prefix=nothing-matches",
                     f"/partition?id={middle}", f"/partition?id={middle}&status=complete",
                     f"/live/partition?id={middle}"]
            if cursor:
                paths.append(f"/live/partitions?after={cursor.group(1)}")
            taken: dict[str, list[float]] = {path: [] for path in paths}
            for _ in range(rounds):
                for path in paths:
                    started = time.perf_counter()
                    answer = await web.get(path)
                    taken[path].append(time.perf_counter() - started)
                    if answer.status_code != 200:
                        raise SystemExit(f"{path} answered {answer.status_code}")
    return taken


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.console_pages",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="", help="a database URL (default: a fresh SQLite file)")
    parser.add_argument("--partitions", type=int, default=DEFAULT_PARTITIONS)
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument("--goal", type=float, default=DEFAULT_GOAL,
                        help="seconds a page's median answer may take")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        db_url = args.db or f"sqlite:///{Path(folder) / 'console.db'}"
        prefix = f"cp{uuid.uuid4().hex[:8]}_"
        upgrade(db_url, prefix)
        try:
            fill(db_url, prefix, args.partitions)
            taken = asyncio.run(measure(db_url, prefix, args.partitions, args.rounds))
        finally:
            downgrade(db_url, prefix)
    print(f"console pages, {args.partitions:,} partitions, {args.rounds} rounds "
          f"({parse_database_url(db_url).redacted()}):")
    worst = 0.0
    for path, seconds in taken.items():
        median = statistics.median(seconds)
        worst = max(worst, median)
        shown = path if len(path) <= 60 else path[:57] + "..."
        print(f"  {median * 1000:8.1f} ms median  {max(seconds) * 1000:8.1f} ms slowest  {shown}")
    verdict = "PASS" if worst < args.goal else "MISS"
    print(f"goal: every page's median under {args.goal:g} s: {verdict} "
          f"(slowest median {worst:.3f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
