"""The pipeline of a partition in what a processor reports, on every live database: a
partition created with ``pipeline="invoices"`` is counted under ``pipeline="invoices"``
in the item, call-duration, gate, close and reduce metrics, named ``pipeline=invoices``
in the engine's log lines (as text and as a JSON field), and carried as the span
attribute ``statefeed.pipeline`` by its call and reduce spans; a partition of the
``default`` pipeline beside it carries ``default``."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator, Callable

import pytest

if not os.environ.get("CI"):
    pytest.importorskip("opentelemetry.sdk.trace",
                        reason="tracing needs the otel extra: pip install -e '.[test,otel]'")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from processor import AsyncClient, NewItem
from processor.observe.logs import JsonFormatter
from processor.observe.metrics import PrometheusHooks
from processor.observe.tracing import CallSpans
from tests.support.engine import running
from watcher import Result, Store, Watcher, WatcherConfig, WorkItem
from watcher.protocol import ReduceCall, ReduceResult

FAST = {"poll_interval": 0.05, "lease_duration": 3.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2}
ITEMS = 3


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


def samples(hooks: PrometheusHooks) -> dict[str, list[dict[str, str]]]:
    """The labels of every sample of the scrape, by sample name (values left out)."""
    found: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(hooks.render().decode()):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(dict(sample.labels))
    return found


def value(hooks: PrometheusHooks, name: str, **labels: str) -> float:
    """The value of the sample ``name`` with exactly ``labels``."""
    for family in text_string_to_metric_families(hooks.render().decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    raise AssertionError(f"no sample {name}{labels}")


async def test_metrics_logs_and_spans_carry_the_partitions_pipeline(
        make_store: Callable[..., Store], client: AsyncClient,
        caplog: pytest.LogCaptureFixture) -> None:
    await client.create_partition("inv", [NewItem(f"i{n}", b"") for n in range(ITEMS)],
                                  reduce_gates=[1], pipeline="invoices")
    await client.create_partition("plain", [NewItem("a", b"")])

    async def process(item: WorkItem) -> Result:
        return Result(gate=1) if item.gate == 0 else Result(done=True)

    async def reduce(call: ReduceCall) -> ReduceResult:
        return ReduceResult(result=b"{}")

    hooks, exporter = PrometheusHooks(), InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    watcher = Watcher(make_store(), process, WatcherConfig(owner_id="w", **FAST), hooks,
                      reduce=reduce, tracer=CallSpans(provider))
    with caplog.at_level(logging.DEBUG, logger="watcher"):
        async with running(watcher):
            for partition_id in ("inv", "plain"):
                assert (await client.wait(partition_id, timeout=30)).status == "complete"

    # Metrics: each per-item and per-partition series of each partition's pipeline.
    assert value(hooks, "statefeed_items_total", outcome="advanced",
                 pipeline="invoices") == ITEMS
    assert value(hooks, "statefeed_handler_seconds_count", gate="0", outcome="advanced",
                 pipeline="invoices") == ITEMS
    assert value(hooks, "statefeed_gate_advances_total", pipeline="invoices") == 1
    assert value(hooks, "statefeed_partitions_closed_total", status="complete",
                 pipeline="invoices") == 1
    assert value(hooks, "statefeed_reduce_calls_total", outcome="applied",
                 pipeline="invoices", **{"pass": "all"}) == 1
    assert value(hooks, "statefeed_reduce_seconds_count", pipeline="invoices",
                 **{"pass": "all"}) == 1
    assert value(hooks, "statefeed_items_total", outcome="complete", pipeline="default") == 1
    assert value(hooks, "statefeed_partitions_closed_total", status="complete",
                 pipeline="default") == 1
    found = samples(hooks)
    for name in ("statefeed_items_total", "statefeed_handler_seconds_count",
                 "statefeed_gate_advances_total", "statefeed_partitions_closed_total"):
        assert {labels["pipeline"] for labels in found[name]} == {"invoices", "default"}, name

    # Logs: every engine line naming the partition names its pipeline.
    lines = [record for record in caplog.records if "partition=inv " in record.getMessage()]
    actions = {record.getMessage().split()[0] for record in lines}
    assert {"action=lease_acquired", "action=gate_advanced", "action=gate_reduced",
            "action=partition_closed"} <= actions, actions
    for record in lines:
        assert "partition=inv pipeline=invoices " in record.getMessage(), record.getMessage()
    closed = next(record for record in lines
                  if record.getMessage().startswith("action=partition_closed"))
    assert json.loads(JsonFormatter().format(closed))["pipeline"] == "invoices"

    # Spans: each call and the reduce of the partition carry its pipeline.
    spans = exporter.get_finished_spans()
    of_inv = [span for span in spans if span.attributes["statefeed.partition"] == "inv"]
    assert sorted(span.name for span in of_inv) == (
        ["statefeed.process"] * ITEMS + ["statefeed.reduce"])
    assert {span.attributes["statefeed.pipeline"] for span in of_inv} == {"invoices"}
    assert {span.attributes["statefeed.pipeline"] for span in spans
            if span.attributes["statefeed.partition"] == "plain"} == {"default"}


async def test_spawned_items_are_counted_under_their_partitions_pipeline(
        make_store: Callable[..., Store], client: AsyncClient) -> None:
    await client.create_partition("crawl", [NewItem("root", b"")], pipeline="crawls")

    async def process(item: WorkItem) -> Result:
        if item.id == "root":
            return Result(done=True, spawn=[NewItem(f"page{n}", b"") for n in range(4)])
        return Result(done=True)

    hooks = PrometheusHooks()
    # Before any work, the default pipeline's series are there at 0.
    assert value(hooks, "statefeed_items_spawned_total", pipeline="default") == 0
    assert value(hooks, "statefeed_stale_results_total", pipeline="default") == 0
    watcher = Watcher(make_store(), process, WatcherConfig(owner_id="w", **FAST), hooks)
    async with running(watcher):
        assert (await client.wait("crawl", timeout=30)).status == "complete"
    assert value(hooks, "statefeed_items_spawned_total", pipeline="crawls") == 4
    assert value(hooks, "statefeed_items_spawned_total", pipeline="default") == 0
