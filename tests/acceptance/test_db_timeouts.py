"""``processor run`` when the database stops answering: a TCP proxy between the
processor and PostgreSQL or MariaDB stops forwarding (connections stay open, no
byte moves: a half-open connection, a failover behind a pooler). The processor
logs the timeout, /readyz answers 503 within the bound, and once the proxy
forwards again it recovers on its own, every item exactly right. And SQLite: a
database file deleted under a running processor turns /readyz to 503 with an
ERROR line naming the file.
"""

from __future__ import annotations

import random
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from sqlalchemy import text

from tests.acceptance.harness.cluster import Cluster
from tests.acceptance.harness.faults import TcpProxy
from tests.acceptance.harness.handler import RecordingHandler
from tests.acceptance.test_guarantees import assert_exact
from tests.conftest import MARIADB_URL, POSTGRES_URL, require_mariadb, require_postgres
from tests.support.engine import wait_until
from watcher.store.db.urls import parse_database_url

DB_TIMEOUT = 1.0


def _through(url: str, port: int) -> str:
    parsed = parse_database_url(url).async_url.set(host="127.0.0.1", port=port)
    return parsed.set(drivername=urlsplit(url).scheme).render_as_string(hide_password=False)


async def _ready_status(proc) -> int | None:
    answer = await proc.answer("/readyz")
    return None if answer is None else answer.status_code


def _readiness_is(proc, status: int):
    async def check() -> bool:
        return await _ready_status(proc) == status
    return check


@pytest.mark.parametrize("database", [pytest.param("postgres", marks=pytest.mark.postgres),
                                      pytest.param("mariadb", marks=pytest.mark.mariadb)])
async def test_a_database_that_stops_answering_is_reported_and_survived(
        tmp_path, database: str) -> None:
    if database == "postgres":
        require_postgres()
        url = POSTGRES_URL
    else:
        require_mariadb()
        url = MARIADB_URL
    address = parse_database_url(url).async_url
    delays = random.Random(3)
    handler = RecordingHandler(gates=2, passes=2, seed=3,
                               delay=lambda call: delays.uniform(0.02, 0.1))
    async with (Cluster(tmp_path, handler, db_url=url) as cluster,
                TcpProxy(address.host or "127.0.0.1", address.port or 0) as proxy):
        proxy.forward()
        layout = await cluster.create(4, 6)
        proc = await cluster.start(None, "--db-timeout", str(DB_TIMEOUT), health=True,
                                   db_url=_through(url, proxy.port))
        await proc.wait_log("action=watcher_started")
        await wait_until(lambda: len(handler.calls) >= 10, timeout=30, message="ten calls")
        assert await _ready_status(proc) == 200
        proxy.stall()
        line = await proc.wait_log("action=database_timeout", timeout=15)
        assert " WARNING " in line and f"127.0.0.1:{proxy.port}" in line
        ready = await wait_until(_readiness_is(proc, 503), timeout=15,
                                 message="/readyz to answer 503")
        assert ready
        detail = (await proc.get("/readyz")).json()["checks"]["database"]["detail"]
        assert "timed out" in detail or "no answer" in detail, detail
        proxy.forward()
        await wait_until(_readiness_is(proc, 200), timeout=30,
                         message="/readyz to answer 200 again")
        await cluster.wait_settled(layout, timeout=60)
        assert_exact(cluster, handler, await cluster.items(layout), layout)
        assert proc.running
        log = proc.stderr()
    assert "Traceback" not in log
    assert log.count("action=database_timeout ") <= 3, log  # once per outage, not per poll


@pytest.mark.parametrize("database", [pytest.param("postgres", marks=pytest.mark.postgres),
                                      pytest.param("mariadb", marks=pytest.mark.mariadb)])
async def test_a_result_write_waiting_on_a_row_lock_is_reported_and_survived(
        tmp_path, database: str) -> None:
    """Another session holds one item's row locked: the result write waits on it until
    the server's statement (or lock wait) timeout ends it, over and over; /readyz says
    so meanwhile, and once the lock goes every item ends exactly right."""
    if database == "postgres":
        require_postgres()
        url = POSTGRES_URL
    else:
        require_mariadb()
        url = MARIADB_URL
    handler = RecordingHandler(gates=1, passes=1)
    async with Cluster(tmp_path, handler, db_url=url) as cluster:
        layout = await cluster.create(2, 3)
        async with cluster.db.engine.connect() as holder:
            transaction = await holder.begin()
            await holder.execute(text(
                f"SELECT id FROM {cluster.prefix}items WHERE partition_id = 'part000' "
                "AND id = 'item0' FOR UPDATE"))
            proc = await cluster.start(None, "--db-timeout", str(DB_TIMEOUT), health=True,
                                       db_url=url)
            line = await proc.wait_log("action=database_timeout", timeout=30)
            assert "what=items_apply" in line
            assert await wait_until(_readiness_is(proc, 503), timeout=15,
                                    message="/readyz to answer 503")
            await transaction.rollback()
        await wait_until(_readiness_is(proc, 200), timeout=30,
                         message="/readyz to answer 200 again")
        await cluster.wait_settled(layout, timeout=60)
        assert_exact(cluster, handler, await cluster.items(layout), layout)
        assert "Traceback" not in proc.stderr()


async def test_a_deleted_sqlite_file_turns_readiness_off(tmp_path: Path) -> None:
    path = tmp_path / "statefeed.db"
    url = f"sqlite:///{path}"
    handler = RecordingHandler(gates=1, passes=1)
    async with Cluster(tmp_path, handler, db_url=url) as cluster:
        layout = await cluster.create(2, 3)
        proc = await cluster.start(None, health=True, db_url=url)
        await cluster.wait_settled(layout, timeout=30)
        assert await _ready_status(proc) == 200
        path.unlink()
        line = await proc.wait_log("action=database_file_lost", timeout=15)
        assert " ERROR " in line and str(path) in line
        assert await wait_until(_readiness_is(proc, 503), timeout=10,
                                message="/readyz to answer 503")
        detail = (await proc.get("/readyz")).json()["checks"]["database"]["detail"]
        assert str(path) in detail and "deleted" in detail
        assert proc.running
        assert proc.stderr().count("action=database_file_lost") == 1


def test_a_database_timeout_that_is_not_positive_is_refused_in_one_line(tmp_path: Path) -> None:
    from tests.acceptance.harness.processes import run_cli

    for args, env in ((["--db-timeout", "0"], None), ([], {"PROCESSOR_DB_TIMEOUT": "-1"})):
        done = run_cli("run", "--handler-url", "http://127.0.0.1:9/", "--health-port", "0",
                       "--db-url", f"sqlite:///{tmp_path / 'x.db'}", *args, env=env)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "--db-timeout" in lines[0], done.stderr
