"""Every database: the library drain and the HTTP hop on SQLite, PostgreSQL and MariaDB,
and SQLite's own limit, in one run.

    .venv/bin/python -m bench.databases --db all        # about 5 minutes
    .venv/bin/python -m bench.databases --db sqlite --rounds 3
    .venv/bin/python -m bench.databases --db all --smoke

A short form of ``python -m bench --db ... --only library --only http`` that
times the HTTP hop only where asked (``--http``, SQLite by default), and
writes its figures to ``bench/results/databases.json``; the same code runs
both (:mod:`bench.suite`).

- **Library drain** (each database): the library scenario
  (:mod:`bench.library`): one in-process watcher drains N no-op items over P
  partitions, at concurrency 32 (the default) and 128, timed to the last
  partition closed; PGQueuer beside it on PostgreSQL.
- **SQLite's limit**: in the same rounds, the same reads and guarded writes
  with no engine, through ``sqlite3`` on the same kind of file (see
  :mod:`bench.library`). It is the denominator of SQLite's ratio.
- **HTTP per item** (SQLite unless told otherwise): the http scenario
  (:mod:`bench.http_mode`): ``processor run --concurrency 32`` drains N items
  through the benchmark handler, against bare ``aiohttp`` and ``httpx``
  clients posting the same N payloads to the same handler, best of at least
  three runs for the headline pair (one at ``--smoke`` sizes).

The cross-database goals are checked on the figures of the same run: SQLite's
drain at least half its limit, SQLite's HTTP hop at least half the bare
client's, MariaDB's drain at least half PostgreSQL's. Databases that do not
answer are skipped with a message (exit status 2 when none answers).
Subprocess logs and SQLite's file go to ``logs-<name of the JSON file>/`` next
to it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.common import DATABASES, RESULTS_DIR, Sizes
from bench.suite import main_with

JSON_PATH = RESULTS_DIR / "databases.json"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command-line options; exits with status 2 (and a message) when one is wrong."""
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
    if args.items is not None and not 1 <= args.items <= 10_000_000:
        parser.error("--items must be from 1 to 10,000,000")
    return args


def plan_of(args: argparse.Namespace) -> dict[str, tuple[str, ...]]:
    """The library scenario on every chosen database, the http scenario on those of
    ``--http`` too."""
    chosen = args.db or ["all"]
    http_on = args.http or ["sqlite"]
    return {name: ("library", "http") if "all" in http_on or name in http_on else ("library",)
            for name in DATABASES if "all" in chosen or name in chosen}


def main(argv: list[str] | None = None) -> int:
    """Run the measurements, print the tables and goals, write the JSON; returns the exit
    status (see :func:`bench.suite.run_plan`)."""
    args = parse_args(argv)
    sizes = Sizes.for_run(smoke=args.smoke, full=False, items=args.items)
    return main_with(plan_of(args), sizes=sizes, mode="smoke" if args.smoke else "default",
                     rounds=args.rounds, json_path=args.json,
                     logs=args.json.parent / f"logs-{args.json.stem}",
                     command=" ".join(["python -m bench.databases",
                                       *(sys.argv[1:] if argv is None else argv)]),
                     per_database=True)


if __name__ == "__main__":
    sys.exit(main())
