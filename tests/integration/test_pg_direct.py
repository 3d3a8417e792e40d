"""The direct PostgreSQL path: its failures look like the engine's, and it heals."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy import Integer, bindparam, cast, func, select, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DataError, OperationalError

from tests.conftest import POSTGRES_URL, require_postgres
from watcher.dburl import parse_database_url
from watcher.drivers.pg_direct import DirectStatements

pytestmark = pytest.mark.postgres

SELECT_ONE = select(cast(bindparam("value"), Integer))


def _direct(url: str, **options) -> DirectStatements:
    return DirectStatements(parse_database_url(url).async_url, postgresql.dialect(), **options)


async def test_an_unreachable_server_fails_as_an_operational_error_without_the_password(
        ) -> None:
    url = make_url("postgresql://statefeed:hunter2-secret@127.0.0.1:9/test")
    direct = DirectStatements(url, postgresql.dialect(), timeout=2)
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


async def test_dead_pooled_connections_are_replaced_without_failing_the_statement() -> None:
    require_postgres()
    direct = _direct(POSTGRES_URL, max_connections=2)
    seen: list[str] = []
    direct.listeners.append(seen.append)
    backend = select(func.pg_backend_pid(), func.pg_sleep(0.05))
    try:
        first = await asyncio.gather(direct.fetch(backend, {}), direct.fetch(backend, {}))
        pids = {rows[0][0] for rows in first}
        assert len(pids) == 2, "two connections pooled"
        killer = _direct(POSTGRES_URL)
        try:
            for pid in pids:  # as a server restart would
                await killer.fetch(
                    select(func.pg_terminate_backend(bindparam("pid", type_=Integer))),
                    {"pid": pid})
        finally:
            await killer.close()
        ((after, _),) = await direct.fetch(backend, {})
    finally:
        await direct.close()
    assert after not in pids
    assert len(seen) == 3, "each statement counted once, however often it was sent"


async def test_a_statement_error_keeps_the_connection() -> None:
    require_postgres()
    direct = _direct(POSTGRES_URL, max_connections=1)
    backend = select(func.pg_backend_pid())
    try:
        ((before,),) = await direct.fetch(backend, {})
        with pytest.raises(DataError):
            await direct.fetch(SELECT_ONE, {"value": "x"})
        ((after,),) = await direct.fetch(backend, {})
    finally:
        await direct.close()
    assert after == before


async def test_plain_writes_return_no_rows() -> None:
    require_postgres()
    direct = _direct(POSTGRES_URL)
    try:
        assert await direct.fetch(text("SET application_name = 'statefeed-test'"), {}) == []
    finally:
        await direct.close()
