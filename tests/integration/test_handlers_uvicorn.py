"""The handlers SDK served by a real uvicorn on loopback, called over real HTTP.

Besides plain httpx requests, the processor's own :class:`HttpProcessor` calls
the SDK here, so both sides of the HTTP handler contract are checked against
each other; one test runs the resume example through the whole engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

import handlers
from handlers import Fail, Item, Result, Retry
from handlers.examples import echo, resumes, samples
from processor import AsyncClient, NewItem
from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from tests.support.engine import running
from tests.support.servers import serve_app
from watcher import Result as EngineResult
from watcher import Watcher, WatcherConfig
from watcher.protocol import NonRetryableError, RetryableError, ThrottledError, WorkItem
from watcher.store import Store
from watcher.store.db.migrate import upgrade

HEADERS = {"X-Partition-Id": "opening-42", "X-Item-Id": "resume-1", "X-Gate": "0",
           "X-Attempt": "1", "Idempotency-Key": "key-1"}
WAIT = 10.0


@contextlib.asynccontextmanager
async def served(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    """Serve ``app`` under uvicorn for the block; yields an httpx client on its URL."""
    async with serve_app(app) as url, httpx.AsyncClient(base_url=url) as client:
        yield client


def work_item(data: bytes = b"{}", *, gate: int = 0, item_id: str = "resume-1",
              partition_id: str = "opening-42", attempt: int = 1) -> WorkItem:
    return WorkItem(partition_id=partition_id, id=item_id, gate=gate, attempt=attempt,
                    data=data, version=1, idempotency_key=f"{partition_id}/{item_id}/{gate}")


async def test_echo_over_keep_alive_connections() -> None:
    async with served(echo.app) as client:
        answers = [await client.post("/", content=bytes([n]) * 3, headers=HEADERS)
                   for n in range(5)]
        health = await client.get("/healthz")
    for answer in answers:
        assert (answer.status_code, answer.content) == (200, b'{"done":true}')
        assert answer.headers["content-type"] == "application/json"
        assert answer.headers.get("transfer-encoding") is None  # sized, not chunked
    assert (health.status_code, health.json()) == (200, {"status": "ok"})


async def test_an_oversized_body_is_refused_and_the_server_keeps_serving() -> None:
    app = handlers.app(echo.echo, max_body_bytes=1024)
    async with served(app) as client:
        refused = await client.post("/", content=b"x" * 4096, headers=HEADERS)
        accepted = await client.post("/", content=b"x" * 1024, headers=HEADERS)
    assert refused.status_code == 413
    assert refused.json()["error"]["no_retry"] is True
    assert accepted.status_code == 200


async def test_sync_handlers_run_in_parallel_threads_under_uvicorn() -> None:
    parallel = 8
    # Every call waits for all the others: passes only if the calls overlap.
    barrier = threading.Barrier(parallel, timeout=WAIT)

    def meet(item: Item) -> Result:
        return Result(done=True, data=barrier.wait())

    async with served(handlers.app(meet)) as client:
        answers = await asyncio.gather(*(
            client.post("/", content=b"", headers={**HEADERS, "X-Item-Id": f"r{n}"})
            for n in range(parallel)))
    assert [answer.status_code for answer in answers] == [200] * parallel
    assert sorted(answer.json()["data"] for answer in answers) == list(range(parallel))


async def test_retry_after_reaches_the_client_as_a_header() -> None:
    async def later(item: Item) -> Result:
        raise Retry("model is warming up", retry_after=0.2)

    async with served(handlers.app(later)) as client:
        answer = await client.post("/", content=b"", headers=HEADERS)
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "1"
    assert answer.json() == {"error": {"message": "model is warming up", "no_retry": False,
                                       "retry_after": 0.2}}


async def test_the_resume_example_over_http_matches_its_pure_functions() -> None:
    documents = samples.sample_resumes(12, seed=3)
    async with served(resumes.app) as client:

        async def through_both_gates(number: int, document: bytes) -> bytes:
            headers = {**HEADERS, "X-Item-Id": f"resume-{number}"}
            first = await client.post("/", content=document, headers=headers)
            assert first.status_code == 200, first.text
            assert first.json()["gate"] == 1
            stored = json.dumps(first.json()["data"], separators=(",", ":")).encode()
            second = await client.post("/", content=stored, headers={**headers, "X-Gate": "1"})
            assert second.status_code == 200, second.text
            assert second.json()["done"] is True
            return json.dumps(second.json()["data"]).encode()

        finals = await asyncio.gather(*(through_both_gates(n, document)
                                        for n, document in enumerate(documents)))
    expected = []
    for document in documents:
        classified = resumes.classify(json.loads(document))
        score = resumes.final_score(classified)
        expected.append(json.dumps({**classified, "score": score,
                                    "tier": resumes.tier(score)}).encode())
    assert resumes.top_candidates(finals, 5) == resumes.top_candidates(expected, 5)
    assert len(resumes.top_candidates(finals, 100)) == 12


# --------------------------------------------------------------------------- the processor side


async def contract_handler(item: Item) -> Result:
    """Answers according to the item id, so one server covers every case."""
    match item.id:
        case "json":
            return Result(gate=item.gate + 1, data={"n": 1, "text": "é"})
        case "bytes":
            return Result(done=True, data=b"\x00\xff" + item.data)
        case "keep":
            return Result(gate=3)
        case "none-data":
            return Result(done=True, data=None)
        case "retry":
            raise Retry("busy", retry_after=2)
        case "fail":
            raise Fail("never")
        case "bug":
            raise ValueError("boom")
        case "bad-json":
            item.json()
        case "forgot-return":
            return None  # type: ignore[return-value]
    # Any other id: echo what arrived, to check the headers round trip.
    return Result(done=True, data={"id": item.id, "partition": item.partition_id,
                                   "key": item.idempotency_key, "gate": item.gate,
                                   "attempt": item.attempt})


@pytest.fixture
async def processor() -> Any:
    async with serve_app(handlers.app(contract_handler)) as url:
        http = HttpProcessor(HttpProcessorConfig(handler_url=f"{url}/", request_timeout=WAIT))
        try:
            yield http
        finally:
            await http.aclose()


@pytest.mark.parametrize(("item_id", "expected"), [
    ("json", EngineResult(gate=1, data='{"n":1,"text":"é"}'.encode())),
    ("bytes", EngineResult(done=True, data=b"\x00\xffraw")),
    ("keep", EngineResult(gate=3, data=None)),
    ("none-data", EngineResult(done=True, data=b"null")),
])
async def test_the_processor_reads_results_as_the_sdk_meant_them(
        processor: HttpProcessor, item_id: str, expected: EngineResult) -> None:
    assert await processor.process(work_item(b"raw", item_id=item_id)) == expected


async def test_ids_that_need_percent_encoding_reach_the_handler_unchanged(
        processor: HttpProcessor) -> None:
    item = work_item(item_id="résumé 7%/ü", partition_id="opening 42\u2603", gate=4,
                     attempt=3)
    result = await processor.process(item)
    assert json.loads(result.data or b"") == {
        "id": "résumé 7%/ü", "partition": "opening 42\u2603",
        "key": "opening 42\u2603/résumé 7%/ü/4", "gate": 4, "attempt": 3}


@pytest.mark.parametrize(("item_id", "error", "fragment"), [
    ("retry", ThrottledError, "HTTP 503: busy"),  # a 503 with Retry-After
    ("fail", NonRetryableError, "HTTP 422: never"),
    ("bug", RetryableError, "HTTP 500: ValueError: boom"),
    ("bad-json", NonRetryableError, "HTTP 400: data is not valid JSON"),
    ("forgot-return", RetryableError, "returned None"),
])
async def test_the_processor_classifies_sdk_errors_as_the_sdk_meant_them(
        processor: HttpProcessor, item_id: str, error: type, fragment: str) -> None:
    with pytest.raises(error) as raised:
        await processor.process(work_item(b"not json", item_id=item_id))
    assert type(raised.value) is error
    assert fragment in raised.value.message
    # The item's row and the engine's log fields name the partition, item, gate and
    # attempt: neither the processor nor the SDK puts them in the message.
    message = raised.value.message
    assert message.startswith("the handler "), message
    for context in ("opening-42", repr(item_id), "gate 0", "attempt"):
        assert context not in message, (context, message)
    if item_id == "retry":
        assert raised.value.retry_after == 2.0


async def test_the_resume_pipeline_runs_through_the_engine(tmp_path) -> None:
    db_url = f"sqlite:///{tmp_path / 'resumes.db'}"
    await asyncio.to_thread(upgrade, db_url)
    documents = samples.sample_resumes(24, seed=11)
    async with serve_app(resumes.app) as url, AsyncClient(db_url) as client:
        store = Store.open(db_url)
        http = HttpProcessor(HttpProcessorConfig(handler_url=f"{url}/", request_timeout=WAIT))
        watcher = Watcher(store, http, WatcherConfig(owner_id="t", concurrency=8,
                                                     poll_interval=0.05, lease_duration=3.0))
        try:
            await client.create_partition("opening-42", [
                NewItem(f"resume-{n:02}", document) for n, document in enumerate(documents)])
            async with running(watcher):
                info = await client.wait("opening-42", timeout=30)
            items = await client.items("opening-42")
        finally:
            await http.aclose()
            await store.close()
    assert (info.status, info.counts) == ("complete", {"complete": 24})
    best = resumes.top_candidates([item.data for item in items], 3)
    assert len(best) == 3
    assert best[0]["score"] >= best[1]["score"] >= best[2]["score"]
    by_id = {item.id: json.loads(item.data) for item in items}
    first = resumes.classify(json.loads(documents[0]))
    assert by_id["resume-00"]["score"] == resumes.final_score(first)
    assert by_id["resume-00"]["role"] == first["role"]
