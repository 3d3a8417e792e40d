"""The direct PostgreSQL path: its failures look like the engine's, and it heals."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import Integer, bindparam, cast, func, select, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DataError, OperationalError

from tests.conftest import POSTGRES_URL, require_postgres
from watcher.dburl import parse_database_url
from watcher.pg_direct import DirectStatements

pytestmark = pytest.mark.postgres

SELECT_ONE = select(cast(bindparam("value"), Integer))


def _direct(url: str, **options) -> DirectStatements:
    return DirectStatements(parse_database_url(url).async_url, postgresql.dialect(), **options)


async def test_an_unreachable_server_fails_as_an_operational_error_without_the_password(
        ) -> None:
    url = make_url("postgresql://statefeed:hunter2-secret@127.0.0.1:9/test")
    direct = DirectStatements(url, postgresql.dialect(), checkout_timeout=0.5)
    started = time.monotonic()
    try:
        with pytest.raises(OperationalError) as caught:
            await direct.fetch(SELECT_ONE, {"value": "1"})
    finally:
        await direct.close()
    assert time.monotonic() - started < 5
    assert "hunter2" not in str(caught.value)


async def test_a_refused_value_is_a_data_error_with_its_parameters_hidden() -> None:
    require_postgres()
    direct = _direct(POSTGRES_URL)
    try:
        with pytest.raises(DataError) as caught:
            await direct.fetch(SELECT_ONE, {"value": "not-a-number-secret"})
        assert "not-a-number-secret" not in str(caught.value).split("[SQL")[1]
        assert await direct.fetch(SELECT_ONE, {"value": "7"}) == [(7,)]
    finally:
        await direct.close()


async def test_a_killed_connection_fails_one_statement_and_the_next_gets_a_new_one() -> None:
    require_postgres()
    direct = _direct(POSTGRES_URL, max_connections=1)
    seen: list[str] = []
    direct.listeners.append(seen.append)
    backend = select(func.pg_backend_pid())
    try:
        ((first,),) = await direct.fetch(backend, {})
        killer = _direct(POSTGRES_URL)
        try:
            await killer.fetch(select(func.pg_terminate_backend(bindparam("pid", type_=Integer))),
                               {"pid": first})
        finally:
            await killer.close()
        with pytest.raises(OperationalError):
            await direct.fetch(backend, {})
        ((second,),) = await direct.fetch(backend, {})
    finally:
        await direct.close()
    assert second != first
    assert len(seen) == 3 and all("pg_backend_pid" in sql for sql in seen)


async def test_plain_writes_return_no_rows() -> None:
    require_postgres()
    direct = _direct(POSTGRES_URL)
    try:
        assert await direct.fetch(text("SET application_name = 'statefeed-test'"), {}) == []
    finally:
        await direct.close()
