"""The processors' default notify URL on real databases and real receivers (uvicorn on
loopback): a partition that names no URL has its end sent to the default, one that
names its own to its own; the engine's ends (complete, failed) and a cancel through a
client given the default alike; without a default nothing is written for it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from processor import AsyncClient, NewItem
from processor.notify.deliverer import Deliverer
from processor.notify.policy import NotifyConfig
from tests.support.engine import running, wait_until
from tests.support.receiver import Receiver
from tests.support.servers import serve_app
from watcher import Result, Watcher, WatcherConfig, WorkItem
from watcher.errors import InvalidInputError
from watcher.protocol import NonRetryableError
from watcher.store import Store

SECRET = b"whsec-default-0123456789abcdef"
FAST = {"poll_interval": 0.05, "lease_duration": 3.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2}
QUICK = {"secret": SECRET, "allow_private": True, "timeout": 2.0, "backoff": 0.01,
         "backoff_cap": 0.05, "interval": 0.05}


@pytest.fixture
async def receivers() -> AsyncIterator[tuple[Receiver, str, Receiver, str]]:
    default, own = Receiver(SECRET), Receiver(SECRET)
    async with serve_app(default) as default_base, serve_app(own) as own_base:
        yield default, default_base + "/default?key=s3cr3t", own, own_base + "/own"


async def process(item: WorkItem) -> Result:
    if item.id == "bad":
        raise NonRetryableError("cannot read it")
    return Result(done=True)


async def deliver_all(store: Store, count: int) -> None:
    deliverer = Deliverer(store, "d1", NotifyConfig(**QUICK))

    async def delivered() -> bool:
        await deliverer.run_once()
        return len(await store.notifications_list(limit=100, state="delivered")) >= count

    try:
        await wait_until(delivered, timeout=20, interval=0.02,
                         message=f"{count} events delivered")
    finally:
        await deliverer.close()


async def test_ends_without_a_url_go_to_the_default(
        db_url: str, table_prefix: str, store: Store,
        receivers: tuple[Receiver, str, Receiver, str]) -> None:
    default, default_url, own, own_url = receivers
    async with AsyncClient(db_url, table_prefix, notify_default=default_url) as client:
        await client.create_partition("plain", [NewItem("a", b"1")])
        await client.create_partition("broken", [NewItem("bad", b"")])
        await client.create_partition("mine", [NewItem("a", b"1")], notify=own_url)
        await client.create_partition("stopped", [NewItem("x", b"", gate=5)], start_at=None)
        assert await client.cancel("stopped") is True
        config = WatcherConfig(owner_id="w", notify_default=default_url, **FAST)
        async with running(Watcher(store, process, config)):
            for pid in ("plain", "broken", "mine"):
                await client.wait(pid, timeout=20)
    rows = await store.notifications_list(limit=100)
    assert sorted((row.partition_id, row.status, row.target) for row in rows) == [
        ("broken", "failed", default_url), ("mine", "complete", own_url),
        ("plain", "complete", default_url), ("stopped", "cancelled", default_url)]
    await deliver_all(store, 4)
    assert sorted(one.event["partition_id"] for one in default.received) == [
        "broken", "plain", "stopped"]
    assert [one.event["partition_id"] for one in own.received] == ["mine"]
    assert all(one.signed for one in default.received + own.received)
    by_id = {one.event["partition_id"]: one.event for one in default.received}
    assert by_id["broken"]["status"] == "failed" and "cannot read it" in \
        by_id["broken"]["last_error"]


async def test_without_a_default_nothing_is_written(
        db_url: str, table_prefix: str, store: Store,
        receivers: tuple[Receiver, str, Receiver, str]) -> None:
    _, _, _, own_url = receivers
    async with AsyncClient(db_url, table_prefix) as client:
        await client.create_partition("plain", [NewItem("a", b"1")])
        await client.create_partition("mine", [NewItem("a", b"1")], notify=own_url)
        await client.create_partition("stopped", [NewItem("x", b"", gate=5)], start_at=None)
        await client.cancel("stopped")
        async with running(Watcher(store, process, WatcherConfig(owner_id="w", **FAST))):
            await client.wait("plain", timeout=20)
            await client.wait("mine", timeout=20)
    rows = await store.notifications_list(limit=100)
    assert [(row.partition_id, row.target) for row in rows] == [("mine", own_url)]


async def test_a_bad_default_is_refused(db_url: str, table_prefix: str) -> None:
    with pytest.raises(InvalidInputError, match="notify_default must be an http:// or "
                       "https:// URL, got scheme 'ftp'"):
        AsyncClient(db_url, table_prefix, notify_default="ftp://example.com/x")
