"""A processor that joins a busy fleet gets its share by hand-over, not by steal: the
holder starts no new call on the partitions it hands over, writes what is in flight
and releases them, so no item is called twice (two real watchers, a real uvicorn
handler counting calls per item, on every database)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

from sqlalchemy.exc import OperationalError

import handlers
from processor import AsyncClient, NewItem
from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from tests.support.engine import running, wait_until
from tests.support.servers import serve_app
from watcher import Watcher, WatcherConfig
from watcher.hooks import CountingHooks
from watcher.records import LeaseStats
from watcher.rules.balance import hand_over_count, with_askers

PARTITIONS, ITEMS = 6, 60
# The leases: a hand-over moves partitions at the first's balancing (every third of a
# lease); a lease long enough that a loaded machine's stall (3 s once did it) cannot let
# one expire, which would call its items in flight again: an expiry, not a hand-over.
LEASE = 9.0
# Each call's time, scaled with the lease: the work (6 x 60 calls on 6 slots) outlasts
# the first balancing cycles (a third of a lease each) that hand the second its share.
CALL_SECONDS = LEASE / 60


def test_every_holder_above_the_share_hands_over_its_excess() -> None:
    stats = LeaseStats(active=12, owners={"a": 8, "b": 4})
    assert with_askers(stats, ["c"]).owners == {"a": 8, "b": 4, "c": 0}
    # The share with c counted: 4. a holds 4 above it, 2 a cycle; b none.
    assert hand_over_count("a", stats, ["c"], handing=0, max_steal=2) == 2
    assert hand_over_count("b", stats, ["c"], handing=0, max_steal=2) == 0
    assert hand_over_count("a", stats, ["c"], handing=2, max_steal=2) == 2
    assert hand_over_count("a", stats, ["c"], handing=4, max_steal=2) == 0
    # Three at 10, a fourth asks: the share is 8, and each hands over 2 at once.
    even = LeaseStats(active=30, owners={"a": 10, "b": 10, "c": 10})
    assert [hand_over_count(me, even, ["d"], handing=0, max_steal=3)
            for me in "abc"] == [2, 2, 2]
    # Nobody else asks, or a partition is free (the asker takes that instead).
    assert hand_over_count("a", stats, [], handing=0, max_steal=2) == 0
    assert hand_over_count("a", stats, ["a"], handing=0, max_steal=2) == 0
    assert hand_over_count("a", LeaseStats(13, {"a": 8, "b": 4}), ["c"], handing=0,
                           max_steal=2) == 0


async def test_a_joining_processor_gets_its_share_and_no_item_is_called_twice(
        db_url: str, table_prefix: str, make_store: Callable[..., Any]) -> None:
    calls: Counter[tuple[str, str]] = Counter()

    async def step(item: handlers.Item) -> handlers.Result:
        calls[(item.partition_id, item.id)] += 1
        await asyncio.sleep(CALL_SECONDS)
        return handlers.Result(done=True)

    async with AsyncClient(db_url, table_prefix) as client:
        for p in range(PARTITIONS):
            await client.create_partition(
                f"p{p}", [NewItem(f"i{n:03}", b"{}") for n in range(ITEMS)])
        async with serve_app(handlers.app(step)) as url:
            processors = [HttpProcessor(HttpProcessorConfig(handler_url=url + "/"))
                          for _ in range(2)]
            hooks = [CountingHooks(), CountingHooks()]
            watchers = [Watcher(make_store(), processors[n], WatcherConfig(
                owner_id=name, concurrency=6, poll_interval=0.05, lease_duration=LEASE,
                steal_batch=2), hooks[n]) for n, name in enumerate(["first", "second"])]
            try:
                async with running(watchers[0]):
                    await wait_until(lambda: len(watchers[0].partitions) == PARTITIONS,
                                     message="the first holds every partition")
                    await wait_until(lambda: sum(calls.values()) >= 20, message="calls run")
                    async with running(watchers[1]):
                        await wait_until(lambda: len(watchers[1].partitions) >= 2,
                                         timeout=LEASE * 6, message="the second's share")
                        for p in range(PARTITIONS):
                            info = await client.wait(f"p{p}", timeout=60)
                            assert info.status == "complete"
            finally:
                for processor in processors:
                    await processor.aclose()
    assert hooks[0].counts["lease_handed_over"] >= 2
    assert hooks[1].counts["lease_stolen"] == 0
    assert len(calls) == PARTITIONS * ITEMS
    twice = {key: count for key, count in calls.items() if count > 1}
    assert not twice, f"called more than once: {twice}"


async def test_a_hand_over_whose_release_fails_keeps_the_partition_moving(
        db_url: str, table_prefix: str, make_store: Callable[..., Any]) -> None:
    """The holder drains a partition to hand it over, and the database fails the release
    (its session was ended): the holder still holds the lease and renews it, so it must
    dispatch it again, not hold it idle for good."""
    failed: list[str] = []  # the partitions whose release failed

    async def step(item: handlers.Item) -> handlers.Result:
        await asyncio.sleep(0.01 if failed else 0.1)  # slow, so the hand-over comes first
        return handlers.Result(done=True)

    holder_store = make_store()
    release = holder_store.leases_release

    async def release_failing_once(leases: dict[str, int], *args: Any, **kwargs: Any) -> int:
        if not failed:
            failed.extend(leases)
            raise OperationalError("UPDATE leases", None,
                                   Exception("terminating connection due to administrator command"))
        return await release(leases, *args, **kwargs)

    holder_store.leases_release = release_failing_once  # type: ignore[method-assign]
    async with AsyncClient(db_url, table_prefix) as client:
        for p in range(4):
            await client.create_partition(
                f"p{p}", [NewItem(f"i{n:03}", b"{}") for n in range(40)])
        async with serve_app(handlers.app(step)) as url:
            processors = [HttpProcessor(HttpProcessorConfig(handler_url=url + "/"))
                          for _ in range(2)]
            watchers = [Watcher(store, processors[n], WatcherConfig(
                owner_id=name, concurrency=4, poll_interval=0.05, lease_duration=3.0,
                steal_batch=2), CountingHooks())
                for n, (name, store) in enumerate([("first", holder_store),
                                                   ("second", make_store())])]
            try:
                async with running(watchers[0]):
                    await wait_until(lambda: len(watchers[0].partitions) == 4,
                                     message="the first holds every partition")
                    async with running(watchers[1]):
                        await wait_until(lambda: bool(failed), timeout=20,
                                         message="a hand-over's release to fail")
                        for p in range(4):
                            info = await client.wait(f"p{p}", timeout=30)
                            assert info.status == "complete", (p, info.status)
            finally:
                for processor in processors:
                    await processor.aclose()
