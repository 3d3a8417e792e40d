"""Rewind end to end on every live database: an SDK handler served by uvicorn spawns at a
gate and a reduce sums the next; after a rewind the engine runs again exactly what it
should (the handler counts its calls), and the partition ends as a fresh one given the
same input does: the same items, counts, spawned count and result."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

import handlers
from processor import AsyncClient, NewItem
from processor.api.server import ApiOptions, api_running
from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from tests.support.engine import running, serving_watcher
from tests.support.servers import serve_app
from watcher import Watcher, WatcherConfig
from watcher.store.db.urls import parse_database_url

FAST = {"poll_interval": 0.05, "lease_duration": 3.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.1}
INPUT = ["root-0", "root-1", "x-0", "x-1", "x-2"]


class Pipeline:
    """Gate 0 passes every item on; gate 1 runs the "model" (each root spawns two
    children at gate 1, which run it too), failing the items in ``broken``; gate 2
    reduces: the result names the items done and the failed ones. Calls are counted
    per partition as (gate, item id), and ("reduce", number of items)."""

    def __init__(self) -> None:
        self.broken: set[str] = set()
        self.calls: dict[str, Counter[tuple[Any, Any]]] = {}
        self.app = handlers.app({0: self.first, 1: self.model}, reduce=self.summary)

    def _count(self, partition_id: str, key: tuple[Any, Any]) -> None:
        self.calls.setdefault(partition_id, Counter())[key] += 1

    def first(self, item: handlers.Item) -> handlers.Result:
        self._count(item.partition_id, (0, item.id))
        return handlers.Result(gate=1)

    def model(self, item: handlers.Item) -> handlers.Result:
        self._count(item.partition_id, (1, item.id))
        if item.id in self.broken:
            raise handlers.Fail("model version 1 cannot read this item")
        spawn = ([handlers.Spawn(f"{item.id}.c{k}", {"k": k}) for k in range(2)]
                 if item.id.startswith("root") and "." not in item.id else [])
        return handlers.Result(gate=2, spawn=spawn)

    def summary(self, page: handlers.ReducePage) -> handlers.Reduced:
        self._count(page.partition_id, ("reduce", len(page.items)))
        return handlers.Reduced(result={
            "done": sorted(item.id for item in page.items if item.status != "failed"),
            "failed": sorted(item.id for item in page.items if item.status == "failed")})


@contextlib.asynccontextmanager
async def pipeline_running(make_store: Callable[..., Any]) -> AsyncIterator[Pipeline]:
    pipeline = Pipeline()
    async with serving_watcher(pipeline.app, make_store(),
                               WatcherConfig(owner_id="w1", max_retries=0, **FAST)):
        yield pipeline


async def create(client: AsyncClient, partition_id: str) -> None:
    await client.create_partition(partition_id, [NewItem(item_id, b"{}") for item_id in INPUT],
                                  reduce_gates=[2], on_item_failure="continue")


async def outcome(client: AsyncClient, partition_id: str) -> tuple[Any, ...]:
    info = await client.wait(partition_id, timeout=60)
    items = sorted((item.id, item.status, item.gate, item.parent)
                   for item in await client.items(partition_id))
    return (info.status, info.gate, info.counts, info.spawned,
            json.loads(info.result or b"null"), items)


async def broken_run(client: AsyncClient, pipeline: Pipeline) -> None:
    """Partition "run", finished with x-1 failed at gate 1 (model version 1)."""
    pipeline.broken = {"x-1"}
    await create(client, "run")
    status, _, counts, spawned, result, _ = await outcome(client, "run")
    assert (status, counts, spawned) == ("complete", {"complete": 8, "failed": 1}, 4)
    assert result["failed"] == ["x-1"]
    pipeline.broken = set()  # the model is fixed


async def test_a_rewind_runs_again_what_it_should_and_ends_as_a_fresh_partition(
        db_url, table_prefix, make_store) -> None:
    async with AsyncClient(db_url, table_prefix) as client, \
            pipeline_running(make_store) as pipeline:
        await broken_run(client, pipeline)
        before = pipeline.calls.pop("run")
        assert before[("reduce", 9)] == 1

        report = await client.rewind("run", 1)
        assert (report.status_before, report.gate_before, report.gate) == ("complete", 2, 1)
        # The five items go back to gate 1; the four children their roots spawned there
        # are removed (the roots spawn them again).
        assert (report.items_reset, report.items_removed, report.reduces_again) == (
            5, 4, (2,))
        rewound = await outcome(client, "run")
        await create(client, "fresh")
        fresh = await outcome(client, "fresh")

    assert rewound == fresh
    assert rewound[4] == {"done": sorted([*INPUT, "root-0.c0", "root-0.c1", "root-1.c0",
                                          "root-1.c1"]), "failed": []}
    after = pipeline.calls["run"]
    # Gate 0 is not run again; gate 1 once per item and respawned child; the reduce once.
    gate_one = {item_id: 1 for item_id in [*INPUT, "root-0.c0", "root-0.c1", "root-1.c0",
                                           "root-1.c1"]}
    assert after == Counter({**{(1, item_id): n for item_id, n in gate_one.items()},
                             ("reduce", 9): 1})
    assert pipeline.calls["fresh"] == Counter({**{(0, item_id): 1 for item_id in INPUT},
                                               **{(1, item_id): 1 for item_id in gate_one},
                                               ("reduce", 9): 1})


async def test_a_failed_only_rewind_runs_only_the_failed_item_and_the_reduce_again(
        db_url, table_prefix, make_store) -> None:
    async with AsyncClient(db_url, table_prefix) as client, \
            pipeline_running(make_store) as pipeline:
        await broken_run(client, pipeline)
        pipeline.calls.pop("run")
        report = await client.rewind("run", 1, failed_only=True)
        # x-1 goes back; the reduce at gate 2 takes back the eight items it completed.
        assert (report.items_reset, report.items_removed, report.items_rerun) == (1, 0, 8)
        rewound = await outcome(client, "run")
        await create(client, "fresh")
        fresh = await outcome(client, "fresh")
    assert rewound == fresh
    assert pipeline.calls["run"] == Counter({(1, "x-1"): 1, ("reduce", 9): 1})


async def test_the_api_rewinds_and_refuses_in_the_one_error_shape(
        db_url, table_prefix, make_store) -> None:
    options = ApiOptions(parse_database_url(db_url), table_prefix, port=0)
    async with AsyncClient(db_url, table_prefix) as client, \
            pipeline_running(make_store) as pipeline, api_running(options) as url, \
            httpx.AsyncClient(base_url=url, timeout=30) as http:
        await broken_run(client, pipeline)
        version = (await client.partition("run")).version

        async def rewind(body: Any, **kwargs: Any) -> httpx.Response:
            return await http.post("/v1/partitions/run/rewind", json=body, **kwargs)

        refused = {
            "above": await rewind({"gate": 3}),
            "unknown": await rewind({"gate": 1, "items": ["nope"]}),
            "negative": await rewind({"gate": -1}),
            "stale": await rewind({"gate": 1, "version": version - 1}),
            "field": await rewind({"gate": 1, "extra": True}),
            "cross-site": await rewind({"gate": 1}, headers={"origin": "https://evil.example"}),
        }
        codes = {name: (response.status_code, response.json()["error"]["code"])
                 for name, response in refused.items()}
        assert codes == {"above": (409, "gate_conflict"), "unknown": (422, "invalid_input"),
                         "negative": (400, "bad_request"), "stale": (409, "version_conflict"),
                         "field": (400, "bad_request"),
                         "cross-site": (403, "cross_site_request")}
        assert "only goes back" in refused["above"].json()["error"]["message"]
        assert (await client.partition("run")).version == version  # nothing written

        done = await rewind({"gate": 1, "failed_only": True, "version": version})
        assert done.status_code == 200, done.text
        assert done.json() | {"version_before": 0} == {
            "id": "run", "status": "available", "gate": 1, "status_before": "complete",
            "gate_before": 2, "version_before": 0, "reopened": True, "items_reset": 1,
            "items_removed": 0, "items_rerun": 8, "reduces_again": [2],
            "result_cleared": True}
        status, _, counts, _, result, _ = await outcome(client, "run")
    assert (status, counts, result["failed"]) == ("complete", {"complete": 9}, [])


@pytest.mark.parametrize("stopped", ["failed", "cancelled"])
async def test_a_stopped_partition_re_opens_and_completes(
        db_url, table_prefix, make_store, stopped: str) -> None:
    async with AsyncClient(db_url, table_prefix) as client, \
            pipeline_running(make_store) as pipeline:
        pipeline.broken = {"x-1"}
        await client.create_partition("stop", [NewItem(item_id, b"{}") for item_id in INPUT],
                                      reduce_gates=[2])  # a failed item fails it
        info = await client.wait("stop", timeout=60)
        assert info.status == "failed"
        if stopped == "cancelled":
            await client.retry_failed("stop")
            await client.cancel("stop")
            assert (await client.partition("stop")).status == "cancelled"
        pipeline.broken = set()
        report = await client.rewind("stop", 0)
        assert report.reopened and report.status_before == stopped
        info = await client.wait("stop", timeout=60)
    assert info.status == "complete" and info.counts == {"complete": 9}


async def test_a_rewind_under_a_running_holder_takes_over_and_ends_as_a_fresh_partition(
        db_url, table_prefix, make_store) -> None:
    """The holder has a call in flight at gate 1 when the partition is rewound to gate 0:
    it lets the partition go, the late answer is refused, and the partition runs again
    from gate 0 to the end as a fresh one does."""
    pipeline = Pipeline()
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow_model(item: handlers.Item) -> handlers.Result:
        if item.partition_id == "run" and item.id == "x-2" and not release.is_set():
            entered.set()
            await release.wait()
        return pipeline.model(item)

    app = handlers.app({0: pipeline.first, 1: slow_model}, reduce=pipeline.summary)
    async with AsyncClient(db_url, table_prefix) as client, serve_app(app) as url:
        processor = HttpProcessor(HttpProcessorConfig(handler_url=f"{url}/"))
        watcher = Watcher(make_store(), processor,
                          WatcherConfig(owner_id="w1", max_retries=0, **FAST))
        try:
            async with running(watcher):
                await create(client, "run")
                await asyncio.wait_for(entered.wait(), timeout=60)
                held = await client.partition("run")
                assert (held.status, held.gate, held.owner) == ("available", 1, "w1")
                report = await client.rewind("run", 0)
                assert report.status_before == "available" and report.gate == 0
                release.set()  # the answer of the call in flight comes too late
                rewound = await outcome(client, "run")
                await create(client, "fresh")
                fresh = await outcome(client, "fresh")
        finally:
            await processor.aclose()
    # x-2 was called at gate 1 twice in "run": the call the rewind overtook, and again.
    assert pipeline.calls["run"][(1, "x-2")] == 2
    assert pipeline.calls["run"][(0, "x-2")] == 2
    assert rewound == fresh
    assert rewound[0] == "complete" and rewound[4]["failed"] == []
