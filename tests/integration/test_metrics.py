"""The Prometheus metrics of a real watcher calling a handler served by uvicorn on loopback,
on real SQLite and PostgreSQL: the calls in flight for per-item, batch and reduce calls,
and the latency histogram's gate, outcome and pipeline labels.

The handler holds its calls until the test lets them go, so what is in flight is
known exactly; every condition is awaited with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import handlers
from processor import AsyncClient, NewItem
from processor.http.batch import BatchingHttpProcessor
from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from processor.observe.metrics import PrometheusHooks
from tests.conftest import POSTGRES_URL, require_postgres
from tests.support.engine import running, wait_until
from tests.support.servers import serve_app
from watcher import Watcher, WatcherConfig

FAST = {"poll_interval": 0.05, "lease_duration": 3.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2, "shutdown_timeout": 5.0}
CONCURRENCY = 4
WAIT = 30.0


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """SQLite, and PostgreSQL: the metrics do not depend on the database beyond these."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'statefeed.db'}"
    require_postgres()
    return POSTGRES_URL


def scrape(hooks: PrometheusHooks) -> dict[str, dict[frozenset[tuple[str, str]], float]]:
    """The rendered metrics parsed back: sample name -> labels -> value."""
    found: dict[str, dict[frozenset[tuple[str, str]], float]] = {}
    for family in text_string_to_metric_families(hooks.render().decode()):
        for sample in family.samples:
            found.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return found


def in_flight(hooks: PrometheusHooks) -> float:
    return scrape(hooks)["statefeed_in_flight"][frozenset()]


@dataclass
class Holding:
    """Item steps that wait until ``steps`` is set and a reduce that waits until
    ``reduces`` is set; counts the calls held."""

    steps: asyncio.Event = field(default_factory=asyncio.Event)
    reduces: asyncio.Event = field(default_factory=asyncio.Event)
    held: int = 0
    reduces_held: int = 0

    async def step(self, item: handlers.Item) -> handlers.Result:
        self.held += 1
        try:
            await self.steps.wait()
        finally:
            self.held -= 1
        if item.gate == 0:
            return handlers.Result(gate=1)
        return handlers.Result(done=True)

    async def reduce(self, page: handlers.ReducePage) -> handlers.Reduced:
        self.reduces_held += 1
        try:
            await self.reduces.wait()
        finally:
            self.reduces_held -= 1
        return handlers.Reduced(result={"items": len(page.items)})


@contextlib.asynccontextmanager
async def watching(make_store: Callable[..., Any], app: Any, *, batch_size: int = 0
                   ) -> AsyncIterator[PrometheusHooks]:
    """A watcher with Prometheus hooks, calling ``app`` (served by uvicorn) one item per
    request, or ``batch_size`` items per batch request."""
    hooks = PrometheusHooks()
    async with serve_app(app) as url:
        config = HttpProcessorConfig(handler_url=url + "/")
        http = (BatchingHttpProcessor(config, batch_size=batch_size) if batch_size
                else HttpProcessor(config))
        watcher = Watcher(make_store(), http, WatcherConfig(
            owner_id="metrics", concurrency=CONCURRENCY, **FAST), hooks)
        try:
            async with running(watcher):
                yield hooks
        finally:
            await http.aclose()


@pytest.mark.parametrize("batch_size", [0, 3], ids=["per-item", "batch"])
async def test_in_flight_counts_the_items_whose_calls_run(db_url, table_prefix, make_store,
                                                         batch_size) -> None:
    """Ten items, four slots: four calls run (alone, or three and one in batch requests),
    the gauge says four; once the calls are let go it says 0 without waiting for a
    later dispatch, and the latency histogram counts each item by gate and outcome."""
    holding = Holding()
    async with (AsyncClient(db_url, table_prefix) as client,
                watching(make_store, handlers.app(holding.step), batch_size=batch_size
                         ) as hooks):
        await client.create_partition("p", [NewItem(f"i{n}", b"") for n in range(10)])
        await wait_until(lambda: holding.held == CONCURRENCY, timeout=WAIT,
                         message="the handler holding four calls")
        assert in_flight(hooks) == CONCURRENCY
        holding.steps.set()
        info = await client.wait("p", timeout=WAIT)
        assert info.status == "complete"
        await wait_until(lambda: in_flight(hooks) == 0, timeout=5,
                         message="statefeed_in_flight back at 0")
        counts = scrape(hooks)["statefeed_handler_seconds_count"]
    assert counts == {
        frozenset({("gate", "0"), ("outcome", "advanced"), ("pipeline", "default")}): 10.0,
        frozenset({("gate", "1"), ("outcome", "complete"), ("pipeline", "default")}): 10.0}


async def test_in_flight_counts_a_reduce_call(db_url, table_prefix, make_store) -> None:
    """A reduce call takes one slot: the gauge says 1 while it runs, 0 once it is done,
    and the reduce is counted with the label ``pass``."""
    holding = Holding()
    holding.steps.set()  # the item steps answer at once; the reduce is held
    app = handlers.app({0: holding.step}, reduce=holding.reduce)
    async with (AsyncClient(db_url, table_prefix) as client,
                watching(make_store, app) as hooks):
        await client.create_partition("r", [NewItem(f"i{n}", b"") for n in range(3)],
                                      reduce_gates=[1])
        await wait_until(lambda: holding.reduces_held == 1, timeout=WAIT,
                         message="the reduce call held")
        assert in_flight(hooks) == 1  # the item calls are over: the reduce waits for them
        holding.reduces.set()
        info = await client.wait("r", timeout=WAIT)
        assert info.status == "complete" and info.result_json() == {"items": 3}
        await wait_until(lambda: in_flight(hooks) == 0, timeout=5,
                         message="statefeed_in_flight back at 0")
        reduces = scrape(hooks)["statefeed_reduce_calls_total"]
    assert reduces == {
        frozenset({("pass", "all"), ("outcome", "applied"), ("pipeline", "default")}): 1.0}
