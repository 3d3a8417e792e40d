"""Many pipelines on one fleet, on real databases with real uvicorn handlers: each item
reaches exactly the service its route names, a version change finishes old partitions on
the old service and new ones on the new, an outage of one service holds only its calls,
and a processor serving a subset never leases what it cannot serve.

Every handler writes its name into the item's data at each gate, so the items' final
data say which service answered each of their gates.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from processor import AsyncClient, NewItem
from processor.http.config import HttpProcessorConfig
from processor.http.routes import parse_routes
from processor.service import ProcessorService, ServiceConfig
from tests.support.engine import running, wait_until
from tests.support.pipelines import (
    FAST,
    answered_by,
    every_gate,
    routes_of,
    routes_text,
    serving,
    watcher_for,
)
from watcher import WatcherConfig
from watcher.hooks import Hooks
from watcher.store import Store
from watcher.store.db.urls import parse_database_url


class Leases(Hooks):
    """The partitions a watcher leased."""

    def __init__(self) -> None:
        self.taken: set[str] = set()

    def lease_acquired(self, partition_id: str, *, stolen_from: str | None) -> None:
        self.taken.add(partition_id)


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


@pytest.fixture
async def services() -> AsyncIterator[Callable[..., Any]]:
    """Start named services under uvicorn (:func:`tests.support.pipelines.serving`)."""
    async with serving() as start:
        yield start


TWO_PIPELINES = """
[[pipeline]]
name = "invoices"
[[pipeline.route]]
gate = 0
url = "@ocr"
[[pipeline.route]]
gate = 1
url = "@classify"

[[pipeline]]
name = "resumes"
[[pipeline.route]]
gate = "*"
url = "@parse"
batch_size = 4
"""


async def test_each_item_reaches_exactly_the_service_its_route_names(
        client: AsyncClient, make_store: Callable[..., Store],
        services: Callable[..., Any]) -> None:
    urls = await services("ocr", "classify", "parse")
    routes = routes_of(TWO_PIPELINES, urls)
    for n in range(3):
        await client.create_partition(f"inv{n}", [NewItem(f"i{m}", b"{}") for m in range(4)],
                                      pipeline="invoices")
        await client.create_partition(f"res{n}", [NewItem(f"i{m}", b"{}") for m in range(4)],
                                      pipeline="resumes", pipeline_version="2026.1")
    fleet = [watcher_for(make_store(), routes) for _ in range(3)]
    try:
        async with running(*(watcher for watcher, _ in fleet)):
            for n in range(3):
                assert (await client.wait(f"inv{n}", timeout=60)).status == "complete"
                assert (await client.wait(f"res{n}", timeout=60)).status == "complete"
            assert await fleet[0][1].check_health() == (True, "3 of 3 services healthy")
    finally:
        for _, processor in fleet:
            await processor.aclose()
    for n in range(3):
        assert await answered_by(client, f"inv{n}") == {("0", "ocr"), ("1", "classify")}
        assert await answered_by(client, f"res{n}") == {("0", "parse"), ("1", "parse")}
    ocr, classify, parse = (urls[name][0] for name in ("ocr", "classify", "parse"))
    assert {gate for _, gate in ocr.calls} == {0} and {gate for _, gate in classify.calls} == {1}
    assert ocr.partitions() == classify.partitions() == {"inv0", "inv1", "inv2"}
    assert parse.partitions() == {"res0", "res1", "res2"}  # in batches, to <url>/batch
    info = await client.partition("res1")
    assert (info.pipeline, info.pipeline_version) == ("resumes", "2026.1")


VERSIONS = """
[[pipeline]]
name = "invoices"
current = "{current}"
[[pipeline.route]]
version = "v1"
gate = "*"
url = "@old"
[[pipeline.route]]
version = "v2"
gate = "*"
url = "@new"
"""


async def test_a_version_change_finishes_old_partitions_on_the_old_service(
        client: AsyncClient, make_store: Callable[..., Store],
        services: Callable[..., Any]) -> None:
    urls = await services("old", "new")
    old = urls["old"][0]
    gate1_open = old.hold(1)  # the old partitions stay at gate 1 over the deploy
    await client.create_partition("before", [NewItem("a", b"{}"), NewItem("b", b"{}")],
                                  pipeline="invoices")
    await client.create_partition("moved", [NewItem("a", b"{}")], pipeline="invoices")
    first, first_http = watcher_for(make_store(), routes_of(VERSIONS.format(current="v1"), urls),
                                    shutdown_timeout=0.2)
    try:
        async with running(first):
            await wait_until(lambda: {("before", 1), ("moved", 1)} <= set(old.calls),
                             timeout=30, message="the old service's gate 1 calls")
    finally:
        await first_http.aclose()
    assert (await client.partition("before")).pipeline_version == "v1"  # pinned at its lease
    # The deploy: v2 is current now. A new partition starts on it; an operator moves one.
    await client.create_partition("after", [NewItem("a", b"{}")], pipeline="invoices")
    moved = await client.move_pipeline_version("moved", "v2")
    assert (moved.before, moved.after) == ("v1", "v2")
    second, second_http = watcher_for(make_store(),
                                      routes_of(VERSIONS.format(current="v2"), urls))
    try:
        async with running(second):
            assert (await client.wait("after", timeout=30)).status == "complete"
            assert (await client.wait("moved", timeout=30)).status == "complete"
            gate1_open.set()
            assert (await client.wait("before", timeout=30)).status == "complete"
    finally:
        await second_http.aclose()
    assert await answered_by(client, "before") == {("0", "old"), ("1", "old")}
    assert await answered_by(client, "after") == {("0", "new"), ("1", "new")}
    assert await answered_by(client, "moved") == {("0", "old"), ("1", "new")}
    assert "after" not in old.partitions()
    assert [(count.version, count.open) for count in await client.pipelines()] == []




async def test_an_outage_of_one_service_holds_only_its_calls(
        client: AsyncClient, make_store: Callable[..., Store],
        services: Callable[..., Any]) -> None:
    urls = await services("ocr", "rank")
    ocr, rank = urls["ocr"][0], urls["rank"][0]
    ocr.down = True
    for n in range(2):
        await client.create_partition(f"o{n}", [NewItem(f"i{m}", b"{}") for m in range(5)],
                                      pipeline="ocr")
        await client.create_partition(f"r{n}", [NewItem(f"i{m}", b"{}") for m in range(5)],
                                      pipeline="rank")
    routes = routes_of(every_gate(ocr="ocr", rank="rank"), urls)
    watcher, http = watcher_for(make_store(), routes, max_retries=0)
    ocr_name = http.service_of("ocr", None, 0)
    try:
        async with running(watcher):
            await wait_until(lambda: ocr_name in watcher.flow.holds
                             and watcher.flow.holds[ocr_name].held, timeout=30,
                             message="the ocr service's hold")
            # The rank service's calls go on while ocr's are held.
            for n in range(2):
                assert (await client.wait(f"r{n}", timeout=30)).status == "complete"
            assert watcher.flow.holds[ocr_name].held
            ready, detail = await http.check_health()  # ready: the rank service answers
            assert ready and detail.startswith(f"1 of 2 services healthy; {ocr_name}: "), detail
            assert not any(hold.held for name, hold in watcher.flow.holds.items()
                           if name != ocr_name)
            ocr.down = False
            for n in range(2):  # max_retries=0: a held call spent no attempt
                assert (await client.wait(f"o{n}", timeout=30)).status == "complete"
    finally:
        await http.aclose()
    assert rank.partitions() == {"r0", "r1"} and ocr.partitions() == {"o0", "o1"}


SUBSET = """
[[pipeline]]
name = "ocr"
[[pipeline.route]]
gate = 0
url = "@first"
"""

REST = """
[[pipeline]]
name = "ocr"
[[pipeline.route]]
gate = 1
url = "@second"

[[pipeline]]
name = "other"
[[pipeline.route]]
gate = "*"
url = "@second"
"""


async def test_a_processor_serving_a_subset_never_leases_what_it_cannot_serve(
        client: AsyncClient, make_store: Callable[..., Store],
        services: Callable[..., Any]) -> None:
    urls = await services("first", "second")
    for n in range(3):
        await client.create_partition(f"o{n}", [NewItem("a", b"{}"), NewItem("b", b"{}")],
                                      pipeline="ocr")
        await client.create_partition(f"x{n}", [NewItem("a", b"{}")], pipeline="other")
    leases = Leases()
    subset, subset_http = watcher_for(make_store(), routes_of(SUBSET, urls), leases)
    rest, rest_http = watcher_for(make_store(), routes_of(REST, urls))
    try:
        async with running(subset):
            # Alone, it takes the ocr partitions, moves them past gate 0 and hands them over.
            await wait_until(lambda: len(urls["first"][0].calls) == 6, timeout=30,
                             message="gate 0 of every ocr partition")
            await wait_until(lambda: not subset.keeper.leases, timeout=30,
                             message="the hand-over of the partitions at gate 1")
            async with running(rest):
                for n in range(3):
                    assert (await client.wait(f"o{n}", timeout=30)).status == "complete"
                    assert (await client.wait(f"x{n}", timeout=30)).status == "complete"
    finally:
        await subset_http.aclose()
        await rest_http.aclose()
    assert leases.taken == {"o0", "o1", "o2"}
    assert {gate for _, gate in urls["first"][0].calls} == {0}
    for n in range(3):
        assert await answered_by(client, f"o{n}") == {("0", "first"), ("1", "second")}


ONE = """
[[pipeline]]
name = "one"
[[pipeline.route]]
gate = "*"
url = "@a"
"""


async def test_a_reloaded_routes_file_serves_the_new_routes_without_dropping_calls(
        client: AsyncClient, db_url: str, table_prefix: str, tmp_path: Path,
        services: Callable[..., Any], caplog: pytest.LogCaptureFixture) -> None:
    urls = await services("a", "b")
    a = urls["a"][0]
    gate1_open = a.hold(1)  # p1's gate 1 calls are in flight over the reload
    path = tmp_path / "routes.toml"
    path.write_text(ONE.replace("@a", urls["a"][1]))
    routes = parse_routes(path.read_text())
    service = ProcessorService(ServiceConfig(
        db_url=parse_database_url(db_url), table_prefix=table_prefix,
        watcher=WatcherConfig(**FAST, pipelines=routes.served()),
        http=HttpProcessorConfig(handler_url="http://unused/"), batch_size=0, health_port=0,
        health_host="127.0.0.1", routes=routes, routes_path=str(path)))
    await client.create_partition("p1", [NewItem("a", b"{}"), NewItem("b", b"{}")],
                                  pipeline="one")
    await client.create_partition("p2", [NewItem("a", b"{}")], pipeline="two")
    try:
        async with running(service.watcher):
            await wait_until(lambda: sum(call == ("p1", 1) for call in a.calls) == 2,
                             timeout=30, message="p1's gate 1 calls")
            path.write_text("[[pipeline]]\nname = 'one'\ncolour = 'red'\n")
            assert not await service.reload_routes()  # refused: the routes in use stay
            assert "routes.toml:3: unknown key 'colour'" in caplog.text
            path.write_text(ONE.replace("@a", urls["a"][1]) + TWO.replace("@b", urls["b"][1]))
            assert await service.reload_routes()
            assert (await client.wait("p2", timeout=30)).status == "complete"
            gate1_open.set()
            assert (await client.wait("p1", timeout=30)).status == "complete"
    finally:
        await service.http.aclose()
        await service.store.close()
    assert await answered_by(client, "p2") == {("0", "b"), ("1", "b")}
    assert await answered_by(client, "p1") == {("0", "a"), ("1", "a")}
    assert sum(call == ("p1", 1) for call in a.calls) == 2  # its calls in flight went on


TWO = """
[[pipeline]]
name = "two"
[[pipeline.route]]
gate = "*"
url = "@b"
"""


async def test_a_reload_that_drops_a_service_writes_its_call_in_flight(
        client: AsyncClient, db_url: str, table_prefix: str, tmp_path: Path,
        services: Callable[..., Any]) -> None:
    """The new file drops pipeline ``two`` and its service while a call to it is in
    flight: the call ends, its answer is written, and the partition, at a place this
    processor no longer serves, is handed over rather than called again."""
    urls = await services("a", "b")
    b = urls["b"][0]
    gate0_open = b.hold(0)  # p2's call is in flight over the reload
    path = tmp_path / "routes.toml"
    path.write_text(routes_text(ONE + TWO, urls))
    routes = parse_routes(path.read_text())
    # The retired service's connections close a request timeout after the reload.
    service = ProcessorService(ServiceConfig(
        db_url=parse_database_url(db_url), table_prefix=table_prefix,
        watcher=WatcherConfig(**{**FAST, "lease_duration": 5.0}, pipelines=routes.served()),
        http=HttpProcessorConfig(handler_url="http://unused/", request_timeout=5.0),
        batch_size=0, health_port=0, health_host="127.0.0.1", routes=routes,
        routes_path=str(path)))
    await client.create_partition("p1", [NewItem("a", b"{}")], pipeline="one")
    await client.create_partition("p2", [NewItem("x", b"{}")], pipeline="two")
    try:
        async with running(service.watcher):
            await wait_until(lambda: b.in_flight("p2", 0) == 1, timeout=30,
                             message="p2's call in flight")
            path.write_text(routes_text(ONE, urls))
            # It waits out the request timeout before it closes the retired service.
            reloading = asyncio.create_task(service.reload_routes())
            await wait_until(lambda: "two" not in service.http.routes.pipelines, timeout=30,
                             message="the reload")
            gate0_open.set()

            async def handed_over() -> bool:
                info = await client.partition("p2")
                return info.owner == "" and info.counts == {"available": 1}

            await wait_until(handed_over, timeout=30, message="p2 written and handed over")
            assert (await client.wait("p1", timeout=30)).status == "complete"
            assert await reloading
    finally:
        await service.http.aclose()
        await service.store.close()
    [item] = await client.items("p2")
    assert (item.gate, item.status, item.attempts) == (1, "available", 0)
    assert json.loads(item.data) == {"0": "b"}  # the answer of the call in flight
    assert b.calls == [("p2", 0)]  # nothing called it after the reload
    assert await answered_by(client, "p1") == {("0", "a"), ("1", "a")}
