"""Migrations: the packaged Alembic scripts, the repo's alembic.ini, and offline SQL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import create_engine, inspect

from watcher.dburl import parse_database_url
from watcher.migrate import downgrade, upgrade, upgrade_sql

ROOT = Path(__file__).resolve().parents[2]


def _tables(db_url: str) -> set[str]:
    engine = create_engine(parse_database_url(db_url).sync_url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_alembic_cli_from_the_repo_root(db_url) -> None:
    prefix = f"cli{os.getpid()}_"
    alembic = [sys.executable, "-m", "alembic", "-x", f"db_url={db_url}",
               "-x", f"table_prefix={prefix}"]
    done = subprocess.run([*alembic, "upgrade", "head"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    try:
        assert {f"{prefix}partitions", f"{prefix}items", f"{prefix}alembic_version"} <= (
            _tables(db_url))
        again = subprocess.run([*alembic, "upgrade", "head"], cwd=ROOT, capture_output=True,
                               text=True, timeout=120)
        assert again.returncode == 0, "upgrading twice is a no-op"
    finally:
        downgrade(db_url, prefix)
    assert not {f"{prefix}partitions", f"{prefix}items"} & _tables(db_url)


def test_prefixes_are_independent(db_url) -> None:
    upgrade(db_url, "one_")
    upgrade(db_url, "two_")
    try:
        tables = _tables(db_url)
        assert {"one_items", "two_items", "one_alembic_version", "two_alembic_version"} <= tables
    finally:
        downgrade(db_url, "one_")
        downgrade(db_url, "two_")


def test_offline_sql_needs_no_server() -> None:
    sql = upgrade_sql("postgresql://nobody:secret@nowhere.invalid/db", "sf_")
    assert "CREATE TABLE sf_partitions" in sql and "CREATE TABLE sf_items" in sql
    assert "BYTEA" in sql and "CREATE INDEX sf_ix_items_ready" in sql
    assert "secret" not in sql
