"""A completion's span links to the call that parked the item, on every live database:
the parking call's span (over HTTP, a real uvicorn handler) is stored with its wait,
and the completion through the API's route, the client and the operator's path each
records ``statefeed.complete`` with a link to it; a completion that parks the item
again stores its caller's span for the next one. No span carries a token."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import httpx
import pytest

if not os.environ.get("CI"):
    pytest.importorskip("opentelemetry.sdk.trace", reason="tracing needs the otel extra: "
                                                          "pip install -e '.[test,otel]'")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import handlers
from processor import AsyncClient, Client, NewItem
from processor.api.server import ApiOptions, api_running
from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from processor.observe.tracing import CallSpans
from tests.support.engine import running, wait_until
from tests.support.servers import serve_app
from watcher import Result, Store, Wait, Watcher, WatcherConfig, WorkItem
from watcher.store.db.urls import parse_database_url

FAST = {"poll_interval": 0.05, "lease_duration": 3.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2}


class Traces:
    """A tracer provider of the test's own (never the global one), kept in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("test")

    def spans(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.exporter.get_finished_spans() if span.name == name]


class Asker:
    """Gate 0 parks every item for an hour, keeping each call's token; gate 1 is done."""

    def __init__(self) -> None:
        self.tokens: dict[str, str] = {}

    def ask(self, item: handlers.Item) -> handlers.Result:
        self.tokens[item.id] = item.completion_token
        return handlers.Result(wait={"timeout": 3600})

    def done(self, item: handlers.Item) -> handlers.Result:
        return handlers.Result(done=True)


def _key(span: ReadableSpan) -> tuple[int, int]:
    return span.context.trace_id, span.context.span_id


def _links(span: ReadableSpan) -> list[tuple[int, int]]:
    return [(link.context.trace_id, link.context.span_id) for link in span.links]


def _texts(span: ReadableSpan) -> list[str]:
    """Every text a span carries: name, attributes, status, events, links' attributes."""
    texts = [span.name, str(dict(span.attributes or {})), span.status.description or ""]
    texts += [f"{event.name} {dict(event.attributes or {})}" for event in span.events]
    texts += [str(dict(link.attributes or {})) for link in span.links]
    return texts


async def test_each_completion_span_links_to_the_call_that_parked_its_item(
        db_url: str, table_prefix: str, make_store: Callable[..., Store]) -> None:
    traces = Traces()
    url = parse_database_url(db_url)
    client = AsyncClient(url, table_prefix, tracer_provider=traces.provider)
    await client.create_partition("p", [NewItem(name, b"1") for name in ("a", "b", "c")])
    asker = Asker()
    async with serve_app(handlers.app({0: asker.ask, 1: asker.done})) as handler_url, \
            api_running(ApiOptions(url, table_prefix, port=0), client) as api_url, \
            httpx.AsyncClient(base_url=api_url, timeout=30) as http:
        processor = HttpProcessor(HttpProcessorConfig(handler_url=f"{handler_url}/"),
                                  call_tracer=CallSpans(traces.provider))
        try:
            async with running(Watcher(make_store(), processor,
                                       WatcherConfig(owner_id="w1", **FAST))):
                async def parked() -> bool:
                    return len(await client.items("p", status="waiting")) == 3
                await wait_until(parked, message="a, b and c parked")
                # The API's route, as an outside system would call it.
                done = await http.post(f"v1/completions/{asker.tokens['a']}",
                                       json={"gate": 1})
                assert done.status_code == 200, done.text
                again = await http.post(f"v1/completions/{asker.tokens['a']}", json={})
                assert again.status_code == 409
                # The client, inside a span of its caller, parking b again.
                with traces.tracer.start_as_current_span("approver") as approver:
                    parked_again = await client.complete(asker.tokens["b"], done=False,
                                                         wait=600)
                assert parked_again.completion_token is not None
                await client.complete(parked_again.completion_token, gate=1)
                # The operator's path (the console's Complete form).
                await client.complete_item("p", "c", done=True, data={"by": "operator"})
                info = await client.wait("p", timeout=30)
                assert info.status == "complete"
        finally:
            await processor.aclose()
    await client.close()

    parking = {span.attributes["statefeed.item"]: span
               for span in traces.spans("statefeed.process")
               if span.attributes["statefeed.gate"] == 0}
    assert set(parking) == {"a", "b", "c"}
    completions = traces.spans("statefeed.complete")
    applied = [span for span in completions
               if span.attributes.get("statefeed.outcome") == "completed"]
    by_item: dict[str, list[ReadableSpan]] = {}
    for span in applied:
        by_item.setdefault(str(span.attributes["statefeed.item"]), []).append(span)
    assert {item: len(spans) for item, spans in by_item.items()} == {"a": 1, "b": 2, "c": 1}
    for item in ("a", "c"):
        (span,) = by_item[item]
        assert _links(span) == [_key(parking[item])], item
        assert span.attributes["statefeed.partition"] == "p"
    assert dict(by_item["a"][0].attributes or {}) == {
        "statefeed.partition": "p", "statefeed.item": "a", "statefeed.gate": 1,
        "statefeed.status": "available", "statefeed.outcome": "completed"}
    first_b, second_b = sorted(by_item["b"], key=lambda span: span.start_time or 0)
    assert _links(first_b) == [_key(parking["b"])]
    assert first_b.parent is not None and first_b.parent.span_id == approver.get_span_context(
        ).span_id, "a client's completion span is a child of its caller's span"
    assert first_b.attributes["statefeed.status"] == "waiting"
    (approved,) = traces.spans("approver")
    assert _links(second_b) == [_key(approved)], \
        "a wait a completion began links to the completer's span"
    (refused,) = [span for span in completions if span not in applied]
    assert refused.attributes["statefeed.outcome"] == "refused" and not refused.links
    assert refused.status.status_code.name == "ERROR"
    for span in traces.exporter.get_finished_spans():
        for text in _texts(span):
            for token in [*asker.tokens.values(), parked_again.completion_token]:
                assert token not in text, span.name


class BatchParker:
    """A library-mode processor whose batch call parks every item at gate 0."""

    def __init__(self) -> None:
        self.tokens: dict[str, str] = {}

    async def process(self, item: WorkItem) -> Result:
        raise AssertionError("process_batch is called instead")

    async def process_batch(self, items: list[WorkItem]) -> list[Result | Exception]:
        answers: list[Result | Exception] = []
        for item in items:
            if item.gate == 0:
                self.tokens[item.id] = item.completion_token
                answers.append(Result(wait=Wait(600)))
            else:
                answers.append(Result(done=True))
        return answers


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_a_batch_call_that_parks_is_the_span_its_completions_link_to(
        db_url: str, table_prefix: str, make_store: Callable[..., Store]) -> None:
    traces = Traces()
    client = AsyncClient(db_url, table_prefix, tracer_provider=traces.provider)
    await client.create_partition("p", [NewItem(f"i{n}", b"1") for n in range(3)])
    processor = BatchParker()
    async with running(Watcher(make_store(), processor, WatcherConfig(owner_id="w", **FAST),
                               tracer=CallSpans(traces.provider))):
        await wait_until(lambda: len(processor.tokens) == 3, message="three parked")

        async def parked() -> bool:
            return len(await client.items("p", status="waiting")) == 3
        await wait_until(parked, message="three waiting")
        *first, last = processor.tokens.values()
        for token in first:
            await client.complete(token, gate=1)
        with Client(db_url, table_prefix, tracer_provider=traces.provider) as sync, \
                traces.tracer.start_as_current_span("script") as script:
            # The sync client runs on a loop of its own; the caller's span is the parent.
            await asyncio.to_thread(sync.complete, last, gate=1)
        assert (await client.wait("p", timeout=30)).status == "complete"
    await client.close()
    batches = {_key(span) for span in traces.spans("statefeed.process_batch")
               if span.attributes["statefeed.gate"] == 0}
    completions = traces.spans("statefeed.complete")
    assert len(completions) == 3
    for span in completions:
        [link] = _links(span)
        assert link in batches
    [child] = [span for span in completions if span.parent is not None]
    assert child.parent.span_id == script.get_span_context().span_id
