"""Run statefeed's benchmark suite: ``python -m bench`` (from the repository root).

Every scenario compares systems in the same run on the same database, prints a
table per scenario and the project's performance goals as PASS/MISS, and writes the same
figures as JSON (``bench/results/latest.json``; subprocess logs in ``logs/``
next to it). Without ``--db`` the database is PostgreSQL
(``$PROCESSOR_BENCH_POSTGRES_URL``, default
``postgresql://postgres@127.0.0.1:5432/test``).

    .venv/bin/python -m bench                  # the default sizes, about 6 minutes
    .venv/bin/python -m bench --smoke          # every scenario at tiny sizes, about 2 minutes
    .venv/bin/python -m bench --full           # the goals' sizes (10,000 x 100 scale)
    .venv/bin/python -m bench --only latency --only failover
    .venv/bin/python -m bench --items 50000 --partitions 20
    .venv/bin/python -m bench --db all         # every scenario on every database
    .venv/bin/python -m bench --db sqlite --db mariadb --only library --only http

Scenarios: library (in-process watcher vs PGQueuer; on SQLite vs the raw sqlite3
limit), flow (the same drain with no keys, one key, one key with an in-flight limit
of 16, and a rate-limited key per partition: what flow control costs), small (2,000
partitions of 20 items vs the same items in 10 partitions, and the CPU each
partition costs), http (processor run vs bare httpx and aiohttp
clients), batch (--handler-batch-size), spawn (children inserted through answers vs
the client's add_items), ingest (a partition created through ``processor api``,
NDJSON streamed and one JSON body, vs the client's create_partition), latency
(insert -> dispatch, gate advance), failover (kill -9, SIGTERM), renewals (one
renewal of 32 and of 128 leases, each with progress to write: its time, CPU and
statements), rowsize (16 long-lived partitions closing and re-opening on PostgreSQL:
updates, HOT updates and dead tuples of the partitions table a job, its row size,
and its growth while a transaction is held open), scale (poll
queries, memory and statements per item as completed items accumulate), fanin
(last gate-0 result -> reduce -> partition complete, 10,000 items a gate), reduce
(a 100,000-item reduce gate in pages, and the reducer's memory), chord (P
partitions x N items, a step then a reduce: statefeed vs Celery's chord, its
results in the Redis at ``$PROCESSOR_BENCH_REDIS_URL``, default
``redis://127.0.0.1:6379/0``, on that Redis and on the RabbitMQ at
``$PROCESSOR_BENCH_RABBITMQ_URL`` as brokers; Celery is skipped with a message where
no Redis answers, its RabbitMQ runs where no RabbitMQ does), crawl (trees visited by
spawning, then a reduce counts them: statefeed vs Celery with hand-made Redis
counters), fleet (the same items drained by 1, 2 and 4 processor processes, and the
CPU each item costs the fleet), pooled (the scale curve: 1 to 16 processors, directly and
through PgBouncer in transaction mode), instructions (CPU instructions per item in library
mode, counted by valgrind's callgrind over two drains that differ only in their
items; a figure a busy machine does not move), park (items parked by their answers,
then completed through the API, against add_items), pipelines (HTTP per item through
--handler-url, a routes file of one pipeline, and ten pipelines with a service each).

Databases (``--db``, repeatable; ``all`` = sqlite, postgres, mariadb): SQLite is a
fresh file in the run's log directory, MariaDB the server at
``$PROCESSOR_BENCH_MARIADB_URL`` (default ``mysql://root@127.0.0.1:3306/test``).
library, flow, small, instructions, http, batch, spawn, ingest, latency, renewals,
scale, park and pipelines run on each; failover, rowsize, fanin, reduce, chord, crawl,
fleet and pooled on PostgreSQL only (reported as not run on the others), and so does
PGQueuer within library; on databases without LISTEN/NOTIFY the latency table says the
first dispatch waits for a poll. Each
database gets its tables, then come every goal per database and the cross-database goals on
the figures of the same run (SQLite's library drain >= 0.6x the sqlite3 floor,
SQLite's HTTP per item >= 0.5x bare aiohttp, MariaDB's library drain >= 0.6x
PostgreSQL's, and PostgreSQL's at its defaults >= 2.5x PGQueuer's best and >= 0.7x
the psycopg floor). With ``--db`` the JSON holds a ``databases`` object (``format`` 2);
without it, the single-PostgreSQL document (``format`` 1). A database that does not
answer is skipped with a one-line message.

Exit status: 0 when every scenario ran (goals missed or not), 1 when one
failed, 2 when no chosen database can be reached or an option is wrong, 130
or 143 when stopped by Ctrl-C or SIGTERM (its subprocesses stopped first).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.common import DATABASES, RESULTS_DIR, SCENARIOS, Sizes
from bench.suite import main_with, plan_for


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command-line options; exits with status 2 (and a message) when one is wrong."""
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__.splitlines()[0],
        epilog="Sizes: --smoke and --full pick a whole set; --items and --partitions "
        "override the library and HTTP sizes of any set. Databases: with --db, library, "
        "http, batch, latency and scale run on each chosen database (SQLite: a fresh file "
        "in the log directory; MariaDB: $PROCESSOR_BENCH_MARIADB_URL, default "
        "mysql://root@127.0.0.1:3306/test; PostgreSQL: $PROCESSOR_BENCH_POSTGRES_URL), "
        "failover, fanin, reduce, chord and crawl on PostgreSQL only; a table per scenario and "
        "database, then the cross-database goals. A database that does not answer is skipped "
        "(exit 2 when none does).")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true",
                      help="every scenario at tiny sizes (about a minute)")
    size.add_argument("--full", action="store_true",
                      help="the goals' sizes: 10,000 partitions x 100 items at scale")
    parser.add_argument("--items", type=int, metavar="N",
                        help="items per library/HTTP run (default 20,000 library, 10,000 HTTP)")
    parser.add_argument("--partitions", type=int, metavar="P",
                        help="partitions the library/HTTP items are spread over (default 10)")
    parser.add_argument("--rounds", type=int, default=1, metavar="R",
                        help="throughput runs per system, interleaved; the best counts "
                        "(default 1; 3 for steadier ratios on a busy machine)")
    parser.add_argument("--only", action="append", choices=SCENARIOS, metavar="NAME",
                        help=f"run only this scenario (repeatable): {', '.join(SCENARIOS)}")
    parser.add_argument("--db", action="append", choices=(*DATABASES, "all"), metavar="DB",
                        help="run on this database (repeatable): sqlite, postgres, mariadb, "
                        "or all of them; failover, rowsize, fanin, reduce, chord and crawl run "
                        "on postgres only. Default: postgres alone, with the single-database JSON")
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


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run the selected scenarios on the chosen databases, return the
    exit status."""
    args = parse_args(argv)
    mode = "smoke" if args.smoke else "full" if args.full else "default"
    sizes = Sizes.for_run(smoke=args.smoke, full=args.full, items=args.items,
                          partitions=args.partitions)
    plan = plan_for(args.db or ["postgres"], args.only or SCENARIOS)
    return main_with(plan, sizes=sizes, mode=mode, rounds=args.rounds, json_path=args.json,
                     command=" ".join(["python -m bench", *(sys.argv[1:] if argv is None
                                                             else argv)]),
                     per_database=args.db is not None)


if __name__ == "__main__":
    raise SystemExit(main())
