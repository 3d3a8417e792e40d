"""``processor migrate --sql`` prints DDL a DBA can run as it is: real newlines, nothing
escaped. Piped into ``psql -v ON_ERROR_STOP=1`` (a throwaway schema), ``mariadb`` (a
throwaway database) and SQLite's ``executescript``, it makes statefeed's tables."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import uuid

import pytest
from sqlalchemy import create_engine, text

from tests.acceptance.harness.processes import run_cli
from tests.conftest import MARIADB_URL, POSTGRES_URL, require_mariadb, require_postgres
from watcher.store.db.urls import parse_database_url

TABLES = {"sf_partitions", "sf_items"}


def ddl(db_url: str) -> str:
    done = run_cli("migrate", "--sql", "--db-url", db_url, "--table-prefix", "sf_")
    assert done.returncode == 0, done.stderr
    assert "\\n" not in done.stdout, "newlines are printed, not escaped"
    assert done.stdout.count("\n") > 20 and "CREATE TABLE sf_items" in done.stdout
    return done.stdout


def test_sqlite_runs_the_ddl(tmp_path) -> None:
    script = ddl(f"sqlite:///{tmp_path / 'unused.db'}")
    with sqlite3.connect(tmp_path / "dba.db") as conn:
        conn.executescript(script)
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert names >= TABLES, names


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql is not installed")
def test_psql_runs_the_ddl() -> None:
    require_postgres()
    url = parse_database_url(POSTGRES_URL).sync_url
    schema = f"sf_sql_{uuid.uuid4().hex[:8]}"
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    try:
        done = subprocess.run(
            ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", url.host or "127.0.0.1",
             "-p", str(url.port or 5432), "-U", url.username or "postgres",
             url.database or "test"],
            input=ddl(POSTGRES_URL), capture_output=True, text=True, timeout=60,
            env={"PGOPTIONS": f"-c search_path={schema}", "PATH": "/usr/bin:/bin",
                 **({"PGPASSWORD": url.password} if url.password else {})})
        assert done.returncode == 0, done.stderr
        with engine.connect() as conn:
            names = {row[0] for row in conn.execute(text(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = :s"),
                {"s": schema})}
        assert names >= TABLES, names
    finally:
        with engine.connect() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        engine.dispose()


@pytest.mark.skipif(shutil.which("mariadb") is None, reason="the mariadb client is missing")
def test_mariadb_runs_the_ddl() -> None:
    require_mariadb()
    url = parse_database_url(MARIADB_URL).sync_url
    database = f"sf_sql_{uuid.uuid4().hex[:8]}"
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {database}"))
    try:
        done = subprocess.run(
            ["mariadb", "-h", url.host or "127.0.0.1", "-P", str(url.port or 3306),
             "-u", url.username or "root", database],
            input=ddl(MARIADB_URL), capture_output=True, text=True, timeout=60,
            env={"PATH": "/usr/bin:/bin",
                 **({"MYSQL_PWD": url.password} if url.password else {})})
        assert done.returncode == 0, done.stderr
        with engine.connect() as conn:
            names = {row[0] for row in conn.execute(text(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = :s"),
                {"s": database})}
        assert names >= TABLES, names
    finally:
        with engine.connect() as conn:
            conn.execute(text(f"DROP DATABASE {database}"))
        engine.dispose()
