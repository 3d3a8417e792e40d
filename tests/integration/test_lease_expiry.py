"""A lease is never trusted past its until while its renewal hangs: the holder's
connection to PostgreSQL or MariaDB stops answering (a TCP proxy stalls it) with a database
timeout longer than the lease, so the renewal write hangs; once the last
renewal's until has passed, the holder drops the lease, abandons its calls and
starts none, while another processor takes the partition over."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import pytest

from tests.acceptance.harness.faults import TcpProxy
from tests.conftest import MARIADB_URL, POSTGRES_URL, require_mariadb, require_postgres
from tests.support.engine import running, wait_until
from watcher import Watcher, WatcherConfig, WorkItem
from watcher.records import NewItem
from watcher.store import Store
from watcher.store.db.migrate import downgrade, upgrade
from watcher.store.db.urls import parse_database_url

LEASE = 2.0


@pytest.mark.parametrize("database", [pytest.param("postgres", marks=pytest.mark.postgres),
                                      pytest.param("mariadb", marks=pytest.mark.mariadb)])
async def test_a_hanging_renewal_does_not_keep_the_lease(
        database: str, caplog: pytest.LogCaptureFixture) -> None:
    if database == "postgres":
        require_postgres()
        db_url, scheme = POSTGRES_URL, "postgresql"
    else:
        require_mariadb()
        db_url, scheme = MARIADB_URL, "mysql"
    prefix = f"le{uuid.uuid4().hex[:8]}_"
    await asyncio.to_thread(upgrade, db_url, prefix)
    address = parse_database_url(db_url).async_url
    direct = Store.open(db_url, prefix)
    started: list[float] = []
    cancelled: list[str] = []
    release = asyncio.Event()

    async def process(item: WorkItem) -> None:
        started.append(time.monotonic())
        try:
            await release.wait()
        except asyncio.CancelledError:
            cancelled.append(item.id)
            raise

    try:
        await direct.partition_create("p", [NewItem(f"i{n}", b"") for n in range(3)])
        async with TcpProxy(address.host or "127.0.0.1", address.port or 5432) as proxy:
            proxy.forward()
            url = address.set(host="127.0.0.1", port=proxy.port, drivername=scheme)
            # A database timeout far longer than the lease: the renewal hangs throughout.
            held = Store.open(url.render_as_string(hide_password=False), prefix, db_timeout=30)
            watcher = Watcher(held, process, WatcherConfig(
                owner_id="holder", poll_interval=0.1, lease_duration=LEASE, concurrency=3))
            caplog.set_level(logging.INFO, logger="watcher.leasing.keeper")
            try:
                async with running(watcher):
                    await wait_until(lambda: len(started) == 3, timeout=15,
                                     message="three calls in flight")
                    lease = watcher.keeper.leases["p"]
                    proxy.stall()
                    stalled_at = time.monotonic()
                    await wait_until(lambda: lease.lost, timeout=3 * LEASE,
                                     message="the holder to drop its expired lease")
                    lost_after = time.monotonic() - stalled_at
                    assert "reason=expired" in caplog.text
                    await wait_until(lambda: len(cancelled) == 3, timeout=5,
                                     message="the calls under the lease abandoned")
                    # The database agrees: the lease is free, and another takes it.
                    taken = await wait_until(
                        lambda: _take(direct), timeout=3 * LEASE, message="a takeover")
                    assert taken == ["p"]
                    taken_at = time.monotonic()
                    assert watcher.keeper.leases == {}
                    assert not [at for at in started if at > stalled_at], \
                        "a call was started after the connection stalled"
                    proxy.forward()
                    release.set()
            finally:
                await held.close()
        assert lost_after < taken_at - stalled_at
    finally:
        await direct.close()
        await asyncio.to_thread(downgrade, db_url, prefix)


async def _take(store: Store) -> list[str]:
    rows = await store.leases_read_free(5)
    return [row.id for row in await store.leases_take(rows, "takeover", 60)] if rows else []
