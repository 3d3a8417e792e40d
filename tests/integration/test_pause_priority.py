"""Pause, resume and priority on real databases: a paused partition starts no new call
within a poll, writes what was in flight, lets its lease go and stays paused through a
restart; the lease queue takes higher priority first, and a lower one within the
stated bound."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta

import pytest

from processor import AsyncClient, NewItem
from tests.support.engine import count_calls, running, wait_until
from watcher import Result, Watcher, WatcherConfig, WorkItem
from watcher.errors import InvalidInputError, PartitionNotFoundError
from watcher.records import PartitionSettings
from watcher.rules.priority import AGING_STEP, starvation_bound
from watcher.store import Store
from watcher.store.db.clock import FixedClock

FAST = {"poll_interval": 0.05, "lease_duration": 3.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2}


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


class Slow:
    """Answers each item done after ``seconds``, counting calls started and finished."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started: Counter[str] = Counter()
        self.finished: Counter[str] = Counter()

    async def __call__(self, item: WorkItem) -> Result:
        self.started[item.id] += 1
        await asyncio.sleep(self.seconds)
        self.finished[item.id] += 1
        return Result(done=True)


async def test_a_pause_stops_new_calls_writes_those_in_flight_and_lets_the_lease_go(
        client: AsyncClient, store: Store) -> None:
    await client.create_partition("p", [NewItem(f"i{n:03}", b"{}") for n in range(200)])
    slow = Slow(0.1)
    # A lease far longer than the test: "each item called once" holds while the lease
    # is kept. A stall of the machine longer than a lease (3 s in FAST) lets the lease
    # expire, and the calls then in flight run again under the next one (at least once).
    config = WatcherConfig(**{**FAST, "lease_duration": 30.0}, concurrency=4)
    async with running(Watcher(store, slow, config)):
        await wait_until(lambda: sum(slow.finished.values()) >= 8, message="some calls")
        assert await client.pause("p") is True
        assert await client.pause("p") is False  # paused already
        paused_at = sum(slow.started.values())

        async def let_go() -> bool:
            return (await client.partition("p")).owner == ""
        await wait_until(let_go, message="the paused partition's lease to be let go")
        # At most the calls in flight plus one read's worth started after the pause.
        started = sum(slow.started.values())
        assert started <= paused_at + config.concurrency
        scans = count_calls(store, "leases_read_free")
        await wait_until(lambda: scans["leases_read_free"] >= 3, message="three lease scans")
        assert sum(slow.started.values()) == started  # nothing more while paused
        info = await client.partition("p")
        assert info.paused_at is not None and info.status == "available"
        # Every call that started was written: none is left in flight or lost.
        assert slow.finished == slow.started
        assert info.counts.get("complete", 0) == sum(slow.finished.values())
        assert await client.resume("p") is True
        done = await client.wait("p", timeout=30)
    assert done.status == "complete" and done.counts == {"complete": 200}
    assert set(slow.started.values()) == {1}  # each item called once, pause or not


async def test_a_pause_outlives_every_processor_and_resume_lifts_it(
        client: AsyncClient, make_store: Callable[..., Store]) -> None:
    await client.create_partition("held", [NewItem("a", b"{}")])
    await client.pause("held")
    slow = Slow(0.0)
    for _ in range(2):  # a processor, then its replacement after a restart
        store = make_store()
        scans = count_calls(store, "leases_read_free")
        async with running(Watcher(store, slow, WatcherConfig(**FAST))):
            await wait_until(lambda scans=scans: scans["leases_read_free"] >= 3,
                             message="three lease scans")
        assert not slow.started
    store = make_store()
    async with running(Watcher(store, slow, WatcherConfig(**FAST))):
        assert await client.resume("held") is True
        info = await client.wait("held", timeout=15)
    assert info.status == "complete" and info.paused_at is None


async def test_pause_and_resume_name_a_missing_partition(client: AsyncClient) -> None:
    for verb in (client.pause, client.resume):
        with pytest.raises(PartitionNotFoundError):
            await verb("nope")


async def test_a_paused_reduce_gate_calls_no_reduce_until_resumed(
        client: AsyncClient, store: Store) -> None:
    from watcher.protocol import ReduceCall, ReduceResult

    reduces: list[str] = []

    class Reducing:
        async def process(self, item: WorkItem) -> Result:
            return Result(gate=1)

        async def reduce(self, call: ReduceCall) -> ReduceResult:
            reduces.append(call.partition_id)
            return ReduceResult(result=b"{}")

    await client.create_partition("r", [NewItem("a", b"{}", gate=1)], reduce_gates=[1])
    await client.pause("r")
    scans = count_calls(store, "leases_read_free")
    async with running(Watcher(store, Reducing(), WatcherConfig(**FAST))):
        await wait_until(lambda: scans["leases_read_free"] >= 3, message="three lease scans")
        assert reduces == [] and (await client.partition("r")).gate == 1
        await client.resume("r")
        info = await client.wait("r", timeout=15)
    assert info.status == "complete" and reduces == ["r"]


# -- priority ----------------------------------------------------------------------

T0 = datetime(2026, 11, 26, 12, 0, 0)


async def queue_order(store: Store) -> list[str]:
    return [row.id for row in await store.leases_read_free(100)]


async def test_higher_priority_is_leased_first(make_store: Callable[..., Store]) -> None:
    clock = FixedClock(T0)
    store = make_store(clock=clock)
    await store.partition_create("low", [NewItem("a", b"{}")], PartitionSettings(priority=-3))
    clock.advance(1)
    await store.partition_create("plain", [NewItem("a", b"{}")])
    clock.advance(1)
    await store.partition_create("high", [NewItem("a", b"{}")], PartitionSettings(priority=5))
    assert await queue_order(store) == ["high", "plain", "low"]


@pytest.mark.parametrize(("later", "first"), [
    (starvation_bound(0, 10) - timedelta(seconds=1), "high"),
    (starvation_bound(0, 10) + timedelta(seconds=1), "low"),
])
async def test_a_low_priority_waits_at_most_the_stated_bound(
        make_store: Callable[..., Store], later: timedelta, first: str) -> None:
    """A priority-0 partition is passed over by priority-10 work that arrives up to
    10 aging steps after it, and by none that arrives later."""
    assert starvation_bound(0, 10) == 10 * AGING_STEP == timedelta(minutes=5)
    clock = FixedClock(T0)
    store = make_store(clock=clock)
    await store.partition_create("low", [NewItem("a", b"{}")])
    clock.advance(later.total_seconds())
    await store.partition_create("high", [NewItem("a", b"{}")],
                                 PartitionSettings(priority=10))
    assert (await queue_order(store))[0] == first


async def test_under_continuous_high_priority_load_a_low_one_starts_within_the_bound(
        make_store: Callable[..., Store]) -> None:
    """High-priority partitions keep arriving (one a second) and one is leased a
    second: the priority-0 partition's turn comes once its rank is the oldest, within
    the bound."""
    clock = FixedClock(T0)
    store = make_store(clock=clock)
    await store.partition_create("low", [NewItem("a", b"{}")])
    waited = 0
    while True:
        clock.advance(1)
        waited += 1
        await store.partition_create(f"high-{waited}", [NewItem("a", b"{}")],
                                     PartitionSettings(priority=10))
        [row] = await store.leases_read_free(1)
        await store.leases_take([row], "busy", 3600.0)
        if row.id == "low":
            break
        assert waited <= starvation_bound(0, 10).total_seconds() + 1
    assert waited >= starvation_bound(0, 10).total_seconds() / 2  # priority did count


@pytest.mark.parametrize("priority", [11, -11, 1.5, "high", True])
async def test_a_priority_out_of_range_is_refused_and_nothing_is_written(
        client: AsyncClient, priority: object) -> None:
    with pytest.raises(InvalidInputError, match="priority"):
        await client.create_partition("p", [NewItem("a", b"{}")],
                                      priority=priority)  # type: ignore[arg-type]
    with pytest.raises(PartitionNotFoundError):
        await client.partition("p")
