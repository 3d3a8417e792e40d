"""Open partitions at a place no live processor serves, on every live database: the
client, the console's overview and the ``statefeed_partitions_unserved`` gauge name the
place while no processor serving it runs, and stop once one starts; a processor's clean
stop takes its row away, an expired row does not count, and a processor serving
everything covers every place.

The watchers here are library watchers (real leases, real rows in the ``processors``
table) whose calls wait until the test ends, so the partitions stay open where they are.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any

import httpx
import pytest

from processor import AsyncClient, NewItem
from processor.console.app import create_app, settings_for
from processor.http.config import HttpProcessorConfig
from processor.service import ProcessorService, ServiceConfig
from tests.support.engine import running, wait_until
from watcher import Watcher, WatcherConfig
from watcher.pipelines import ServedPipelines, ServedRoute
from watcher.protocol import Result, WorkItem
from watcher.reports import PlaceCount
from watcher.store import Store
from watcher.store.db.clock import FixedClock
from watcher.store.db.urls import parse_database_url

FAST = {"poll_interval": 0.05, "lease_duration": 2.0, "shutdown_timeout": 0.1}
RESUMES = ServedPipelines((ServedRoute("resumes"),))
INVOICES = ServedPipelines((ServedRoute("invoices"),))


async def held(item: WorkItem) -> Result:
    """A call that never ends by itself: the partition stays open at its gate."""
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


def watcher(store: Store, owner: str, pipelines: ServedPipelines | None) -> Watcher:
    return Watcher(store, held, WatcherConfig(**FAST, owner_id=owner, pipelines=pipelines))


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


@pytest.fixture
async def console(client: AsyncClient, db_url: str,
                  table_prefix: str) -> AsyncIterator[httpx.AsyncClient]:
    """The console's pages, in process."""
    url = parse_database_url(db_url)
    app = create_app(settings_for(url, table_prefix, host="127.0.0.1", port=8090, token=None,
                                  read_only=True), client)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://127.0.0.1:8090") as http:
        yield http


@pytest.fixture
async def metrics(db_url: str, table_prefix: str) -> AsyncIterator[Callable[..., Any]]:
    """``await scrape()``: the gauges a processor service reads, read now and rendered."""
    service = ProcessorService(ServiceConfig(
        db_url=parse_database_url(db_url), table_prefix=table_prefix,
        watcher=WatcherConfig(**FAST), http=HttpProcessorConfig(handler_url="http://unused/"),
        batch_size=0, health_port=0, health_host="127.0.0.1"))

    async def scrape() -> dict[str, float]:
        assert await service.backlog.run_once()
        text = service.hooks.render().decode()
        return {match[1]: float(match[2]) for match in re.finditer(
            r'^statefeed_partitions_unserved\{pipeline="([^"]*)"\} (\S+)$', text, re.M)}

    try:
        yield scrape
    finally:
        await service.http.aclose()
        await service.store.close()


async def unserved_block(console: httpx.AsyncClient) -> str | None:
    """The overview's warning block of places no processor serves, or ``None``."""
    page = await console.get("/")
    assert page.status_code == 200
    found = re.search(r'<section[^>]*id="unserved".*?</section>', page.text, re.S)
    return None if found is None else found.group(0)


async def test_a_place_no_processor_serves_shows_until_one_serving_it_starts(
        client: AsyncClient, make_store: Callable[..., Store], console: httpx.AsyncClient,
        metrics: Callable[..., Any]) -> None:
    for n in range(2):
        await client.create_partition(f"inv{n}", [NewItem("a", b"")], pipeline="invoices")
    await client.create_partition("res0", [NewItem("a", b"")], pipeline="resumes")
    resumes, invoices = (watcher(make_store(), "resumes-only", RESUMES),
                         watcher(make_store(), "invoices-only", INVOICES))
    async with running(resumes):
        await wait_until(client.processors, timeout=30, message="the first processor's row")
        [row] = await client.processors()
        assert (row.owner, row.serves) == ("resumes-only", RESUMES.routes)
        assert await client.unserved_places() == [PlaceCount("invoices", None, 0, 2)]
        block = await unserved_block(console)
        assert block is not None and "<code>invoices</code>" in block, block
        assert "resumes" not in block and "no version pinned yet" in block and "gate 0" in block
        assert await metrics() == {"invoices": 2.0, "resumes": 0.0}
        async with running(invoices):
            await wait_until(lambda: _none_unserved(client), timeout=30,
                             message="the invoices served")
            assert await unserved_block(console) is None
            assert await metrics() == {"invoices": 0.0, "resumes": 0.0}
            assert [row.owner for row in await client.processors()] == [
                "invoices-only", "resumes-only"]
        # A clean stop deletes its row at once: the invoices wait where nobody serves them.
        assert [row.owner for row in await client.processors()] == ["resumes-only"]
        assert await client.unserved_places() == [PlaceCount("invoices", None, 0, 2)]
        assert await metrics() == {"invoices": 2.0, "resumes": 0.0}
    assert await client.processors() == []


async def _none_unserved(client: AsyncClient) -> bool:
    return await client.unserved_places() == []


async def test_an_expired_row_is_not_live_and_serving_everything_covers_all(
        client: AsyncClient, make_store: Callable[..., Store],
        metrics: Callable[..., Any]) -> None:
    await client.create_partition("inv", [NewItem("a", b"")], pipeline="invoices")
    await client.create_partition("crawl", [NewItem("a", b"", gate=4)], pipeline="crawl",
                                  pipeline_version="v9")
    await client.create_partition("plain", [NewItem("a", b"")])
    # A processor that served everything and stopped writing its row long ago (a crash):
    # its until passed by the database clock.
    ghost = make_store(clock=FixedClock(datetime(2001, 1, 1)))
    await ghost.processors_register("ghost", None, 30.0)
    assert await client.processors() == []
    assert await client.unserved_places() == [
        PlaceCount("crawl", "v9", 4, 1), PlaceCount("default", None, 0, 1),
        PlaceCount("invoices", None, 0, 1)]
    assert await metrics() == {"crawl": 1.0, "default": 1.0, "invoices": 1.0}
    everything = watcher(make_store(), "everything", None)  # as --handler-url alone
    async with running(everything):
        await wait_until(client.processors, timeout=30, message="its row")
        [row] = await client.processors()
        assert (row.owner, row.serves) == ("everything", None)
        assert await client.unserved_places() == []
        assert await metrics() == {"crawl": 0.0, "default": 0.0, "invoices": 0.0}
