"""``python -m bench.databases --smoke`` runs on every live database, end to end.

No timing thresholds: the figures depend on the machine. The test checks that
each database that answers was measured (and a database that does not answer
is skipped with its reason), that SQLite's limit and the HTTP hop were timed on
the same amount of work, that the goals were computed from the figures, and
that no tables were left behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, inspect

from tests.conftest import MARIADB_URL, POSTGRES_URL, _reachable
from watcher.dburl import parse_database_url

REPO = Path(__file__).resolve().parents[2]
GOALS = ["SQLite library drain vs the sqlite3 limit", "SQLite HTTP per item vs bare aiohttp",
         "MariaDB library drain vs PostgreSQL's"]


def _bench_tables(url: str) -> list[str]:
    engine = create_engine(parse_database_url(url).sync_url)
    try:
        with engine.connect() as conn:
            return [name for name in inspect(conn).get_table_names() if name.startswith("bench_")]
    finally:
        engine.dispose()


def _positive(figures: dict[str, Any], *keys: str) -> None:
    for key in keys:
        value: Any = figures
        for part in key.split("."):
            value = value[part]
        assert isinstance(value, int | float) and value > 0, f"{key} = {value!r}"


def test_every_live_database_is_measured(tmp_path: Path) -> None:
    out = tmp_path / "databases.json"
    live = {"postgres": _reachable(POSTGRES_URL) is None,
            "mariadb": _reachable(MARIADB_URL) is None}
    before = {name: _bench_tables(url) for name, url in
              (("postgres", POSTGRES_URL), ("mariadb", MARIADB_URL)) if live[name]}
    done = subprocess.run(
        [sys.executable, "-m", "bench.databases", "--smoke", "--db", "all", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PROCESSOR_BENCH_POSTGRES_URL": POSTGRES_URL,
             "PROCESSOR_BENCH_MARIADB_URL": MARIADB_URL, "COLUMNS": "160"})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    document = json.loads(out.read_text())
    sizes, databases = document["sizes"], document["databases"]
    assert sizes["concurrency"] == 32

    sqlite = databases["db-sqlite"]
    assert sqlite["status"] == "ok", sqlite
    assert sqlite["library"]["items"] == sqlite["raw_sqlite3"]["items"] == sizes["items"]
    _positive(sqlite, "library.items_per_s", "library.cpu_us_per_item",
              "raw_sqlite3.items_per_s", "ratio_library_over_raw", "http.ratio",
              "http.processor.items_per_s", "http.bare_aiohttp.items_per_s")
    assert sqlite["http"]["processor"]["items"] == sizes["http_items"]
    for name in ("postgres", "mariadb"):
        measured = databases[f"db-{name}"]
        if not live[name]:
            assert measured["status"] == "skipped" and "does not answer" in measured["reason"]
            continue
        assert measured["status"] == "ok", measured
        assert measured["library"]["items"] == sizes["items"]
        _positive(measured, "library.items_per_s", "library.statements_per_item")
        assert "http" not in measured  # the HTTP hop is timed on SQLite unless asked
    goals = {goal["name"]: goal for goal in document["goals"]}
    assert list(goals) == GOALS
    assert goals[GOALS[0]]["result"] in ("PASS", "MISS")
    assert goals[GOALS[1]]["result"] in ("PASS", "MISS")
    assert goals[GOALS[2]]["result"] in (("PASS", "MISS") if all(live.values()) else ("n/a",))
    for name, tables in before.items():
        url = POSTGRES_URL if name == "postgres" else MARIADB_URL
        assert _bench_tables(url) == tables, f"tables left behind on {name}"
