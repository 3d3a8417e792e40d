"""Configuration, URL and table-prefix validation, and the clock's SQL per dialect."""

from __future__ import annotations

import importlib
import re

import pytest
from sqlalchemy import select
from sqlalchemy.dialects import mssql, mysql, postgresql, sqlite

from watcher.config import WatcherConfig
from watcher.errors import ConfigError
from watcher.store.db.urls import parse_database_url, redact_url
from watcher.store.drivers.postgresql.pooler import (
    behind_transaction_pooler,
    psycopg_options,
    without_option,
)
from watcher.store.drivers.sql import db_now, db_now_plus
from watcher.store.sql.schema import tables_for, validate_table_prefix


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"concurrency": 0}, "concurrency"),
    ({"lease_duration": 0.5}, "lease duration"),
    ({"poll_interval": 0}, "poll interval"),
    ({"poll_interval": 5, "lease_duration": 10}, "third of the lease duration"),
    ({"max_retries": -1}, "max retries"),
    ({"retry_backoff": 10, "retry_backoff_max": 1}, "retry backoff max"),
    ({"owner_id": " "}, "owner id"),
    ({"concurrency": True}, "concurrency"),
    ({"result_linger": -0.001}, "result linger"),
    ({"max_leases": 0}, "max leases"),
    ({"result_linger": 5}, "result linger must be a number of seconds 0 or more and at most 1.0"),
    ({"concurrency": 0}, "concurrency must be a whole number from 1 or more, got 0"),
    ({"max_retries": -1}, "max retries must be a whole number from 0 or more, got -1"),
    ({"poll_interval": float("inf")}, "poll interval must be a number of seconds"),
    ({"lease_duration": "30"}, "lease duration must be a number of seconds"),
    ({"retry_backoff_max": float("nan")}, "retry backoff max must be a number of seconds"),
])
def test_config_rejects_bad_values(kwargs, fragment) -> None:
    with pytest.raises(ConfigError, match=fragment):
        WatcherConfig(**kwargs)


def test_config_defaults_are_valid_and_unique_per_instance() -> None:
    first, second = WatcherConfig(), WatcherConfig()
    assert first.owner_id != second.owner_id
    assert first.renew_interval == first.lease_duration / 3


@pytest.mark.parametrize(("raw", "dialect", "driver"), [
    ("postgresql://u:p@h/db", "postgresql", "psycopg"),
    ("postgres://u@h:5433/db", "postgresql", "psycopg"),
    ("sqlite:///x.db", "sqlite", "aiosqlite"),
    ("mysql://u:p@h:3306/db", "mysql", "aiomysql"),
    ("mysql+pymysql://u@h/db", "mysql", "aiomysql"),
    ("mariadb://u@h/db", "mariadb", "aiomysql"),
    ("mssql://u:p@h/db", "mssql", "pymssql_threaded"),
    ("mssql+pymssql://u:p@h:1433/db", "mssql", "pymssql_threaded"),
])
def test_urls_map_to_our_drivers(raw, dialect, driver) -> None:
    url = parse_database_url(raw)
    assert url.dialect == dialect and url.async_url.get_driver_name() == driver


@pytest.mark.parametrize(("raw", "sync_driver"), [
    ("postgresql://u@h/db", "psycopg"),
    ("sqlite:///x.db", "pysqlite"),
    ("mysql://u@h/db", "pymysql"),
    ("mariadb+aiomysql://u@h/db", "pymysql"),
    ("mssql://u@h/db", "pymssql"),
])
def test_migrations_use_a_synchronous_driver(raw, sync_driver) -> None:
    assert parse_database_url(raw).sync_url.get_driver_name() == sync_driver


def test_mysql_urls_default_to_four_byte_utf8() -> None:
    url = parse_database_url("mysql://u@h/db")
    assert url.async_url.query["charset"] == url.sync_url.query["charset"] == "utf8mb4"
    assert parse_database_url("mariadb://u@h/db?charset=latin1").async_url.query == {
        "charset": "latin1"}


def test_a_transaction_pooler_is_said_in_the_url_and_never_reaches_libpq() -> None:
    url = parse_database_url("postgresql://u:pw@pooler:6432/db?pooler=transaction&sslmode=off")
    # The engine's URL keeps it (the PostgreSQL package reads it there and takes it out
    # before connecting); the migrations' URL never has it; messages show it.
    assert behind_transaction_pooler(url.async_url)
    assert psycopg_options(url.async_url) == {"prepare_threshold": None}
    assert dict(url.sync_url.query) == {"sslmode": "off"}
    assert dict(without_option(url.async_url).query) == {"sslmode": "off"}
    assert "pooler=transaction" in url.redacted() and "pw" not in url.redacted()
    session = parse_database_url("postgresql://u@h/db?pooler=Session")
    assert not behind_transaction_pooler(session.async_url)
    assert psycopg_options(session.async_url) == {}
    assert psycopg_options(parse_database_url("postgresql://u@h/db").async_url) == {}


@pytest.mark.parametrize(("raw", "fragment"), [
    ("postgresql://u@h/db?pooler=yes", r"pooler= option must be one of: transaction, session"),
    ("postgresql://u@h/db?pooler=transaction&pooler=session", "pooler= option must be"),
    ("mysql://u@h/db?pooler=transaction", "pooler= option is for PostgreSQL URLs"),
    ("sqlite:///x.db?pooler=transaction", "pooler= option is for PostgreSQL URLs"),
])
def test_a_wrong_pooler_option_is_refused(raw, fragment) -> None:
    with pytest.raises(ConfigError, match=fragment):
        parse_database_url(raw)


@pytest.mark.parametrize(("raw", "fragment"), [
    ("", "empty"),
    ("not a url", "malformed"),
    ("oracle://u:p@h/db", "not supported"),
    ("sqlite://", "in-memory"),
    ("postgresql://u@h", "names no database"),
    ("mysql://u@h", "names no database"),
    ("mssql://u:p@h", "names no database"),
    ("mssql+pyodbc://u:p@h/db", "not supported"),
])
def test_bad_urls_are_explained(raw, fragment) -> None:
    with pytest.raises(ConfigError, match=fragment):
        parse_database_url(raw)


def test_passwords_never_show() -> None:
    url = parse_database_url("postgresql://user:s3cret@db.example/app")
    assert "s3cret" not in repr(url) and "s3cret" not in str(url)
    with pytest.raises(ConfigError) as caught:
        parse_database_url("oracle://user:s3cret@h/db")
    assert "s3cret" not in str(caught.value)
    assert "s3cret" not in redact_url("postgresql://user:s3cret@h/db")
    for raw in ("mysql://user:s3cret@h/db", "mssql://user:s3cret@h/db"):
        assert "s3cret" not in repr(parse_database_url(raw))


@pytest.mark.parametrize("prefix", ["", "sf_", "a", "team1_jobs_"])
def test_good_prefixes(prefix) -> None:
    assert validate_table_prefix(prefix) == prefix
    assert tables_for(prefix).items.name == f"{prefix}items"


@pytest.mark.parametrize("prefix", ["1x", "A_", "x;drop table", "x-y", "x" * 31, "x y"])
def test_bad_prefixes(prefix) -> None:
    with pytest.raises(ConfigError, match="table prefix"):
        validate_table_prefix(prefix)


def test_prefixed_indexes_do_not_collide() -> None:
    names = {index.name for index in tables_for("sf_").items.indexes}
    assert names == {"sf_ix_items_ready", "sf_ix_items_id", "sf_ix_items_spawned",
                     "sf_ix_items_wait"}
    partitions = {index.name for index in tables_for("sf_").partitions.indexes}
    assert all(name.startswith("sf_ix_partitions_") for name in partitions)


@pytest.mark.parametrize(("dialect", "now_sql", "plus_sql"), [
    (postgresql.dialect(), "now() AT TIME ZONE 'UTC'", "make_interval"),
    (sqlite.dialect(), "strftime('%Y-%m-%d %H:%M:%f', 'now')", "seconds"),
    (mssql.dialect(), "SYSUTCDATETIME()", "DATEADD(second, CAST(FLOOR("),
    (mysql.dialect(), "UTC_TIMESTAMP(6)", "MICROSECOND"),
])
def test_clock_sql_per_dialect(dialect, now_sql, plus_sql) -> None:
    # Each database's clock arithmetic is registered by its driver's module.
    driver = {"postgresql": "postgresql", "sqlite": "sqlite", "mssql": "mssql"}.get(
        dialect.name, "mysql")
    importlib.import_module(f"watcher.store.drivers.{driver}.driver")
    sql = str(select(db_now(), db_now_plus(1.5)).compile(dialect=dialect))
    assert now_sql in sql and plus_sql in sql


@pytest.mark.parametrize(("raw", "module", "extra"), [
    ("mysql://u@h/db", "aiomysql", "statefeed[mysql]"),
    ("mariadb://u@h/db", "aiomysql", "statefeed[mysql]"),
    ("mssql://u:p@h/db", "pymssql", "statefeed[mssql]"),
])
def test_a_missing_driver_names_the_extra_to_install(raw, module, extra, monkeypatch) -> None:
    import sys

    from watcher.store.db.engine import create_engine

    monkeypatch.setitem(sys.modules, module, None)  # importing it raises ImportError
    with pytest.raises(ConfigError, match=re.escape(extra)):
        create_engine(parse_database_url(raw))



class _Orig(Exception):
    def __init__(self, *args, sqlstate=None):
        super().__init__(*args)
        self.sqlstate = sqlstate


@pytest.mark.parametrize(("orig", "conflict"), [
    (_Orig("deadlock detected", sqlstate="40P01"), True),
    (_Orig("could not serialize", sqlstate="40001"), True),
    (_Orig(1213, "Deadlock found when trying to get lock"), True),
    (_Orig(1205, "Lock wait timeout exceeded"), True),
    (_Orig("connection refused", sqlstate="08001"), False),
    (_Orig(2003, "Can't connect to MySQL server"), False),
])
def test_lock_conflicts_are_told_from_outages(orig, conflict) -> None:
    from sqlalchemy.exc import OperationalError

    from watcher.store.drivers.conflicts import is_lock_conflict

    assert is_lock_conflict(OperationalError("stmt", {}, orig)) is conflict
