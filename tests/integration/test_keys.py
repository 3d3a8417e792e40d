"""Concurrency keys on real databases: the items in flight for one key never exceed its
limit across several processors (at start, under steals, after a crash), and keys are
queued fairly: one tenant's single partition starts within a lease cycle, even behind
another tenant's thousands."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable

import pytest

from processor import AsyncClient, NewItem
from tests.support.engine import crash, create_one_item_partitions, running, wait_until
from watcher import Result, Watcher, WatcherConfig, WorkItem
from watcher.errors import InvalidInputError
from watcher.store import Store

FAST = {"poll_interval": 0.05, "lease_duration": 1.5, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2}


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


class PerKey:
    """A processor shared by several watchers: records the most calls it saw running at
    once for each key (the partition id's prefix before the first '-')."""

    def __init__(self, seconds: float = 0.03) -> None:
        self.seconds = seconds
        self.running: dict[str, int] = defaultdict(int)
        self.most: dict[str, int] = defaultdict(int)
        self.calls = 0
        self.started = 0
        self.first_call: dict[str, float] = {}
        # Per partition: how many calls (of any partition) had started before its first.
        self.started_before: dict[str, int] = {}

    async def __call__(self, item: WorkItem) -> Result:
        key = item.partition_id.split("-", 1)[0]
        self.first_call.setdefault(item.partition_id, time.monotonic())
        self.started_before.setdefault(item.partition_id, self.started)
        self.started += 1
        self.running[key] += 1
        self.most[key] = max(self.most[key], self.running[key])
        try:
            await asyncio.sleep(self.seconds)
        finally:
            self.running[key] -= 1
        self.calls += 1
        return Result(done=True)


async def test_a_key_limit_holds_across_processors_and_a_crash(
        client: AsyncClient, make_store: Callable[..., Store]) -> None:
    for n in range(12):
        await client.create_partition(f"a-{n}", [NewItem(f"i{m}", b"{}") for m in range(15)],
                                      key="a")
    await client.set_key_limit("a", 4)
    handler = PerKey()
    watchers = [Watcher(make_store(), handler,
                        WatcherConfig(**FAST, owner_id=f"w{n}", concurrency=8))
                for n in range(3)]
    async with running(*watchers) as tasks:
        await wait_until(lambda: handler.calls >= 60, timeout=30, message="60 calls")
        await crash(tasks[0])  # its grant lapses only at its until
        await wait_until(lambda: handler.calls >= 150, timeout=60, message="150 calls")
        survivors = watchers[1:]
        for n in range(12):
            info = await client.wait(f"a-{n}", timeout=60)
            assert info.status == "complete"
        del survivors
    assert handler.most["a"] <= 4
    assert handler.most["a"] >= 3  # the limit was used, not just respected


async def test_another_key_is_not_held_to_a_keys_limit(
        client: AsyncClient, store: Store) -> None:
    await client.create_partition("a-1", [NewItem(f"i{m}", b"{}") for m in range(20)],
                                  key="a")
    await client.create_partition("b-1", [NewItem(f"i{m}", b"{}") for m in range(8)],
                                  key="b")
    await client.set_key_limit("a", 1)
    handler = PerKey(seconds=0.2)
    async with running(Watcher(store, handler, WatcherConfig(**FAST, concurrency=8))):
        assert (await client.wait("b-1", timeout=30)).status == "complete"
        assert (await client.wait("a-1", timeout=30)).status == "complete"
    assert handler.most["a"] == 1
    assert handler.most["b"] >= 5  # the seven slots a could not use


async def test_a_default_limit_per_key_applies_to_every_key(
        client: AsyncClient, make_store: Callable[..., Store]) -> None:
    for key in ("x", "y"):
        await client.create_partition(f"{key}-1", [NewItem(f"i{m}", b"{}") for m in range(40)],
                                      key=key)
    handler = PerKey()
    watchers = [Watcher(make_store(), handler,
                        WatcherConfig(**FAST, owner_id=f"w{n}", concurrency=16,
                                      max_inflight_per_key=2)) for n in range(2)]
    async with running(*watchers):
        for key in ("x", "y"):
            assert (await client.wait(f"{key}-1", timeout=60)).status == "complete"
    assert handler.most["x"] <= 2 and handler.most["y"] <= 2


async def test_one_tenants_partition_starts_within_a_lease_cycle_behind_anothers_thousands(
        client: AsyncClient, make_store: Callable[..., Store]) -> None:
    await create_one_item_partitions(client.store, [f"a-{n:04}" for n in range(2000)],
                                     client_settings(key="a"))
    handler = PerKey(seconds=0.2)
    config = {**FAST, "concurrency": 4, "max_leases": 50}
    watchers = [Watcher(make_store(), handler, WatcherConfig(**config, owner_id=f"w{n}"))
                for n in range(3)]
    async with running(*watchers):
        await wait_until(lambda: handler.calls >= 10, timeout=30, message="a's work running")
        inserted = time.monotonic()
        started_at_insert = handler.started
        await client.create_partition("b-1", [NewItem("i", b"{}")], key="b")
        await wait_until(lambda: "b-1" in handler.first_call, timeout=60,
                         message="b's first call")
    waited = handler.first_call["b-1"] - inserted
    ahead = handler.started_before["b-1"] - started_at_insert
    print(f"b-1's first call after {waited:.2f} s, behind {ahead} of a's calls")
    # Counted in a's calls, not in seconds (a loaded machine slows both alike): b-1
    # starts within about one lease cycle, in which every processor renews and scans, so
    # behind at most the calls a's slots make in a lease duration (12 slots, 0.2 s each:
    # 90), with a loaded machine's margin of 3. Without fair queuing it would wait
    # behind the rest of a's 2,000 calls. Its time on a quiet machine, 0.4-0.9 s, is a
    # measurement, not asserted.
    slots = config["concurrency"] * len(watchers)
    assert ahead <= 3 * slots * FAST["lease_duration"] / handler.seconds, (ahead, waited)


async def test_a_new_keys_limit_is_read_when_its_partition_is_leased_not_at_a_renewal(
        client: AsyncClient, store: Store) -> None:
    """A key's pool lets nothing by until its limit is known; a partition of a key the
    processor has not seen, leased while the processor's slots are busy with another
    key's calls, has its limit read at once, not at the next renewal (every 10 s
    here), which would hold its first call back that long."""
    await client.set_key_limit("k", 2, define=True)
    await client.create_partition("a-1", [NewItem(f"i{m}", b"{}") for m in range(200)],
                                  key="a")
    handler = PerKey(seconds=0.2)
    config = WatcherConfig(**{**FAST, "lease_duration": 30.0}, concurrency=4)
    async with running(Watcher(store, handler, config)):
        await wait_until(lambda: handler.running["a"] == 4, timeout=30,
                         message="every slot busy with a's calls")
        inserted = time.monotonic()
        await client.create_partition("k-1", [NewItem(f"i{m}", b"{}") for m in range(4)],
                                      key="k")
        await wait_until(lambda: "k-1" in handler.first_call, timeout=30,
                         message="k's first call")
        assert (await client.wait("k-1", timeout=30)).status == "complete"
    waited = handler.first_call["k-1"] - inserted
    assert waited < config.renew_interval / 2, waited
    assert handler.most["k"] <= 2


def client_settings(**kwargs: object):  # the client's check, for a fast bulk insert
    from processor.client.checks import check_settings

    return check_settings("p", (), "fail", 0, kwargs.get("key"))


@pytest.mark.parametrize(("limit", "words"), [(0, "at least 1"), (-2, "at least 1"),
                                               (2.5, "whole number"), ("4", "whole number")])
async def test_a_bad_key_limit_is_refused(client: AsyncClient, limit: object,
                                          words: str) -> None:
    with pytest.raises(InvalidInputError, match=words):
        await client.set_key_limit("a", limit)  # type: ignore[arg-type]
    assert await client.flow_controls() == []


async def test_a_bad_key_is_refused(client: AsyncClient) -> None:
    for key in ("", "x" * 300, 7):
        with pytest.raises(InvalidInputError, match="key"):
            await client.create_partition("p", [NewItem("i", b"{}")],
                                          key=key)  # type: ignore[arg-type]
