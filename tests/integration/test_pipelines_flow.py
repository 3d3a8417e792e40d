"""Flow controls across the pipelines of one fleet, on real databases with real uvicorn
services: a ``Retry-After`` from one service holds only that service's calls, a key's
limit counts the calls of every pipeline, and a pause of a key or of the fleet holds
every pipeline's partitions.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import handlers
from processor import AsyncClient, NewItem
from tests.support.engine import count_calls, running, wait_until
from tests.support.pipelines import (
    FAST,
    Service,
    answered_by,
    every_gate,
    routes_of,
    serving,
    watcher_for,
)
from watcher.store import Store

HOLD = 3  # seconds of Retry-After
# Calls already on the wire when the 429 came back may land this long after it.
ON_THE_WIRE = 1.0


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


@pytest.fixture
async def services() -> AsyncIterator[Callable[..., Any]]:
    async with serving() as start:
        yield start


def items(count: int) -> list[NewItem]:
    return [NewItem(f"i{n}", b"{}") for n in range(count)]


async def test_a_retry_after_from_one_service_holds_only_its_calls(
        client: AsyncClient, make_store: Callable[..., Store],
        services: Callable[..., Any]) -> None:
    urls = await services("ocr", "rank")
    ocr, rank = urls["ocr"][0], urls["rank"][0]
    ocr.retry_after = HOLD  # every call answered 429, Retry-After: 3, until it is lifted
    for n in range(2):
        await client.create_partition(f"o{n}", items(5), pipeline="ocr")
    routes = routes_of(every_gate(ocr="ocr", rank="rank"), urls)
    watcher, http = watcher_for(make_store(), routes, max_retries=0)
    ocr_name, rank_name = http.service_of("ocr", None, 0), http.service_of("rank", None, 0)
    pools = watcher.flow.rates.services
    try:
        async with running(watcher):
            await wait_until(lambda: ocr_name in pools and pools[ocr_name].blocked_until,
                             timeout=30, message="the ocr service's Retry-After hold")
            # Every call of the rank partitions is made while ocr answers Retry-After.
            for n in range(2):
                await client.create_partition(f"r{n}", items(5), pipeline="rank")
            for n in range(2):
                assert (await client.wait(f"r{n}", timeout=30)).status == "complete"
            # The hold told to the fleet is ocr's alone; rank's pool was never held, and
            # no outage hold began: a 429 is an answer.
            controls = await wait_until(lambda: client.flow_controls("handler"), timeout=30,
                                        message="the hold stored for the fleet")
            assert [control.name for control in controls] == [ocr_name]
            assert not pools[rank_name].blocked_until
            assert not any(hold.held for hold in watcher.flow.holds.values())
            ocr.retry_after = None
            for n in range(2):  # max_retries=0: a held call spent no attempt
                assert (await client.wait(f"o{n}", timeout=30)).status == "complete"
    finally:
        await http.aclose()
    first = ocr.throttled[0]
    early = [at - first for at in ocr.arrivals if first + ON_THE_WIRE < at < first + HOLD - 0.05]
    assert early == [], f"ocr was called {early} s after its first 429 (Retry-After: {HOLD})"
    windows = [(at, at + HOLD) for at in ocr.throttled]
    during = [at for at in rank.arrivals if any(start < at < end for start, end in windows)]
    assert during, "no call of rank was made while ocr's calls were held"
    assert rank.partitions() == {"r0", "r1"} and ocr.partitions() == {"o0", "o1"}
    for n in range(2):
        assert await answered_by(client, f"o{n}") == {("0", "ocr"), ("1", "ocr")}
        assert await answered_by(client, f"r{n}") == {("0", "rank"), ("1", "rank")}


class Stamped(Service):
    """A service that notes when each item call it answers starts, with its partition."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.answered: list[tuple[float, str]] = []

    async def work(self, item: handlers.Item) -> handlers.Result:
        self.answered.append((time.monotonic(), item.partition_id))
        return await super().work(item)


LONG_HOLD = 6  # seconds of Retry-After
# How much sooner than the stored hold a processor's own copy of it may end: it is read
# as "seconds left" by the database clock, a round trip late on a busy machine.
READ_LATE = 1.5


async def test_a_processor_that_never_called_a_service_honours_its_hold_from_its_first_call(
        client: AsyncClient, make_store: Callable[..., Store]) -> None:
    # Three processors share one service through three pipelines: A meets its 429; B
    # (running, but not yet calling it) and C (started during the hold) call it only
    # after the hold. A long poll keeps their periodic reads of holds from hiding the
    # fault: a pool made at the first call must read its service's hold before it lets
    # that call by.
    async with serving(Stamped) as start:
        urls = await start("ocr")
        ocr = urls["ocr"][0]
        assert isinstance(ocr, Stamped)
        ocr.retry_after = LONG_HOLD
        await client.create_partition("a", items(3), pipeline="one")
        first, first_http = watcher_for(make_store(), routes_of(every_gate(one="ocr"), urls),
                                        max_retries=0)
        second, second_http = watcher_for(make_store(),
                                          routes_of(every_gate(two="ocr"), urls),
                                          max_retries=0, poll_interval=1.0,
                                        lease_duration=4.0)
        third, third_http = watcher_for(make_store(),
                                        routes_of(every_gate(three="ocr"), urls),
                                        max_retries=0, poll_interval=1.0,
                                        lease_duration=4.0)
        name = first_http.service_of("one", None, 0)
        try:
            async with running(first, second):
                await wait_until(lambda: client.flow_controls("handler"), timeout=30,
                                 message="the hold stored for the fleet")
                ocr.retry_after = None  # a call made during the hold is answered, and seen
                assert ocr.throttled and not ocr.answered
                await client.create_partition("b", items(3), pipeline="two")
                await client.create_partition("c", items(3), pipeline="three")
                async with running(third):
                    for partition in ("a", "b", "c"):
                        assert (await client.wait(partition, timeout=60)).status == "complete"
        finally:
            for http in (first_http, second_http, third_http):
                await http.aclose()
    assert [control.name for control in await client.flow_controls("handler")] == [name]
    held_from = ocr.throttled[0]
    early = [(partition, round(at - held_from, 2)) for at, partition in ocr.answered
             if at < held_from + LONG_HOLD - READ_LATE]
    assert early == [], (f"calls made during the {LONG_HOLD} s hold that began at the "
                         f"first 429 (partition, seconds after it): {early}")
    assert {partition for _, partition in ocr.answered} == {"a", "b", "c"}


class InFlight:
    """The calls running at once across services, and the most there ever were."""

    def __init__(self) -> None:
        self.running = 0
        self.most = 0
        self.finished = 0


class Slow(Service):
    """A service whose every call takes ``seconds``, counted in ``shared``."""

    def __init__(self, name: str, shared: InFlight, seconds: float) -> None:
        super().__init__(name)
        self.shared, self.seconds = shared, seconds

    async def work(self, item: handlers.Item) -> handlers.Result:
        self.shared.running += 1
        self.shared.most = max(self.shared.most, self.shared.running)
        try:
            await asyncio.sleep(self.seconds)
            return await super().work(item)
        finally:
            self.shared.running -= 1
            self.shared.finished += 1


async def test_a_key_limit_spans_the_pipelines_of_one_fleet(
        client: AsyncClient, make_store: Callable[..., Store]) -> None:
    shared = InFlight()
    async with serving(lambda name: Slow(name, shared, 0.02)) as start:
        urls = await start("a", "b")
        for n in range(3):
            for pipeline in ("a", "b"):
                await client.create_partition(f"{pipeline}{n}", items(3), pipeline=pipeline,
                                              key="shared")
        await client.set_key_limit("shared", 1)
        routes = routes_of(every_gate(a="a", b="b"), urls)
        # Leases three times the usual: this test counts every call, and a lease that
        # expires while a loaded machine stalls a watcher calls its item again.
        fleet = [watcher_for(make_store(), routes, owner_id=f"w{n}", concurrency=8,
                             lease_duration=FAST["lease_duration"] * 3)
                 for n in range(2)]
        try:
            async with running(*(watcher for watcher, _ in fleet)):
                for n in range(3):
                    for pipeline in ("a", "b"):
                        info = await client.wait(f"{pipeline}{n}", timeout=60)
                        assert info.status == "complete"
        finally:
            for _, http in fleet:
                await http.aclose()
    assert shared.most == 1, f"{shared.most} calls of key 'shared' at once"
    assert urls["a"][0].partitions() == {"a0", "a1", "a2"}
    assert urls["b"][0].partitions() == {"b0", "b1", "b2"}
    assert shared.finished == 36  # 12 items, two gates, two pipelines: once each


@pytest.mark.parametrize("scope", ["key", "fleet"])
async def test_a_pause_of_the_key_or_the_fleet_holds_every_pipeline(
        client: AsyncClient, make_store: Callable[..., Store], scope: str) -> None:
    shared = InFlight()
    async with serving(lambda name: Slow(name, shared, 0.1)) as start:
        urls = await start("a", "b")
        a, b = urls["a"][0], urls["b"][0]
        for pipeline in ("a", "b"):
            await client.create_partition(pipeline, items(12), pipeline=pipeline, key="k")
        store = make_store()
        # A lease far longer than the test: each item is called once per gate.
        watcher, http = watcher_for(store, routes_of(every_gate(a="a", b="b"), urls), concurrency=4,
                                    lease_duration=30.0)
        try:
            async with running(watcher):
                await wait_until(lambda: len(a.calls) >= 2 and len(b.calls) >= 2,
                                 timeout=30, message="calls of both pipelines")
                paused = client.pause_key("k") if scope == "key" else client.pause_all()
                assert await paused is True

                async def let_go() -> bool:
                    return [(await client.partition(pid)).owner for pid in "ab"] == ["", ""]

                await wait_until(let_go, timeout=30,
                                 message="both pipelines' partitions to be let go")
                assert shared.running == 0
                started = (len(a.calls), len(b.calls))
                scans = count_calls(store, "leases_read_free")
                await wait_until(lambda: scans["leases_read_free"] >= 3, timeout=30,
                                 message="three lease scans")
                assert (len(a.calls), len(b.calls)) == started  # nothing more in either
                # Every call that started was written: none is lost.
                written = [len(json.loads(item.data)) for item in
                           [*await client.items("a"), *await client.items("b")]]
                assert sum(written) == shared.finished == sum(started)
                resumed = client.resume_key("k") if scope == "key" else client.resume_all()
                assert await resumed is True
                for pid in "ab":
                    assert (await client.wait(pid, timeout=60)).status == "complete"
        finally:
            await http.aclose()
    assert await answered_by(client, "a") == {("0", "a"), ("1", "a")}
    assert await answered_by(client, "b") == {("0", "b"), ("1", "b")}
    assert len(a.calls) == len(b.calls) == 24  # each item once per gate, pause or not
