"""The SDK's reduce route driven in-process through httpx's ASGI transport."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

import handlers
from handlers import Fail, Item, Reduce, Reduced, ReducePage, Result


@contextlib.asynccontextmanager
async def client_for(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://handler") as client:
        yield client


def request(pass_: str = "all", *, page: int = 0, last: bool = True,
            accumulator: Any = None, items: list[tuple[str, Any]] | None = None,
            failed: tuple[str, ...] = ()) -> dict[str, Any]:
    entries = [{"item_id": item_id, "status": "failed" if item_id in failed else "available",
                "gate": 1, "last_error": "bad" if item_id in failed else None,
                "data_b64": base64.b64encode(json.dumps(value).encode()).decode()}
               for item_id, value in (items or [])]
    return {"partition_id": "p", "gate": 1, "attempt": 1, "pass": pass_, "page": page,
            "last": last, "idempotency_key": "k", "accumulator": accumulator,
            "items": entries}


SCORES = [("a", 3), ("b", 9), ("c", 5), ("d", 1)]


def keep_best(best: list[list[Any]] | None, items: list[Item]) -> list[list[Any]]:
    merged = (best or []) + [[item.id, item.json()] for item in items if not item.failed]
    return sorted(merged, key=lambda pair: -pair[1])[:2]


def mark(best: list[list[Any]], items: list[Item]) -> dict[str, Result]:
    top = [item_id for item_id, _ in best]
    return {item.id: Result(done=True, data={"rank": top.index(item.id) + 1})
            for item in items if item.id in top}


TOP2 = Reduce(fold=keep_best, apply=mark)


async def test_whole_gate_function_answers_items_default_and_result() -> None:
    def rank_all(page: ReducePage) -> Reduced:
        best = max(page.items, key=lambda item: item.json())
        return Reduced(items={best.id: Result(gate=2)}, result={"best": best.id})

    app = handlers.app({0: lambda item: Result(gate=1)}, reduce=rank_all)
    async with client_for(app) as client:
        answer = await client.post("/reduce", json=request(items=SCORES))
    assert answer.status_code == 200
    assert answer.json() == {"items": {"b": {"gate": 2}}, "result": {"best": "b"}}


async def test_whole_gate_function_refuses_a_paged_request_with_the_fix() -> None:
    app = handlers.app(lambda item: Result(done=True), reduce=lambda page: Reduced())
    async with client_for(app) as client:
        answer = await client.post("/reduce", json=request("fold", last=False, items=SCORES))
    assert answer.status_code == Fail.status
    assert answer.json()["error"]["no_retry"] is True
    assert "handlers.Reduce(fold=..., apply=...)" in answer.json()["error"]["message"]


async def test_a_reduce_object_with_a_plain_call_is_served_off_the_loop() -> None:
    """An object whose ``__call__(page)`` is not async is run on a worker thread."""
    import threading

    class Counting:
        def __init__(self) -> None:
            self.threads: list[str] = []

        def __call__(self, page: ReducePage) -> Reduced:
            self.threads.append(threading.current_thread().name)
            return Reduced(result={"items": len(page.items), "pass": page.pass_})

    reduce = Counting()
    app = handlers.app(lambda item: Result(done=True), reduce=reduce)
    async with client_for(app) as client:
        answer = await client.post("/reduce", json=request("fold", last=False, items=SCORES))
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"] == {"items": 4, "pass": "fold"}
    assert reduce.threads and reduce.threads[0] != threading.main_thread().name


async def test_reduce_serves_one_call_and_both_passes_with_the_same_functions() -> None:
    app = handlers.app(lambda item: Result(done=True), reduce=TOP2)
    async with client_for(app) as client:
        whole = (await client.post("/reduce", json=request(items=SCORES))).json()
        first = (await client.post("/reduce", json=request(
            "fold", last=False, items=SCORES[:2]))).json()
        last = (await client.post("/reduce", json=request(
            "fold", page=1, accumulator=first["accumulator"], items=SCORES[2:]))).json()
        applied = (await client.post("/reduce", json=request(
            "apply", accumulator=last["accumulator"], items=SCORES[:2]))).json()
    assert whole == {"items": {"b": {"done": True, "data": {"rank": 1}},
                               "c": {"done": True, "data": {"rank": 2}}},
                     "result": [["b", 9], ["c", 5]]}
    assert first == {"accumulator": [["b", 9], ["a", 3]]}
    assert last == {"accumulator": [["b", 9], ["c", 5]], "result": [["b", 9], ["c", 5]]}
    assert applied == {"items": {"b": {"done": True, "data": {"rank": 1}}}}


async def test_failed_items_reach_the_reduce_with_their_error() -> None:
    seen: list[tuple[str, str, str | None]] = []

    def count(page: ReducePage) -> Reduced:
        seen.extend((item.id, item.status, item.last_error) for item in page.items)
        return Reduced(result={"failed": sum(item.failed for item in page.items)})

    app = handlers.app(lambda item: Result(done=True), reduce=count)
    async with client_for(app) as client:
        answer = await client.post("/reduce", json=request(items=SCORES, failed=("d",)))
    assert answer.json() == {"result": {"failed": 1}}
    assert ("d", "failed", "bad") in seen and ("a", "available", None) in seen


@pytest.mark.parametrize(("body", "message"), [
    (b"[1]", "reduce body is a JSON array"),
    (b"{", "not valid JSON"),
    (json.dumps({**request(), "pass": "sideways"}).encode(), "'pass' must be one of"),
    (json.dumps({**request(), "gate": -1}).encode(), "'gate' must be an integer"),
    (json.dumps({k: v for k, v in request().items() if k != "items"}).encode(), "'items'"),
    (json.dumps(request(items=[("a", 1)]) | {"items": [{"item_id": "a"}]}).encode(),
     "reduce item 0 has no"),
])
async def test_malformed_reduce_requests_are_refused_with_the_field(body: bytes,
                                                                    message: str) -> None:
    app = handlers.app(lambda item: Result(done=True), reduce=TOP2)
    async with client_for(app) as client:
        answer = await client.post("/reduce", content=body)
    assert answer.status_code == 400
    assert message in answer.json()["error"]["message"]


async def test_reduce_route_without_a_reduce_function_says_how_to_add_one() -> None:
    app = handlers.app(lambda item: Result(done=True))
    async with client_for(app) as client:
        answer = await client.post("/reduce", json=request())
    assert answer.status_code == 404
    assert "reduce=" in answer.json()["error"]["message"]


async def test_reduce_bug_is_a_retryable_500_and_bad_answer_says_why() -> None:
    def broken(page: ReducePage) -> Reduced:
        raise KeyError("oops")

    async with client_for(handlers.app(lambda item: Result(done=True),
                                       reduce=broken)) as client:
        answer = await client.post("/reduce", json=request())
    assert answer.status_code == 500 and answer.json()["error"]["no_retry"] is False

    async with client_for(handlers.app(lambda item: Result(done=True),
                                       reduce=lambda page: 42)) as client:
        answer = await client.post("/reduce", json=request())
    assert answer.status_code == 500
    message = answer.json()["error"]["message"]
    assert message.startswith("the reduce function returned int")
    # The processor puts the partition, gate, page and attempt before it: not said here.
    assert "partition" not in message and "page 0" not in message


async def test_resume_ranking_is_the_same_in_one_call_and_in_pages() -> None:
    from handlers.examples import resumes, samples

    documents = samples.sample_resumes(30, seed=5)
    classified = [json.dumps(resumes.classify(json.loads(d))).encode() for d in documents]
    items = [Item(id=f"r{n:02}", partition_id="p", gate=1, data=data)
             for n, data in enumerate(classified)]
    failed = Item(id="r99", partition_id="p", gate=0, data=b"{}", status="failed",
                  last_error="no text")
    whole = await resumes.RANK(ReducePage(partition_id="p", gate=1,
                                          items=(*items, failed)))
    accumulator = None
    pages = [items[:12], items[12:24], [*items[24:], failed]]
    for number, page in enumerate(pages):
        folded = await resumes.RANK(ReducePage(partition_id="p", gate=1, pass_="fold",
                                               page=number, last=number == 2,
                                               items=tuple(page), accumulator=accumulator))
        accumulator = folded.accumulator
    answers: dict[str, Result] = {}
    for number, page in enumerate(pages):
        applied = await resumes.RANK(ReducePage(partition_id="p", gate=1, pass_="apply",
                                                page=number, last=number == 2,
                                                items=tuple(page), accumulator=accumulator))
        answers.update(applied.items)
    assert folded.result == whole.result
    assert answers == dict(whole.items)
    result = whole.result
    assert (result["ranked"], result["failed_count"]) == (30, 1)
    assert result["failed"] == [{"id": "r99", "error": "no text"}]
    expected = resumes.top_candidates(
        [json.dumps(resumes.scored(item)).encode() for item in items], 10)
    assert [row["name"] for row in result["top"]] == [row["name"] for row in expected]
    assert [row["score"] for row in result["top"]] == [row["score"] for row in expected]
    ranked = {item_id: a.data["rank"] for item_id, a in whole.items.items()}
    assert sorted(rank for rank in ranked.values() if rank) == list(range(1, 11))
