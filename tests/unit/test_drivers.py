"""The clock objects, the choice of driver, and the clock's SQL on every database (compiled)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.dialects.mssql.pymssql import MSDialect_pymssql
from sqlalchemy.dialects.mysql.mariadb import MariaDBDialect
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import OperationalError

from watcher.errors import ConfigError
from watcher.store.db.clock import DatabaseClock, FixedClock
from watcher.store.drivers import driver_class
from watcher.store.drivers.mssql.driver import SQLServerDriver
from watcher.store.drivers.mysql.driver import MySQLDriver
from watcher.store.drivers.postgresql.driver import PostgreSQLDriver
from watcher.store.drivers.sql import clock_now, time_plus
from watcher.store.drivers.sqlite.driver import SQLiteDriver
from watcher.store.sql.schema import tables_for
from watcher.store.sql.shared import Statements

MOMENT = datetime(2030, 1, 1, 12, 0, 0)
DIALECTS = [postgresql.dialect(), sqlite.dialect(), mysql.dialect(), MariaDBDialect(),
            MSDialect_pymssql(paramstyle="pyformat")]


def test_a_fixed_clock_stands_still_until_moved() -> None:
    clock = FixedClock(MOMENT)
    assert clock.reading() == MOMENT and clock.reading() == MOMENT
    assert clock.advance(1.25) == MOMENT + timedelta(seconds=1.25)
    assert clock.reading() == MOMENT + timedelta(seconds=1.25)
    clock.set(MOMENT)
    assert clock.reading() == MOMENT
    assert DatabaseClock().reading() is None


def test_a_fixed_clock_takes_naive_utc_only() -> None:
    with pytest.raises(ValueError, match="naive UTC"):
        FixedClock(MOMENT.replace(tzinfo=UTC))
    clock = FixedClock(MOMENT)
    with pytest.raises(ValueError, match="naive UTC"):
        clock.set(MOMENT.replace(tzinfo=UTC))
    assert clock.reading() == MOMENT


@pytest.mark.parametrize(("name", "driver"), [
    ("sqlite", SQLiteDriver), ("postgresql", PostgreSQLDriver), ("mysql", MySQLDriver),
    ("mariadb", MySQLDriver), ("mssql", SQLServerDriver),
])
def test_each_database_has_its_driver(name: str, driver: type) -> None:
    assert driver_class(name) is driver
    assert driver.notifies is (name == "postgresql")


def test_an_unknown_database_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"'oracle' database.*mssql, mysql, postgresql"):
        driver_class("oracle")


@pytest.mark.parametrize(("dialect", "expected"), [
    (postgresql.dialect(),
     "COALESCE(%(clock_now)s::TIMESTAMP WITHOUT TIME ZONE, (now() AT TIME ZONE 'UTC'))"),
    (sqlite.dialect(), "COALESCE(?, (strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'))"),
    (mysql.dialect(), "COALESCE(CAST(%s AS DATETIME(6)), UTC_TIMESTAMP(6))"),
    (MariaDBDialect(), "COALESCE(CAST(%s AS DATETIME(6)), UTC_TIMESTAMP(6))"),
    (MSDialect_pymssql(paramstyle="pyformat"),
     "COALESCE(CAST(%(clock_now)s AS DATETIME2(6)), SYSUTCDATETIME())"),
], ids=lambda value: getattr(value, "name", ""))
def test_the_clock_is_a_parameter_with_the_database_clock_behind_it(dialect: Dialect,
                                                                    expected: str) -> None:
    sql = str(select(clock_now(DatabaseClock())).compile(dialect=dialect))
    assert expected in sql


@pytest.mark.parametrize(("dialect", "expected"), [
    (postgresql.dialect(), "+ make_interval(secs => %(param_1)s))"),
    (sqlite.dialect(), ", printf('%+.3f seconds', ?)) || '000')"),
    (mysql.dialect(), " + INTERVAL CAST((%s) * 1000000 AS SIGNED) MICROSECOND)"),
    (MSDialect_pymssql(paramstyle="pyformat"),
     "DATEADD(microsecond, CAST(((%(param_1)s) - FLOOR(%(param_1)s)) * 1000000 AS INT), "
     "DATEADD(second, CAST(FLOOR(%(param_1)s) AS INT), COALESCE(CAST(%(clock_now)s"),
], ids=lambda value: getattr(value, "name", ""))
def test_clock_arithmetic_adds_to_the_clock_not_to_the_database_time(dialect: Dialect,
                                                                     expected: str) -> None:
    sql = str(select(time_plus(clock_now(FixedClock(MOMENT)), 2.5)).compile(dialect=dialect))
    assert expected in sql and sql.count("COALESCE(") == 1, sql


def _shared(statements: Statements) -> list:
    return [statements.items_ready(10), statements.gate_summary,
            *(statements.item_write(new_data=data, delayed=delayed)
              for data in (False, True) for delayed in (False, True))]


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda dialect: dialect.name)
def test_both_clocks_give_the_same_statements(dialect: Dialect) -> None:
    tables = tables_for("sf_")
    database = _shared(Statements(tables, DatabaseClock()))
    fixed = _shared(Statements(tables, FixedClock(MOMENT)))
    for one, other in zip(database, fixed, strict=True):
        assert str(one.compile(dialect=dialect)) == str(other.compile(dialect=dialect))


def test_the_clock_is_read_each_time_a_statement_runs() -> None:
    clock = FixedClock(MOMENT)
    statements = Statements(tables_for(""), clock)
    compiled = select(statements.now).compile(dialect=postgresql.dialect())
    assert compiled.construct_params()["clock_now"] == MOMENT
    clock.advance(30)
    assert compiled.construct_params()["clock_now"] == MOMENT + timedelta(seconds=30)
    database = select(Statements(tables_for(""), DatabaseClock()).now)
    assert database.compile(dialect=postgresql.dialect()).construct_params()["clock_now"] is None


def test_shared_statements_are_built_once() -> None:
    clock = FixedClock(MOMENT)
    statements = Statements(tables_for(""), clock)
    write = statements.item_write(new_data=False, delayed=True)
    summary = statements.gate_summary
    clock.advance(5)
    assert statements.item_write(new_data=False, delayed=True) is write
    assert statements.gate_summary is summary
    assert statements.item_write(new_data=True, delayed=True) is not write


@pytest.mark.parametrize("message, lost", [
    ("consuming input failed: server closed the connection unexpectedly", True),
    ("sending query failed: cannot exit pipeline mode while busy", True),
    ("(2013, 'Lost connection to server during query')", True),
    ('duplicate key value violates unique constraint "items_pkey"', False),
])
def test_a_lost_session_is_told_from_a_refused_statement(message: str, lost: bool) -> None:
    """The client's ConnectionLostError ("retry the call") rests on this: the driver texts
    that mean the session died, including psycopg's rollback after a pipelined batch was
    cut off, and never a statement the server refused."""
    error = OperationalError("INSERT …", {}, Exception(message))
    assert PostgreSQLDriver.session_lost(object.__new__(PostgreSQLDriver), error) is lost
