"""Migrations: the packaged Alembic scripts, the repo's alembic.ini, and offline SQL."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, event, inspect
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import await_only

from tests.conftest import POSTGRES_URL, require_postgres
from tests.support.engine import wait_until
from watcher.store import Store
from watcher.store.db.migrate import downgrade, upgrade, upgrade_sql
from watcher.store.db.urls import parse_database_url

ROOT = Path(__file__).resolve().parents[2]


def _tables(db_url: str) -> set[str]:
    engine = create_engine(parse_database_url(db_url).sync_url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def trace_new_connections(engine: AsyncEngine) -> list[str]:
    """Record every statement the SQLite connections ``engine`` opens from now on run,
    including the ones its own connect hooks run; returns the list it appends to.
    """
    statements: list[str] = []

    @event.listens_for(engine.sync_engine, "connect", insert=True)
    def trace(dbapi_connection: Any, _record: Any) -> None:
        # Inserted first, so it runs before the engine's own hooks; the callback runs
        # on aiosqlite's thread, and list.append is atomic.
        await_only(dbapi_connection.driver_connection.set_trace_callback(statements.append))

    return statements


def test_alembic_cli_from_the_repo_root(db_url) -> None:
    prefix = f"cli{uuid.uuid4().hex[:8]}_"
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
    # Unique names: other test runs may share the PostgreSQL and MariaDB databases.
    one, two = (f"{name}{uuid.uuid4().hex[:8]}_" for name in ("one", "two"))
    upgrade(db_url, one)
    upgrade(db_url, two)
    try:
        tables = _tables(db_url)
        assert {f"{one}items", f"{two}items", f"{one}alembic_version",
                f"{two}alembic_version"} <= tables
        downgrade(db_url, one)
        tables = _tables(db_url)
        assert f"{two}items" in tables and not {f"{one}items", f"{one}partitions"} & tables
    finally:
        downgrade(db_url, one)
        downgrade(db_url, two)


def test_offline_sql_needs_no_server() -> None:
    sql = upgrade_sql("postgresql://nobody:secret@nowhere.invalid/db", "sf_")
    assert "CREATE TABLE sf_partitions" in sql and "CREATE TABLE sf_items" in sql
    assert "BYTEA" in sql and "CREATE INDEX sf_ix_items_ready" in sql
    assert "secret" not in sql


def test_postgresql_builds_indexes_on_existing_tables_without_blocking_writes() -> None:
    """Every index a revision adds to a table that may hold rows already is built
    CONCURRENTLY on PostgreSQL (outside a transaction), so processors keep writing;
    only the revisions that create a table or column build its index plainly."""
    sql = upgrade_sql("postgresql://nobody@nowhere.invalid/db", "sf_")
    _, later = sql.split("INSERT INTO sf_alembic_version", 1)  # after revision 0001
    plain = re.findall(r"CREATE INDEX (?!CONCURRENTLY)(\w+)", later)
    # 0009 adds the first with its new column, 0011, 0012, 0015 and 0020 the others with
    # their new (empty) tables.
    assert plain == ["sf_ix_partitions_rank", "sf_ix_waits_item", "sf_ix_schedules_due",
                     "sf_ix_notifications_due", "sf_ix_notifications_partition",
                     "sf_ix_removed_waits_at"], plain
    built = re.findall(r"CREATE INDEX CONCURRENTLY (\w+)", later)
    assert {"sf_ix_items_ready_next", "sf_ix_partitions_updated", "sf_ix_partitions_created",
            "sf_ix_items_id", "sf_ix_partitions_rank_next", "sf_ix_items_spawned",
            "sf_ix_items_wait"} <= set(built), built


def _cut_short(url: str, prefix: str, back_to: str, *statements: str) -> None:
    """Leave the database as an upgrade cut short during an online index build does:
    what the revision committed before the build stays, the build's work as
    ``statements`` (with ``{p}`` for the prefix) says, and the version is the one
    before."""
    engine = create_engine(parse_database_url(url).sync_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            for statement in statements:
                conn.exec_driver_sql(statement.format(p=prefix))
            conn.exec_driver_sql(f"UPDATE {prefix}alembic_version SET version_num = '{back_to}'")
    finally:
        engine.dispose()


def _indexes(url: str, table: str) -> dict[str, list[str]]:
    engine = create_engine(parse_database_url(url).sync_url)
    try:
        return {index["name"]: list(index["column_names"])
                for index in inspect(engine).get_indexes(table)}
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_an_upgrade_cut_short_in_an_online_index_build_completes_when_run_again() -> None:
    """PostgreSQL builds indexes CONCURRENTLY, outside the revision's transaction: a build
    cut short leaves the revision's earlier steps committed and the version unstamped.
    Running the upgrade again passes over what is there and completes it."""
    require_postgres()
    prefix = f"cut{uuid.uuid4().hex[:8]}_"
    try:
        upgrade(POSTGRES_URL, prefix, "0004")  # leaders committed, no index built yet
        _cut_short(POSTGRES_URL, prefix, "0003", 'DROP INDEX "{p}ix_partitions_updated"',
                   'DROP INDEX "{p}ix_partitions_created"')
        upgrade(POSTGRES_URL, prefix, "0008")  # columns committed, the index half-built
        _cut_short(POSTGRES_URL, prefix, "0007", 'DROP INDEX "{p}ix_items_id"')
        # 0010 cut between dropping the old index and renaming
        upgrade(POSTGRES_URL, prefix, "0010")
        _cut_short(POSTGRES_URL, prefix, "0009",
                   'ALTER INDEX "{p}ix_partitions_rank" RENAME TO "{p}ix_partitions_rank_next"')
        # 0018 cut short in its index build, its column committed
        upgrade(POSTGRES_URL, prefix, "0018_reduce_spawns")
        _cut_short(POSTGRES_URL, prefix, "0017_schedule_settings",
                   'DROP INDEX "{p}ix_items_spawned"')
        upgrade(POSTGRES_URL, prefix)
        assert _indexes(POSTGRES_URL, f"{prefix}items")[f"{prefix}ix_items_spawned"] == [
            "partition_id", "parent", "spawned_by_reduce"]
        partitions = _indexes(POSTGRES_URL, f"{prefix}partitions")
        assert partitions[f"{prefix}ix_partitions_rank"] == ["status", "rank_at", "id"]
        assert partitions[f"{prefix}ix_partitions_updated"] == ["status", "updated_at"]
        assert _indexes(POSTGRES_URL, f"{prefix}items")[f"{prefix}ix_items_id"] == [
            "id", "partition_id"]
    finally:
        downgrade(POSTGRES_URL, prefix)


def test_sqlite_migration_leaves_the_file_in_wal_mode(tmp_path) -> None:
    # Switching to WAL later, while a processor writes, fails at once with
    # "database is locked"; so the migration sets it before anyone connects.
    path = tmp_path / "fresh.db"
    upgrade(f"sqlite:///{path}")
    connection = sqlite3.connect(path)
    try:
        (mode,) = connection.execute("PRAGMA journal_mode").fetchone()
    finally:
        connection.close()
    assert mode == "wal"


async def test_sqlite_file_in_rollback_mode_switches_to_wal_once_a_writer_commits(tmp_path):
    # A file migrated by an older release is still in rollback-journal mode. While
    # another connection holds its write lock, SQLite refuses the switch to WAL at
    # once instead of waiting; the engine's first connection must wait it out.
    path = tmp_path / "legacy.db"
    upgrade(f"sqlite:///{path}")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode=DELETE")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO partitions (id, version, gate, status, owner, until, "
                   "created_at, updated_at) VALUES ('held', 1, 0, 'available', '', "
                   "'2026-01-01', '2026-01-01', '2026-01-01')")
    store = Store.open(f"sqlite:///{path}")
    statements = trace_new_connections(store.engine)
    try:
        reading = asyncio.create_task(store.partition_get("held"))
        # A second try at the switch means the first met the held lock and was refused.
        await wait_until(lambda: sum("journal_mode=wal" in statement.lower()
                                     for statement in statements) >= 2,
                         message="the switch to WAL to be refused and tried again")
        assert not reading.done(), "the read waits for the writer instead of failing"
        holder.execute("COMMIT")
        info = await asyncio.wait_for(reading, timeout=10)
        assert info is not None and info.id == "held"
    finally:
        holder.close()
        await store.close()
    check = sqlite3.connect(path)
    try:
        assert check.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        check.close()


def test_timelines_move_to_their_own_table_and_back(db_url) -> None:
    """Revision 0013 copies every partition's timeline into ``partition_timelines``
    (a row for each partition, NULL where it had none); its downgrade copies them back."""
    prefix = f"tl{uuid.uuid4().hex[:8]}_"
    upgrade(db_url, prefix, "0012_schedules")
    engine = create_engine(parse_database_url(db_url).sync_url)
    try:
        with engine.begin() as conn:
            for pid, timeline in (("a", '{"v":1}'), ("b", None)):
                conn.exec_driver_sql(
                    f"INSERT INTO {prefix}partitions (id, version, gate, status, owner, until, "
                    "created_at, updated_at, timeline) VALUES "
                    f"('{pid}', 1, 0, 'complete', '', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, "
                    f"CURRENT_TIMESTAMP, {'NULL' if timeline is None else repr(timeline)})")
        upgrade(db_url, prefix)
        with engine.begin() as conn:
            rows = conn.exec_driver_sql(
                f"SELECT partition_id, timeline FROM {prefix}partition_timelines "
                "ORDER BY partition_id").all()
            assert [tuple(row) for row in rows] == [("a", '{"v":1}'), ("b", None)]
            conn.exec_driver_sql(f"UPDATE {prefix}partition_timelines SET timeline = "
                                 "'{\"v\":2}' WHERE partition_id = 'b'")
        downgrade(db_url, prefix, "0012_schedules")
        with engine.begin() as conn:
            rows = conn.exec_driver_sql(
                f"SELECT id, timeline FROM {prefix}partitions ORDER BY id").all()
        assert [tuple(row) for row in rows] == [("a", '{"v":1}'), ("b", '{"v":2}')]
        assert f"{prefix}partition_timelines" not in _tables(db_url)
    finally:
        engine.dispose()
        downgrade(db_url, prefix)


def test_pipelines_put_existing_partitions_in_the_default_pipeline_unpinned(db_url) -> None:
    """Revision 0016 gives every partition written before it ``pipeline = 'default'`` (the
    column's server default) and no pinned ``pipeline_version`` (NULL: a processor pins
    it at the next lease); its downgrade drops both columns and keeps the rows."""
    prefix = f"pl{uuid.uuid4().hex[:8]}_"
    upgrade(db_url, prefix, "0015_notifications")
    engine = create_engine(parse_database_url(db_url).sync_url)
    try:
        with engine.begin() as conn:
            for pid, status in (("open", "available"), ("done", "complete")):
                conn.exec_driver_sql(
                    f"INSERT INTO {prefix}partitions (id, version, gate, status, owner, until, "
                    f"created_at, updated_at) VALUES ('{pid}', 1, 0, '{status}', '', "
                    "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)")
        upgrade(db_url, prefix, "0016_pipelines")
        with engine.begin() as conn:
            rows = conn.exec_driver_sql(
                f"SELECT id, pipeline, pipeline_version FROM {prefix}partitions "
                "ORDER BY id").all()
            assert [tuple(row) for row in rows] == [("done", "default", None),
                                                    ("open", "default", None)]
            conn.exec_driver_sql(  # a partition created after the upgrade names none
                f"INSERT INTO {prefix}partitions (id, version, gate, status, owner, until, "
                "created_at, updated_at) VALUES ('new', 1, 0, 'available', '', "
                "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)")
            new = conn.exec_driver_sql(f"SELECT pipeline, pipeline_version FROM "
                                       f"{prefix}partitions WHERE id = 'new'").one()
            assert tuple(new) == ("default", None)
        downgrade(db_url, prefix, "0015_notifications")
        columns = {column["name"] for column in inspect(engine).get_columns(
            f"{prefix}partitions")}
        assert not {"pipeline", "pipeline_version"} & columns
        with engine.begin() as conn:
            rows = conn.exec_driver_sql(f"SELECT id FROM {prefix}partitions ORDER BY id").all()
        assert [row[0] for row in rows] == ["done", "new", "open"]
    finally:
        engine.dispose()
        downgrade(db_url, prefix)


def test_reduce_spawns_add_a_column_left_null_on_existing_items_and_an_index(db_url) -> None:
    """Revision 0018 adds ``items.spawned_by_reduce`` (NULL on every item written before:
    an item a reduce spawned then is not told from a client's) and ``ix_items_spawned``;
    its downgrade drops both and keeps the rows."""
    prefix = f"rs{uuid.uuid4().hex[:8]}_"
    upgrade(db_url, prefix, "0017_schedule_settings")
    engine = create_engine(parse_database_url(db_url).sync_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f"INSERT INTO {prefix}partitions (id, version, gate, status, owner, until, "
                "created_at, updated_at) VALUES ('p', 1, 0, 'complete', '', "
                "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)")
            for item_id, parent in (("client", "NULL"), ("child", "'client'")):
                conn.exec_driver_sql(
                    f"INSERT INTO {prefix}items (partition_id, id, version, gate, status, "
                    "data, attempts, retry_at, created_at, updated_at, parent) VALUES "
                    f"('p', '{item_id}', 1, 0, 'complete', {_empty_bytes(db_url)}, 0, "
                    f"CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, {parent})")
        upgrade(db_url, prefix)
        assert _indexes(db_url, f"{prefix}items")[f"{prefix}ix_items_spawned"] == [
            "partition_id", "parent", "spawned_by_reduce"]
        with engine.begin() as conn:
            rows = conn.exec_driver_sql(
                f"SELECT id, parent, spawned_by_reduce FROM {prefix}items ORDER BY id").all()
        assert [tuple(row) for row in rows] == [("child", "client", None),
                                                ("client", None, None)]
        downgrade(db_url, prefix, "0017_schedule_settings")
        assert f"{prefix}ix_items_spawned" not in _indexes(db_url, f"{prefix}items")
        with engine.begin() as conn:
            rows = conn.exec_driver_sql(f"SELECT id FROM {prefix}items ORDER BY id").all()
        assert [row[0] for row in rows] == ["child", "client"]
    finally:
        engine.dispose()
        downgrade(db_url, prefix)


def _empty_bytes(db_url: str) -> str:
    """An empty binary literal in ``db_url``'s SQL."""
    if db_url.startswith("postgresql"):
        return "''::bytea"
    return "0x" if db_url.startswith("mssql") else "X''"


def test_item_waits_move_current_waits_into_their_items_and_back(db_url) -> None:
    """Revision 0021 moves each wait that is on (its item waits at the row's version)
    into its item's row, and its operator token into a ``waits`` row of its own; waits
    that are over stay where they are. Its downgrade puts every key an item holds back
    in ``waits``: the current one at the item's version, one that is over at 0."""
    prefix = f"iw{uuid.uuid4().hex[:8]}_"
    upgrade(db_url, prefix, "0020_removed_waits")
    engine = create_engine(parse_database_url(db_url).sync_url)
    now = "CURRENT_TIMESTAMP"
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f"INSERT INTO {prefix}partitions (id, version, gate, status, owner, until, "
                f"created_at, updated_at) VALUES ('p', 1, 0, 'available', '', {now}, {now}, "
                f"{now})")
            for item_id, version, status in (("w", 3, "waiting"), ("d", 5, "complete")):
                conn.exec_driver_sql(
                    f"INSERT INTO {prefix}items (partition_id, id, version, gate, status, "
                    "data, attempts, retry_at, created_at, updated_at) VALUES "
                    f"('p', '{item_id}', {version}, 0, '{status}', {_empty_bytes(db_url)}, 0, "
                    f"{now}, {now}, {now})")
            for token, item_id, version, operator in (("k-w", "w", 3, "'op-w'"),
                                                      ("k-old", "w", 1, "NULL"),
                                                      ("k-d", "d", 4, "NULL")):
                conn.exec_driver_sql(
                    f"INSERT INTO {prefix}waits (token, partition_id, item_id, version, "
                    "timeout, on_timeout, created_at, traceparent, operator_token) VALUES "
                    f"('{token}', 'p', '{item_id}', {version}, 60, 'fail', {now}, 'tp', "
                    f"{operator})")
        upgrade(db_url, prefix)
        assert _indexes(db_url, f"{prefix}items")[f"{prefix}ix_items_wait"] == ["wait_key"]
        with engine.begin() as conn:
            items = conn.exec_driver_sql(
                f"SELECT id, wait_key, wait_timeout, wait_policy, wait_traceparent "
                f"FROM {prefix}items ORDER BY id").all()
            waits = conn.exec_driver_sql(
                f"SELECT token, item_id, version FROM {prefix}waits ORDER BY token").all()
        assert [tuple(row) for row in items] == [("d", None, None, None, None),
                                                 ("w", "k-w", 60.0, "fail", "tp")]
        assert [tuple(row) for row in waits] == [("k-d", "d", 4), ("k-old", "w", 1),
                                                 ("op-w", "w", 3)]
        downgrade(db_url, prefix, "0020_removed_waits")
        with engine.begin() as conn:
            waits = conn.exec_driver_sql(
                f"SELECT token, version FROM {prefix}waits ORDER BY token").all()
        assert [tuple(row) for row in waits] == [("k-d", 4), ("k-old", 1), ("k-w", 3),
                                                 ("op-w", 3)]
    finally:
        engine.dispose()
        downgrade(db_url, prefix)
