"""OpenTelemetry tracing end to end: a span around ``create_partition`` is linked from the
span of every handler call and of the reduce, in library mode and over HTTP (a real
uvicorn handler on loopback), on SQLite and PostgreSQL; an OpenTelemetry-instrumented
Starlette handler joins the trace through ``traceparent``; with tracing off nothing is
sent and nothing is stored.

Every tracer provider here is the test's own (never the global one), so the tests
around these run untraced.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

# Without the otel extra these tests skip, naming it; under CI (which installs it) the
# imports below fail instead.
if not os.environ.get("CI"):
    for module in ("opentelemetry.sdk.trace", "opentelemetry.instrumentation.asgi"):
        pytest.importorskip(module, reason="tracing needs the otel extra: "
                                           "pip install -e '.[test,otel]'")

from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import handlers
from processor import AsyncClient, NewItem
from processor.api.server import ApiOptions, api_running
from processor.http.batch import BatchingHttpProcessor
from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from processor.observe.tracing import CallSpans
from tests.support.engine import running
from tests.support.servers import answered_probe, read_body, send_json, serve_app
from watcher import Result, Store, Watcher, WatcherConfig, WorkItem
from watcher.protocol import ReduceCall, ReduceResult
from watcher.store.db.urls import parse_database_url

FAST = {"poll_interval": 0.05, "lease_duration": 3.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2, "shutdown_timeout": 5.0}
WAIT = 30.0
ITEMS = 4
ROOT = Path(__file__).resolve().parents[2]

# SQLite and PostgreSQL: what the trace context crosses is the partition row, the same
# statement on every database (the SQL catalogue covers the rest).
both_databases = pytest.mark.parametrize(
    "db_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)


class Traces:
    """A tracer provider of the test's own, whose finished spans are kept in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("test")

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [span for span in self.exporter.get_finished_spans()
                if name is None or span.name == name]


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


async def create_traced(client: AsyncClient, traces: Traces, partition_id: str, *,
                        reduce_gates: Sequence[int] = ()) -> ReadableSpan:
    """Create ``partition_id`` (``ITEMS`` items) inside a span; return that span."""
    with traces.tracer.start_as_current_span("create order"):
        await client.create_partition(
            partition_id, [NewItem(f"i{n}", json.dumps(n).encode()) for n in range(ITEMS)],
            reduce_gates=reduce_gates)
    (created,) = traces.spans("create order")
    return created


def assert_linked(span: ReadableSpan, to: ReadableSpan) -> None:
    """``span`` starts a trace of its own and links to ``to``."""
    assert span.parent is None, f"{span.name} has a parent: one giant trace"
    assert span.context.trace_id != to.context.trace_id
    links = [(link.context.trace_id, link.context.span_id) for link in span.links]
    assert links == [(to.context.trace_id, to.context.span_id)], (span.name, span.attributes)


async def until_done(client: AsyncClient, partition_id: str) -> None:
    info = await client.wait(partition_id, timeout=WAIT)
    assert info.status == "complete", (info.status, info.last_error)


# --------------------------------------------------------------------------- library mode


@both_databases
async def test_library_mode_links_every_call_and_the_reduce_to_the_creators_trace(
        make_store: Callable[..., Store], client: AsyncClient) -> None:
    traces = Traces()
    created = await create_traced(client, traces, "p", reduce_gates=[1])

    async def process(item: WorkItem) -> Result:
        if item.attempt == 1 and item.id == "i2":
            raise RuntimeError("a first attempt that fails")
        return Result(gate=1)

    async def reduce(call: ReduceCall) -> ReduceResult:
        return ReduceResult(result=b"4")

    watcher = Watcher(make_store(), process, WatcherConfig(owner_id="w", **FAST),
                      reduce=reduce, tracer=CallSpans(traces.provider))
    async with running(watcher):
        await until_done(client, "p")

    calls = traces.spans("statefeed.process")
    assert sorted((span.attributes["statefeed.item"], span.attributes["statefeed.attempt"])
                  for span in calls) == [("i0", 1), ("i1", 1), ("i2", 1), ("i2", 2), ("i3", 1)]
    for span in calls:
        assert_linked(span, created)
        assert span.attributes["statefeed.partition"] == "p"
        assert span.attributes["statefeed.gate"] == 0
    failed = next(span for span in calls if span.attributes["statefeed.attempt"] == 1
                  and span.attributes["statefeed.item"] == "i2")
    assert failed.attributes["statefeed.outcome"] == "retryable_error"
    assert failed.status.status_code.name == "ERROR"
    assert "a first attempt that fails" in (failed.status.description or "")
    assert {span.attributes["statefeed.outcome"] for span in calls if span is not failed} == {
        "next_gate"}
    (reduced,) = traces.spans("statefeed.reduce")
    assert_linked(reduced, created)
    assert dict(reduced.attributes or {}) == {
        "statefeed.partition": "p", "statefeed.pipeline": "default", "statefeed.gate": 1,
        "statefeed.attempt": 1,
        "statefeed.reduce.pass": "all", "statefeed.reduce.page": 0, "statefeed.items": ITEMS,
        "statefeed.outcome": "answered"}


class BatchProcessor:
    """A library-mode processor that takes each read's items in one call."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    async def process(self, item: WorkItem) -> Result:
        raise AssertionError("process_batch is called instead")

    async def process_batch(self, items: Sequence[WorkItem]) -> list[Result | Exception]:
        self.batches.append(len(items))
        return [Result(done=True) if item.id != "i3" else ValueError("no i3")
                for item in items]


@both_databases
async def test_library_batch_calls_are_spans_with_their_item_count(
        make_store: Callable[..., Store], client: AsyncClient) -> None:
    traces = Traces()
    created = await create_traced(client, traces, "p")
    processor = BatchProcessor()
    watcher = Watcher(make_store(), processor,
                      WatcherConfig(owner_id="w", max_retries=0, **FAST),
                      tracer=CallSpans(traces.provider))
    async with running(watcher):
        info = await client.wait("p", timeout=WAIT)
    assert info.status == "failed"
    batches = traces.spans("statefeed.process_batch")
    assert [span.attributes["statefeed.items"] for span in batches] == processor.batches
    assert sum(processor.batches) == ITEMS
    for span in batches:
        assert_linked(span, created)
    assert sum(span.attributes["statefeed.failed_items"] for span in batches) == 1
    assert any(span.status.status_code.name == "ERROR" for span in batches)


# --------------------------------------------------------------------------- over HTTP


def instrumented_handler(server: Traces) -> Any:
    """A plain Starlette handler of the HTTP contract, instrumented with OpenTelemetry's
    ASGI middleware only: not a line of statefeed in it."""

    async def step(request: Request) -> JSONResponse:
        await request.body()
        gate = int(request.headers["x-gate"])
        return JSONResponse({"gate": 1} if gate == 0 else {"done": True})

    async def reduce(request: Request) -> JSONResponse:
        call = await request.json()
        return JSONResponse({"result": len(call["items"])})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    app = Starlette(routes=[Route("/", step, methods=["POST"]),
                            Route("/", health, methods=["GET"]),
                            Route("/reduce", reduce, methods=["POST"])])
    return OpenTelemetryMiddleware(app, tracer_provider=server.provider)


def server_spans(server: Traces) -> list[ReadableSpan]:
    """The instrumented handler's server spans (not its send and receive spans)."""
    return [span for span in server.spans() if span.kind.name == "SERVER"]


@both_databases
async def test_an_instrumented_handler_joins_the_trace_of_every_call_and_the_reduce(
        make_store: Callable[..., Store], client: AsyncClient) -> None:
    traces, server = Traces(), Traces()
    created = await create_traced(client, traces, "p", reduce_gates=[1])
    async with serve_app(instrumented_handler(server)) as url:
        processor = HttpProcessor(HttpProcessorConfig(handler_url=url + "/"),
                                  call_tracer=CallSpans(traces.provider))
        watcher = Watcher(make_store(), processor, WatcherConfig(owner_id="w", **FAST))
        try:
            async with running(watcher):
                await until_done(client, "p")
        finally:
            await processor.aclose()

    calls = traces.spans("statefeed.process") + traces.spans("statefeed.reduce")
    assert len(calls) == ITEMS + 1
    for span in calls:
        assert_linked(span, created)
        assert span.kind.name == "CLIENT"
    served = server_spans(server)
    # The reduce's shape question (GET /reduce, answered 405) is not a call: untraced.
    posted = [span for span in served if span.attributes.get("http.request.method",
                                                            span.attributes.get("http.method"))
              == "POST"]
    assert len(posted) == len(calls)
    parents = {(span.context.trace_id, span.context.span_id): span for span in calls}
    for span in posted:
        assert span.parent is not None, span.name
        parent = parents[(span.parent.trace_id, span.parent.span_id)]
        assert span.context.trace_id == parent.context.trace_id
    assert {parents[(s.parent.trace_id, s.parent.span_id)].name for s in posted if s.parent} == {
        "statefeed.process", "statefeed.reduce"}


@both_databases
async def test_a_batch_request_is_a_span_linked_to_the_calls_it_carries(
        make_store: Callable[..., Store], client: AsyncClient) -> None:
    traces, server = Traces(), Traces()
    created = await create_traced(client, traces, "p")
    app = OpenTelemetryMiddleware(handlers.app(lambda item: handlers.Result(done=True)),
                                  tracer_provider=server.provider)
    async with serve_app(app) as url:
        processor = BatchingHttpProcessor(HttpProcessorConfig(handler_url=url + "/"),
                                          batch_size=ITEMS,
                                          call_tracer=CallSpans(traces.provider))
        watcher = Watcher(make_store(), processor, WatcherConfig(owner_id="w", **FAST))
        try:
            async with running(watcher):
                await until_done(client, "p")
        finally:
            await processor.aclose()

    calls = traces.spans("statefeed.process")
    assert len(calls) == ITEMS
    for span in calls:
        assert_linked(span, created)
    requests = traces.spans("statefeed.http_batch")
    assert sum(span.attributes["statefeed.items"] for span in requests) == ITEMS
    call_ids = {(span.context.trace_id, span.context.span_id) for span in calls}
    linked = [(link.context.trace_id, link.context.span_id)
              for span in requests for link in span.links]
    assert sorted(linked) == sorted(call_ids)
    served = server_spans(server)
    request_ids = {span.context.span_id for span in requests}
    assert len(served) == len(requests)
    assert {span.parent.span_id for span in served if span.parent} == request_ids


# --------------------------------------------------------------------------- tracing off


@both_databases
async def test_with_tracing_off_no_traceparent_is_sent_and_no_context_stored(
        make_store: Callable[..., Store], client: AsyncClient) -> None:
    seen: list[dict[str, str]] = []

    async def recording(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await answered_probe(scope, send):
            return
        await read_body(receive)
        seen.append({name.decode().lower(): value.decode() for name, value in scope["headers"]})
        await send_json(send, 200, {"done": True})

    await client.create_partition("p", [NewItem(f"i{n}", b"x") for n in range(ITEMS)])
    store = make_store()
    (row,) = await store.leases_read_free(10)
    assert row.settings.trace_context is None
    async with serve_app(recording) as url:
        processor = HttpProcessor(HttpProcessorConfig(handler_url=url + "/"))
        assert processor.call_tracer is None  # no tracer provider set: off
        watcher = Watcher(store, processor, WatcherConfig(owner_id="w", **FAST))
        try:
            async with running(watcher):
                await until_done(client, "p")
        finally:
            await processor.aclose()
    assert len(seen) == ITEMS
    assert not any("traceparent" in headers or "tracestate" in headers for headers in seen)


@both_databases
async def test_the_creators_context_is_what_the_lease_reads(
        make_store: Callable[..., Store], client: AsyncClient) -> None:
    traces = Traces()
    created = await create_traced(client, traces, "p")
    (row,) = await make_store().leases_read_free(10)
    stored = json.loads(row.settings.trace_context or "{}")
    assert stored == {"traceparent": f"00-{created.context.trace_id:032x}-"
                                     f"{created.context.span_id:016x}-"
                                     f"{created.context.trace_flags:02x}"}


# --------------------------------------------------------------------------- ingest API


@both_databases
async def test_the_ingest_api_stores_the_traceparent_it_was_sent(
        make_store: Callable[..., Store], db_url: str, table_prefix: str) -> None:
    import httpx

    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    options = ApiOptions(parse_database_url(db_url), table_prefix, port=0)
    async with api_running(options) as url, httpx.AsyncClient(base_url=url) as api:
        body = {"items": [{"id": "a", "data": 1}]}
        traced = await api.put("/v1/partitions/traced", json=body,
                               headers={"traceparent": parent, "tracestate": "k=v"})
        untraced = await api.put("/v1/partitions/untraced", json=body,
                                 headers={"traceparent": "00-not-a-context"})
        assert (traced.status_code, untraced.status_code) == (201, 201), traced.text
        again = await api.put("/v1/partitions/traced", json=body,
                              headers={"traceparent": parent.replace("00f0", "11f0")})
        assert again.headers["idempotent-replayed"] == "true"  # the same request
    contexts = {row.id: row.settings.trace_context
                for row in await make_store().leases_read_free(10)}
    assert contexts == {"traced": json.dumps({"traceparent": parent, "tracestate": "k=v"},
                                             separators=(",", ":")),
                        "untraced": None}


# --------------------------------------------------------------------------- turned on


def test_an_application_tracer_provider_turns_tracing_on_and_the_env_configures_it(
        tmp_path: Path) -> None:
    """In a process of its own (a global tracer provider is set once per process): a
    watcher traces with the provider the application set; without one it does not;
    ``OTEL_TRACES_EXPORTER`` sets one (``processor run`` does this at start)."""
    script = textwrap.dedent(f"""
        import asyncio
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from processor.observe.tracing import configure_from_env
        from watcher import Result, Store, Watcher
        from watcher.store.db.migrate import upgrade

        async def process(item):
            return Result(done=True)

        db = "sqlite:///{tmp_path / 'auto.db'}"
        upgrade(db)
        store = Store.open(db)
        assert Watcher(store, process)._tracer is None, "traced without a provider"
        assert configure_from_env({{}}) is False
        assert configure_from_env({{"OTEL_TRACES_EXPORTER": "console"}}) is True
        assert isinstance(trace.get_tracer_provider(), TracerProvider)
        assert Watcher(store, process)._tracer is not None, "not traced with a provider"
        asyncio.run(store.close())
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_asking_for_an_exporter_that_is_not_installed_says_so() -> None:
    from processor.observe.tracing import configure_from_env
    from watcher.errors import ConfigError

    with pytest.raises(ConfigError, match="'no-such-exporter', which is not installed"):
        configure_from_env({"OTEL_TRACES_EXPORTER": "no-such-exporter"})
