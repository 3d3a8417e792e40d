"""``python -m bench.databases --smoke`` runs end to end, on SQLite.

No timing thresholds: the figures depend on the machine. The test checks that
SQLite's limit and the HTTP hop were timed on the same amount of work as the
library drain, that the goals were computed from the figures (those that need
PostgreSQL or MariaDB read n/a), and that none of the run's tables were left
behind. Its goals compare statefeed with PGQueuer, so without the ``bench`` extra
it skips, naming it (and fails under CI).

The library drain on PostgreSQL and MariaDB, a database that does not answer, and
the goals across all three are the same code (:func:`bench.suite.main_with`) that
``test_bench_every_database.py`` runs on every database; which scenarios this
command plans where is checked without a database (:func:`test_the_plan`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.databases import parse_args, plan_of
from tests.acceptance.test_bench_every_database import CROSS_DATABASE_GOALS
from tests.acceptance.test_bench_smoke import positive, tables_left
from tests.conftest import require_bench_peers

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv, plan", [
    ([], {"sqlite": ("library", "http"), "postgres": ("library",),
          "mariadb": ("library",)}),
    (["--db", "all"], {"sqlite": ("library", "http"), "postgres": ("library",),
                       "mariadb": ("library",)}),
    (["--db", "postgres", "--db", "mariadb"], {"postgres": ("library",),
                                               "mariadb": ("library",)}),
    (["--db", "all", "--http", "postgres"], {"sqlite": ("library",),
                                             "postgres": ("library", "http"),
                                             "mariadb": ("library",)}),
    (["--http", "all"], {"sqlite": ("library", "http"), "postgres": ("library", "http"),
                         "mariadb": ("library", "http")}),
    (["--db", "sqlite", "--http", "none"], {"sqlite": ("library",)}),
])
def test_the_plan(argv: list[str], plan: dict[str, tuple[str, ...]]) -> None:
    """The library drain on every chosen database; the HTTP hop on SQLite unless
    ``--http`` names others."""
    assert plan_of(parse_args(argv)) == plan


def test_sqlite_is_measured(tmp_path: Path) -> None:
    require_bench_peers()  # the PGQueuer goal reads n/a without it
    out = tmp_path / "databases.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.databases", "--smoke", "--db", "sqlite", "--json",
         str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=220,
        env={**os.environ, "COLUMNS": "160"})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    document = json.loads(out.read_text())
    sizes, databases = document["sizes"], document["databases"]
    assert sizes["concurrency"] == 32
    assert set(databases) == {"sqlite"}

    sqlite = databases["sqlite"]
    assert sqlite["status"] == "ok", sqlite
    library, http = sqlite["scenarios"]["library"], sqlite["scenarios"]["http"]
    assert library["statefeed"][0]["items"] == library["raw_sqlite3"]["items"] == sizes["items"]
    positive(library, "statefeed.0.items_per_s", "statefeed.0.cpu_us_per_item",
             "raw_sqlite3.items_per_s", "ratio_library_over_raw",
             "raw_sqlite3_full_sync.items_per_s")
    positive(http, "ratio_processor_over_bare_aiohttp", "processor.0.items_per_s",
             "bare.0.items_per_s")
    assert http["processor"][0]["items"] == sizes["http_items"]
    goals = {goal["name"]: goal for goal in document["goals"]}
    assert list(goals) == CROSS_DATABASE_GOALS
    assert goals[CROSS_DATABASE_GOALS[0]]["result"] in ("PASS", "MISS")
    assert goals[CROSS_DATABASE_GOALS[1]]["result"] in ("PASS", "MISS")
    # MariaDB's drain against PostgreSQL's, and PostgreSQL's own: neither was measured.
    for name in CROSS_DATABASE_GOALS[2:]:
        assert goals[name]["result"] == "n/a", name
    assert tables_left(sqlite["url"], sqlite["table_prefixes"]) == []
