"""A rewind before a reduce that spawns, end to end on every live database: an SDK handler
served by uvicorn, whose roots spawn children at gate 1 and whose reduce at gate 2 spawns
a summary at gate 3 (which spawns a page of its own). A rewind to a gate before the reduce
removes what the reduce spawned, with its descendants, in its transaction; the reduce runs
exactly once more and spawns them afresh, and the partition ends as a fresh one given the
same input does: the same items at the same gates, spawned count and result."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import handlers
from processor import AsyncClient, NewItem
from processor.views import rewind_row, rewind_text
from tests.support.engine import serving_watcher
from watcher import WatcherConfig

FAST = {"poll_interval": 0.05, "lease_duration": 3.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.1}
INPUT = ["r0", "r1", "x"]
CHILDREN = ["r0.c0", "r0.c1", "r1.c0", "r1.c1"]
SPAWNED_BY_REDUCE = ["summary", "summary.page"]


class Pipeline:
    """Gate 0 passes every item on; gate 1 runs the "model" (each root spawns two
    children there, which run it too), failing the items in ``broken``; the reduce at
    gate 2 completes its items and spawns "summary" at gate 3, whose step spawns
    "summary.page" at gate 4, where both complete. Calls are counted per partition
    as (gate, item id) and ("reduce", items seen)."""

    def __init__(self) -> None:
        self.broken: set[str] = set()
        self.calls: dict[str, Counter[tuple[Any, Any]]] = {}
        self.app = handlers.app({0: self.first, 1: self.model, 3: self.report,
                                 4: self.publish}, reduce=self.summary)

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
                 if item.id.startswith("r") and "." not in item.id else [])
        return handlers.Result(gate=2, spawn=spawn)

    def summary(self, page: handlers.ReducePage) -> handlers.Reduced:
        self._count(page.partition_id, ("reduce", len(page.items)))
        done = sorted(item.id for item in page.items if not item.failed)
        failed = sorted(item.id for item in page.items if item.failed)
        return handlers.Reduced(result={"done": done, "failed": failed},
                                spawn=[handlers.Spawn("summary", {"done": len(done)})])

    def report(self, item: handlers.Item) -> handlers.Result:
        self._count(item.partition_id, (3, item.id))
        return handlers.Result(gate=4, spawn=[handlers.Spawn(f"{item.id}.page", {}, 4)])

    def publish(self, item: handlers.Item) -> handlers.Result:
        self._count(item.partition_id, (4, item.id))
        return handlers.Result(done=True)


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
    """The partition once it ended: status, gate, items per (gate, status), spawned
    count, result, and each item's (id, status, gate, parent)."""
    info = await client.wait(partition_id, timeout=60)
    items = await client.items(partition_id)
    per_gate = Counter((item.gate, item.status) for item in items)
    return (info.status, info.gate, dict(per_gate), info.spawned,
            json.loads(info.result or b"null"),
            sorted((item.id, item.status, item.gate, item.parent) for item in items))


def calls_from(gate: int) -> Counter[tuple[Any, Any]]:
    """The calls a partition given INPUT makes from ``gate`` on, with nothing broken."""
    items = [*INPUT, *CHILDREN]
    return Counter({**({(0, item_id): 1 for item_id in INPUT} if gate == 0 else {}),
                    **{(1, item_id): 1 for item_id in items}, ("reduce", len(items)): 1,
                    (3, "summary"): 1, (4, "summary"): 1, (4, "summary.page"): 1})


@pytest.mark.parametrize("gate", [0, 1])
async def test_a_rewind_before_a_reduce_removes_what_it_spawned_and_ends_as_a_fresh_partition(
        db_url, table_prefix, make_store, gate: int) -> None:
    async with AsyncClient(db_url, table_prefix) as client, \
            pipeline_running(make_store) as pipeline:
        await create(client, "run")
        first = await outcome(client, "run")
        assert first[:2] == ("complete", 4) and first[3] == 6, first
        assert pipeline.calls.pop("run") == calls_from(0)

        report = await client.rewind("run", gate)
        # The three inputs go back; the four children the roots spawned at gate 1, the
        # summary the reduce spawned and the page the summary spawned are removed.
        assert (report.items_reset, report.items_removed, report.reduces_again) == (
            3, 6, (2,))
        assert report.result_cleared
        # As the CLI prints it and the API answers it.
        assert "3 items back at gate" in rewind_text(report)
        assert "6 spawned items removed" in rewind_text(report)
        assert rewind_row(report)["items_removed"] == 6
        rewound = await outcome(client, "run")
        await create(client, "fresh")
        fresh = await outcome(client, "fresh")

    assert rewound == fresh == first
    assert rewound[2] == {(2, "complete"): 7, (4, "complete"): 2}
    assert rewound[4] == {"done": sorted([*INPUT, *CHILDREN]), "failed": []}
    # Only the gates from the rewind's on run again, each item once; the reduce once.
    assert pipeline.calls["run"] == calls_from(gate)
    assert pipeline.calls["fresh"] == calls_from(0)


async def test_a_failed_only_rewind_runs_the_reduce_once_more_and_it_spawns_afresh(
        db_url, table_prefix, make_store) -> None:
    async with AsyncClient(db_url, table_prefix) as client, \
            pipeline_running(make_store) as pipeline:
        pipeline.broken = {"x"}
        await create(client, "run")
        status, _, _, _, result, _ = await outcome(client, "run")
        assert (status, result["failed"]) == ("complete", ["x"])
        pipeline.broken = set()  # the model is fixed
        pipeline.calls.pop("run")

        report = await client.rewind("run", 1, failed_only=True)
        # x goes back; the reduce at gate 2 takes back the six items it completed, and
        # what it spawned goes (the summary, and the page the summary spawned).
        assert (report.items_reset, report.items_removed, report.items_rerun) == (1, 2, 6)
        rewound = await outcome(client, "run")
        await create(client, "fresh")
        fresh = await outcome(client, "fresh")

    assert rewound == fresh
    assert rewound[4] == {"done": sorted([*INPUT, *CHILDREN]), "failed": []}
    assert pipeline.calls["run"] == Counter({
        (1, "x"): 1, ("reduce", 7): 1, (3, "summary"): 1, (4, "summary"): 1,
        (4, "summary.page"): 1})
