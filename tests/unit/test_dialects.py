"""SQL Server and MySQL/MariaDB by compilation: the migration's DDL and every store statement.

No SQL Server runs in CI, so what SQL Server would receive is checked here as
text: the migrations rendered offline (Alembic ``--sql``), and every statement
the store executes compiled for the mssql dialect. The statements are the real
ones: a scenario drives every public :class:`Store` method against a scratch
SQLite file, with the SQL Server driver (:mod:`watcher.store.drivers.mssql.driver`) in
place of SQLite's, and records each statement as it is executed (SQLAlchemy's
``before_execute`` event), then compiles the recorded statement objects for
SQL Server. That is faithful because the store's statements are the same on
every database (it never branches on one) and the SQL Server driver builds
portable ones, which SQLite runs too; what differs per database (the clock,
row locking) is rendered at compilation, by each database's module in
:mod:`watcher.store.drivers`. MySQL and MariaDB also run live (the ``mariadb``
integration tests); their DDL is checked here as well.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Any

import pytest
from alembic import command
from sqlalchemy import event
from sqlalchemy.dialects import mssql, mysql, sqlite
from sqlalchemy.dialects.mssql.pymssql import MSDialect_pymssql
from sqlalchemy.dialects.mysql.mariadb import MariaDBDialect
from sqlalchemy.engine import Dialect
from sqlalchemy.schema import CreateIndex, CreateTable
from sqlalchemy.sql import ClauseElement, Select

from tests.support.scenario import drive_every_method, store_methods
from watcher.records import ItemWrite
from watcher.store import Store
from watcher.store.db.migrate import alembic_config, upgrade, upgrade_sql
from watcher.store.drivers import driver_class
from watcher.store.drivers.base import Driver
from watcher.store.drivers.mssql.driver import SQLServerDriver
from watcher.store.drivers.mysql.driver import MySQLDriver
from watcher.store.sql.schema import tables_for

SECRET = "s3cret-pw"
PREFIX = "sf_"


def _sql_for(url: str) -> str:
    return upgrade_sql(url, PREFIX)


def _downgrade_sql(url: str) -> str:
    import contextlib
    import io

    config = alembic_config(url, PREFIX)
    buffer = io.StringIO()
    config.output_buffer = buffer
    with contextlib.redirect_stdout(buffer):
        command.downgrade(config, "head:base", sql=True)
    return buffer.getvalue()


def _table_block(ddl: str, table: str) -> str:
    """The ``CREATE TABLE <table> (...)`` statement out of a DDL script."""
    match = re.search(rf"CREATE TABLE {table} \((.*?)\n\)([^\n;]*)", ddl, re.S)
    assert match, f"no CREATE TABLE {table} in:\n{ddl}"
    return match.group(0)


def _column_lines(block: str) -> set[str]:
    return {line.strip().rstrip(",").strip() for line in block.splitlines()[1:-1]}


def _columns_added(ddl: str, table: str) -> set[str]:
    """The column definitions that later revisions add with ``ALTER TABLE``."""
    return {match.group(1).strip() for match in re.finditer(
        rf"ALTER TABLE {table} ADD (?:COLUMN )?([^;\n]*?);?$", ddl, re.M)}


def _normalised(lines: set[str]) -> set[frozenset[str]]:
    # ALTER TABLE may put DEFAULT and NOT NULL in another order than CREATE TABLE.
    return {frozenset(line.split()) for line in lines}


# -- the migration, offline --------------------------------------------------

MSSQL_URLS = [f"mssql+pymssql://app:{SECRET}@db.invalid/jobs", f"mssql://app:{SECRET}@h/jobs"]
MYSQL_URLS = [f"mysql://app:{SECRET}@db.invalid/jobs", f"mariadb://app:{SECRET}@h/jobs"]


@pytest.mark.parametrize("url", MSSQL_URLS)
def test_sql_server_ddl_has_the_right_types(url: str) -> None:
    ddl = _sql_for(url)
    partitions = _column_lines(_table_block(ddl, f"{PREFIX}partitions"))
    items = _column_lines(_table_block(ddl, f"{PREFIX}items"))
    binary = "COLLATE Latin1_General_100_BIN2"
    assert f"id NVARCHAR(255) {binary} NOT NULL" in partitions
    assert f"owner NVARCHAR(255) {binary} NOT NULL" in partitions
    assert "status NVARCHAR(16) NOT NULL" in partitions
    assert {"until DATETIME2(6) NOT NULL", "created_at DATETIME2(6) NOT NULL"} <= partitions
    assert f"partition_id NVARCHAR(255) {binary} NOT NULL" in items
    assert "data VARBINARY(max) NOT NULL" in items
    assert "last_error NVARCHAR(max) NULL" in items
    assert "retry_at DATETIME2(6) NOT NULL" in items
    assert "PRIMARY KEY (partition_id, id)" in items
    for legacy in ("NTEXT", " TEXT", "IMAGE", "DATETIME NOT NULL", "VARCHAR(max)"):
        assert legacy not in ddl.replace("NVARCHAR(max)", ""), legacy
    # The hot queries' indexes, and no escalation to table locks on items.
    assert f"CREATE INDEX {PREFIX}ix_partitions_lease ON {PREFIX}partitions " \
           "(status, until, owner)" in ddl
    assert f"CREATE INDEX {PREFIX}ix_items_ready ON {PREFIX}items " \
           "(partition_id, status, gate, retry_at, id)" in ddl
    assert f"ALTER TABLE {PREFIX}items SET (LOCK_ESCALATION = DISABLE)" in ddl
    assert "\nGO\n" in ddl  # batches separated for sqlcmd / SSMS
    assert SECRET not in ddl


@pytest.mark.parametrize("url", MYSQL_URLS)
def test_mysql_ddl_has_the_right_types(url: str) -> None:
    ddl = _sql_for(url)
    for table in ("partitions", "items"):
        block = _table_block(ddl, f"{PREFIX}{table}")
        assert block.endswith(")ENGINE=InnoDB CHARSET=utf8mb4"), block
    partitions = _column_lines(_table_block(ddl, f"{PREFIX}partitions"))
    items = _column_lines(_table_block(ddl, f"{PREFIX}items"))
    assert "id VARCHAR(255) COLLATE utf8mb4_bin NOT NULL" in partitions
    assert "owner VARCHAR(255) COLLATE utf8mb4_bin NOT NULL" in partitions
    assert {"until DATETIME(6) NOT NULL", "updated_at DATETIME(6) NOT NULL"} <= partitions
    assert "data LONGBLOB NOT NULL" in items
    assert "retry_at DATETIME(6) NOT NULL" in items
    assert not re.search(r"DATETIME(?!\(6\))", ddl), "a DATETIME without microseconds"
    assert "LOCK_ESCALATION" not in ddl and SECRET not in ddl


def test_offline_ddl_needs_no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """``processor migrate --sql`` works where pymssql / PyMySQL are not installed."""
    for module in ("pymssql", "pymysql", "aiomysql"):
        monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    assert "VARBINARY(max)" in _sql_for(MSSQL_URLS[0])
    assert "LONGBLOB" in _sql_for(MYSQL_URLS[0])


@pytest.mark.parametrize("url", [*MSSQL_URLS[:1], *MYSQL_URLS])
def test_offline_downgrade_renders(url: str) -> None:
    ddl = _downgrade_sql(url)
    assert f"DROP TABLE {PREFIX}items" in ddl and f"DROP TABLE {PREFIX}partitions" in ddl


@pytest.mark.parametrize("dialect", [MSDialect_pymssql(), mysql.dialect(), MariaDBDialect(),
                                     sqlite.dialect()], ids=lambda d: d.name)
def test_models_and_migration_agree(dialect: Dialect, tmp_path) -> None:
    """The SQLModel tables (used by the store) and the migration (creating the tables) agree."""
    urls = {"mssql": MSSQL_URLS[0], "mysql": MYSQL_URLS[0], "mariadb": MYSQL_URLS[1],
            "sqlite": f"sqlite:///{tmp_path / 'x.db'}"}
    ddl = _sql_for(urls[dialect.name])
    tables = tables_for(PREFIX)
    for table in (tables.partitions, tables.items, tables.leaders):
        modelled = str(CreateTable(table).compile(dialect=dialect)).strip()
        migrated = _column_lines(_table_block(ddl, table.name)) | _columns_added(ddl, table.name)
        assert _normalised(_column_lines(modelled)) == _normalised(migrated)
        for index in table.indexes:
            assert str(CreateIndex(index).compile(dialect=dialect)) in ddl


def test_cli_prints_sql_server_ddl_without_connecting() -> None:
    from typer.testing import CliRunner

    from processor.cli.common import app

    done = CliRunner().invoke(app, ["migrate", "--sql", "--db-url",
                                    f"mssql+pymssql://user:{SECRET}@nowhere.invalid/db"])
    assert done.exit_code == 0, done.output
    assert "CREATE TABLE items" in done.output and "VARBINARY(max)" in done.output
    assert SECRET not in done.output


# -- every store statement, compiled for SQL Server ---------------------------

class _PortableBatchSQLServerDriver(SQLServerDriver):
    """SQL Server's driver with the portable batch write, so that a scenario runs on SQLite."""

    async def items_apply(self, writes: Sequence[ItemWrite], owner: str) -> list[bool]:
        return await Driver.items_apply(self, writes, owner)


@pytest.fixture
async def recorded(tmp_path) -> tuple[list[ClauseElement], set[str]]:
    """Every statement object the store executed while driving every public method."""
    url = f"sqlite:///{tmp_path / 'statements.db'}"
    upgrade(url)
    store = Store.open(url)
    # The statements SQL Server's driver would send; its batch write is checked on its
    # own (test_sql_server_batch_write_renders_as_t_sql), SQLite cannot run OPENJSON.
    assert driver_class("mssql") is SQLServerDriver
    await store.driver.close()
    store.driver = _PortableBatchSQLServerDriver(store.engine, store.statements)
    statements: list[ClauseElement] = []
    called: set[str] = set()

    @event.listens_for(store.engine.sync_engine, "before_execute")
    def record(_conn: Any, clause: Any, multiparams: Any, params: Any,
               _options: Any) -> None:
        if not isinstance(clause, ClauseElement):
            return
        values = params or (multiparams[0] if multiparams else None)
        if isinstance(clause, Select) and isinstance(values, dict) and values:
            # Bind the execution's values, so that post-compile parameters
            # (SQL Server's TOP n, expanding IN lists) render as sent.
            clause = clause.params(**values)
        statements.append(clause)

    for name in store_methods():
        original = getattr(store, name)

        def tracked(*args: Any, _name: str = name, _original: Any = original, **kw: Any) -> Any:
            called.add(_name)
            return _original(*args, **kw)

        setattr(store, name, tracked)
    try:
        await drive_every_method(store)
    finally:
        await store.close()
    return statements, called


async def test_the_scenario_covers_every_store_method(recorded) -> None:
    statements, called = recorded
    missing = store_methods() - called
    assert not missing, (
        f"store methods {sorted(missing)} are not driven by tests/support/scenario.py, so "
        "their SQL is not checked for SQL Server; add them to the scenario")
    assert len(statements) >= 30


MSSQL_CLOCK = "COALESCE(CAST(%(clock_now)s AS DATETIME2(6)), SYSUTCDATETIME())"
MYSQL_CLOCK = "COALESCE(CAST(%s AS DATETIME(6)), UTC_TIMESTAMP(6))"


def _compile(statement: ClauseElement, dialect: Dialect) -> str:
    # Post-compile parameters (TOP n, IN lists) rendered as the driver would receive them.
    return str(statement.compile(dialect=dialect, compile_kwargs={"render_postcompile": True}))


async def test_every_store_statement_compiles_for_sql_server(recorded) -> None:
    statements, _ = recorded
    dialect = MSDialect_pymssql(paramstyle="pyformat")  # as create_engine sets it up
    kinds: set[str] = set()
    for statement in statements:
        sql = _compile(statement, dialect)
        kinds.add(sql.split(None, 1)[0])
        assert not re.search(r"\bLIMIT\b|\bOFFSET\b|\bRETURNING\b", sql, re.I), sql
        assert not re.search(r"\b(true|false)\b", sql, re.I), f"boolean literal:\n{sql}"
        assert not re.search(r"strftime|now\(\)|UTC_TIMESTAMP|CURRENT_TIMESTAMP", sql), sql
        if isinstance(statement, Select) and statement._limit_clause is not None:
            assert re.match(r"SELECT TOP \d+ ", sql), sql
        # Where SQLite reads its clock, SQL Server must read its own (UTC) clock.
        if "strftime" in _compile(statement, sqlite.dialect()):
            assert "SYSUTCDATETIME()" in sql, sql
        if "printf('%+.3f seconds'" in _compile(statement, sqlite.dialect()):
            assert "DATEADD(second, CAST(FLOOR(" in sql, sql
        # Every reading of the clock is the store's clock, the database's behind it.
        assert sql.count("SYSUTCDATETIME()") == sql.count(MSSQL_CLOCK), sql
    assert kinds == {"SELECT", "INSERT", "UPDATE", "DELETE"}


async def test_every_store_statement_compiles_for_mysql(recorded) -> None:
    statements, _ = recorded
    for dialect in (mysql.dialect(), MariaDBDialect()):
        for statement in statements:
            sql = _compile(statement, dialect)
            assert "RETURNING" not in sql and "SYSUTCDATETIME" not in sql, sql
            if "strftime" in _compile(statement, sqlite.dialect()):
                assert "UTC_TIMESTAMP(6)" in sql, sql
            assert sql.count("UTC_TIMESTAMP(6)") == sql.count(MYSQL_CLOCK), sql


def test_sql_server_clock_and_limits_render_as_t_sql() -> None:
    """A spot check of the shapes the statement checks rely on."""
    from sqlalchemy import select

    from watcher.store.drivers.sql import db_now, db_now_plus

    items = tables_for(PREFIX).items
    query = select(items.c.id).where(items.c.retry_at <= db_now()).order_by(
        items.c.retry_at).limit(5)
    sql = _compile(query, mssql.dialect())
    assert sql.startswith("SELECT TOP 5 sf_items.id")
    assert "sf_items.retry_at <= SYSUTCDATETIME()" in sql
    plus = _compile(select(db_now_plus(2.5)), mssql.dialect())
    # Whole seconds, then microseconds: an INT of milliseconds would overflow at 24.8 days.
    assert ("DATEADD(microsecond, CAST(((:param_1) - FLOOR(:param_1)) * 1000000 AS INT), "
            "DATEADD(second, CAST(FLOOR(:param_1) AS INT), SYSUTCDATETIME()))") in plus


# -- the batch result writes, compiled ----------------------------------------

def _batch_driver(driver: type[Driver], tmp_path) -> Any:
    """``driver`` on a scratch SQLite store (it only builds its statements)."""
    store = Store.open(f"sqlite:///{tmp_path / 'batch.db'}", PREFIX)
    return driver(store.engine, store.statements)


def test_sql_server_batch_write_renders_as_t_sql(tmp_path) -> None:
    """One UPDATE over OPENJSON rows, guarded and fenced per row, OUTPUT for RETURNING."""
    driver = _batch_driver(SQLServerDriver, tmp_path)
    sql = _compile(driver.batch_statement, MSDialect_pymssql(paramstyle="pyformat"))
    assert sql.startswith(f"UPDATE {PREFIX}items SET version=({PREFIX}items.version + ")
    assert f"OUTPUT inserted.partition_id, inserted.id FROM {PREFIX}items, OPENJSON(" in sql
    assert ("WITH (pid NVARCHAR(255) '$[0]', iid NVARCHAR(255) '$[1]', seen BIGINT '$[2]', "
            "status NVARCHAR(16) '$[3]', gate BIGINT '$[4]', attempts BIGINT '$[5]', "
            "error NVARCHAR(max) '$[6]', data VARCHAR(max) '$[7]', delay FLOAT '$[8]', "
            "history NVARCHAR(max) '$[9]') AS v") in sql
    # The guard: key and version per row, compared in the ids' own collation; the fence.
    collated = "(v.{} COLLATE Latin1_General_100_BIN2)"
    assert (f"WHERE {PREFIX}items.partition_id = {collated.format('pid')} AND {PREFIX}items.id = "
            f"{collated.format('iid')} AND {PREFIX}items.version = v.seen AND (EXISTS (") in sql
    assert (f"{PREFIX}partitions.id = {collated.format('pid')} AND {PREFIX}partitions.owner = "
            f"%(owner)s AND {PREFIX}partitions.status = %(status_1)s AND "
            f"{PREFIX}partitions.until > {MSSQL_CLOCK}") in sql
    assert f"data=coalesce(convert(VARBINARY(max), v.data, 2), {PREFIX}items.data)" in sql
    assert "DATEADD(second, CAST(FLOOR(v.delay) AS INT), " in sql
    assert not re.search(r"\bLIMIT\b|\bRETURNING\b|strftime|UTC_TIMESTAMP", sql), sql
    # The error history's new entry is stamped by the same clock (the fifth reading).
    assert (f"error_history=CASE WHEN (v.history IS NULL) THEN {PREFIX}items.error_history "
            f"ELSE replace(v.history, '{{\"at\":null,', '{{\"at\":\"' + "
            f"CAST({MSSQL_CLOCK} AS NVARCHAR(40)) + '\",') END") in sql
    assert sql.count("SYSUTCDATETIME()") == sql.count(MSSQL_CLOCK) == 5


async def test_sql_server_batch_write_sends_one_statement_and_reads_its_output(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib
    import json

    from watcher.store.drivers.mssql import driver as mssql_driver

    driver = _batch_driver(SQLServerDriver, tmp_path)
    sent: list[tuple[Any, dict[str, Any]]] = []

    class Connection:
        async def execute(self, statement: Any, params: dict[str, Any]) -> Any:
            sent.append((statement, params))
            return type("Result", (), {"all": lambda self: [("p", "b"), ("q", "a")]})()

    @contextlib.asynccontextmanager
    async def transaction(engine: Any) -> Any:
        yield Connection()

    monkeypatch.setattr(mssql_driver, "write_transaction", transaction)
    writes = [ItemWrite("p", "a", 3, "complete", 0, attempts=1),
              ItemWrite("p", "b", 4, "available", 2, attempts=0, data=b"\x00\xff",
                        retry_delay=1.5),
              ItemWrite("q", "a", 1, "failed", 0, attempts=5, last_error="boom",
                        error_history='[{"e":"boom"}]')]
    assert await driver.items_apply(writes, "me") == [False, True, True]
    ((statement, params),) = sent
    assert statement is driver.batch_statement and params["owner"] == "me"
    assert json.loads(params["rows"]) == [
        ["p", "a", 3, "complete", 0, 1, None, None, 0.0, None],
        ["p", "b", 4, "available", 2, 0, None, "00ff", 1.5, None],
        ["q", "a", 1, "failed", 0, 5, "boom", None, 0.0, '[{"e":"boom"}]']]
    compiled = statement.compile(dialect=MSDialect_pymssql(paramstyle="pyformat"))
    assert set(params) <= set(compiled.params)


@pytest.mark.parametrize("dialect", [mysql.dialect(paramstyle="pyformat"),
                                     MariaDBDialect(paramstyle="pyformat")],
                         ids=lambda d: d.name)
def test_mysql_batch_write_renders_with_json_table(dialect: Dialect, tmp_path) -> None:
    """MariaDB runs it live; this pins the shape for MySQL too (no RETURNING there)."""
    driver = _batch_driver(MySQLDriver, tmp_path)
    sql = _compile(driver.batch_statement, dialect)
    assert sql.startswith(f"UPDATE {PREFIX}items, JSON_TABLE(%(rows)s, '$[*]' COLUMNS (")
    ids = "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
    assert f"pid {ids} PATH '$[0]', iid {ids} PATH '$[1]', seen BIGINT PATH '$[2]'" in sql
    assert (f"WHERE {PREFIX}items.partition_id = v.pid AND {PREFIX}items.id = v.iid AND "
            f"{PREFIX}items.version = v.seen AND (EXISTS (") in sql
    assert f"{PREFIX}items.data=coalesce(from_base64(v.data), {PREFIX}items.data)" in sql
    clock = MYSQL_CLOCK.replace("%s", "%(clock_now)s")
    assert "history LONGTEXT CHARACTER SET utf8mb4 PATH '$[9]'" in sql
    history = dialect.identifier_preparer.quote("history")  # a reserved word on MariaDB
    assert (f"{PREFIX}items.error_history=CASE WHEN (v.{history} IS NULL) THEN "
            f"{PREFIX}items.error_history ELSE replace(v.{history}, '{{\"at\":null,', "
            f"concat('{{\"at\":\"', CAST({clock} AS CHAR(40)), '\",')) END") in sql
    assert "RETURNING" not in sql and sql.count("UTC_TIMESTAMP(6)") == sql.count(clock) == 5
