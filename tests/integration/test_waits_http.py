"""Waits over HTTP on every live database: an SDK handler served by uvicorn parks its
items (per item and in batches), and the outside world completes them through
``processor api`` (``POST /v1/completions/{token}``) and through the client."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

import handlers
from processor import AsyncClient, NewItem
from processor.api.server import ApiOptions, api_running
from processor.api.upload import Limits
from processor.http.batch import BatchingHttpProcessor
from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from tests.support.engine import running, wait_until
from tests.support.servers import serve_app
from watcher import Watcher, WatcherConfig
from watcher.errors import AlreadyCompletedError
from watcher.store.db.urls import parse_database_url

SMALL_BODY = 1 << 20
FAST = {"poll_interval": 0.05, "lease_duration": 3.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.1}


class Approvals:
    """Gate 0 asks for an approval (parks, keeping the token it was given); gate 1
    completes the item."""

    def __init__(self) -> None:
        self.tokens: dict[str, list[str]] = {}

    def ask(self, item: handlers.Item) -> handlers.Result:
        self.tokens.setdefault(item.id, []).append(item.completion_token)
        return handlers.Result(wait={"timeout": 3600}, data={"asked": True})

    def done(self, item: handlers.Item) -> handlers.Result:
        return handlers.Result(done=True)

    def token(self, item_id: str) -> str:
        return self.tokens[item_id][-1]


@contextlib.asynccontextmanager
async def pipeline(db_url: str, table_prefix: str, make_store: Callable[..., Any],
                   protocol: str = "per-item"
                   ) -> AsyncIterator[tuple[Approvals, httpx.AsyncClient]]:
    approvals = Approvals()
    app = handlers.app({0: approvals.ask, 1: approvals.done})
    options = ApiOptions(parse_database_url(db_url), table_prefix, port=0,
                         limits=Limits(max_body_bytes=SMALL_BODY))
    async with serve_app(app) as url, api_running(options) as api_url, \
            httpx.AsyncClient(base_url=api_url, timeout=30) as http:
        config = HttpProcessorConfig(handler_url=f"{url}/")
        processor = (HttpProcessor(config) if protocol == "per-item"
                     else BatchingHttpProcessor(config, batch_size=8))
        watcher = Watcher(make_store(), processor, WatcherConfig(owner_id="w1", **FAST))
        try:
            async with running(watcher):
                yield approvals, http
        finally:
            await processor.aclose()


async def _waiting(client: AsyncClient, partition_id: str, count: int) -> bool:
    items = await client.items(partition_id)
    return sum(item.status == "waiting" for item in items) == count


@pytest.mark.parametrize("protocol", ["per-item", "batch"])
async def test_a_handler_parks_and_the_api_completes_exactly_once(
        db_url, table_prefix, make_store, protocol) -> None:
    client = AsyncClient(db_url, table_prefix)
    await client.create_partition("p", [NewItem(f"i{n}", b"{}") for n in range(3)])
    async with pipeline(db_url, table_prefix, make_store, protocol) as (approvals, http):
        await wait_until(lambda: _waiting(client, "p", 3), message="three parked")
        tokens = {item_id: approvals.token(item_id) for item_id in ("i0", "i1", "i2")}
        assert all(len(token) >= 43 for token in tokens.values()), "at least 256 bits"
        assert len(set(tokens.values())) == 3
        answer = await http.post(f"/v1/completions/{tokens['i0']}",
                                 json={"gate": 1, "data": {"approved": True}})
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "available" and answer.json()["gate"] == 1
        again = await http.post(f"/v1/completions/{tokens['i0']}", json={"gate": 1})
        assert again.status_code == 409
        assert again.json()["error"]["code"] == "already_completed"
        assert tokens["i0"] not in again.text
        info = await client.partition("p")
        assert info.gate == 0 and info.counts.get("waiting") == 2
        await client.complete(tokens["i1"], done=False, gate=1)
        await client.complete(tokens["i2"], gate=1, done=True)
        info = await client.wait("p", timeout=30)
    assert info.status == "complete" and info.counts == {"complete": 3}
    items = {item.id: item for item in await client.items("p")}
    assert items["i0"].data == b'{"approved":true}'
    await client.close()


async def test_unknown_tokens_and_bad_answers(db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    await client.create_partition("p", [NewItem("a", b"{}", gate=0)])
    async with pipeline(db_url, table_prefix, make_store) as (approvals, http):
        await wait_until(lambda: _waiting(client, "p", 1), message="parked")
        for token in ("A" * 43, "short", "%00" * 3, "x" * 300):
            missing = await http.post(f"/v1/completions/{token}", json={"done": True})
            assert missing.status_code == 404, (token, missing.text)
            assert missing.json()["error"]["code"] == "not_found"
        token = approvals.token("a")
        for body, field in (({"gate": "two"}, "gate"), ({"wait": {"timeout": -1}}, "wait"),
                            ({"spawn": [{"id": "x"}]}, "spawn"), ({"colour": 1}, "colour"),
                            ({"done": True, "wait": {"timeout": 5}}, "wait")):
            refused = await http.post(f"/v1/completions/{token}", json=body)
            assert refused.status_code == 400, (body, refused.text)
            assert refused.json()["error"]["field"] == field, (body, refused.json())
        # A key given twice is refused, naming it, at any depth, on both routes.
        for route, raw, key in (
                ("", b'{"gate": 1, "gate": 2}', "gate"),
                ("", b'{"done": true, "data": {"ok": 1, "ok": 2}}', "ok"),
                ("/heartbeat", b'{"timeout": 60, "timeout": 1}', "timeout")):
            repeated = await http.post(f"/v1/completions/{token}{route}", content=raw,
                                       headers={"content-type": "application/json"})
            assert repeated.status_code == 400, (raw, repeated.text)
            assert repeated.json()["error"]["field"] == key, repeated.json()
            assert f"{key!r} twice" in repeated.json()["error"]["message"]
        # A form's content type is refused, saying which header to send.
        form = await http.post(f"/v1/completions/{token}/heartbeat",
                               content=b'{"timeout": 60}',
                               headers={"content-type": "application/x-www-form-urlencoded"})
        assert form.status_code == 415
        assert "Content-Type: application/json" in form.json()["error"]["message"]
        huge = await http.post(f"/v1/completions/{token}", content=b" " * (SMALL_BODY + 1),
                               headers={"content-type": "application/json"})
        assert huge.status_code == 413
        assert await _waiting(client, "p", 1), "nothing was written"
        wrong_method = await http.get(f"/v1/completions/{token}")
        assert wrong_method.status_code == 405
        beat = await http.post(f"/v1/completions/{token}/heartbeat", json={"timeout": 60})
        assert beat.status_code == 200 and "deadline" in beat.json()
        done = await http.post(f"/v1/completions/{token}",
                               json={"error": "the reviewer said no", "no_retry": True})
        assert done.status_code == 200 and done.json()["status"] == "failed"
        info = await client.wait("p", timeout=30)
    assert info.status == "failed"
    (item,) = await client.items("p")
    assert item.last_error is not None and "the reviewer said no" in item.last_error
    await client.close()


async def test_racing_completions_over_http(db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    await client.create_partition("p", [NewItem("a", b"{}")])
    async with pipeline(db_url, table_prefix, make_store) as (approvals, http):
        await wait_until(lambda: _waiting(client, "p", 1), message="parked")
        token = approvals.token("a")
        answers = await asyncio.gather(*(http.post(f"/v1/completions/{token}",
                                                   json={"gate": 1, "data": n})
                                         for n in range(2)))
        assert sorted(answer.status_code for answer in answers) == [200, 409]
        info = await client.wait("p", timeout=30)
    assert info.status == "complete"
    await client.close()


async def test_a_completion_that_waits_again_returns_a_new_token(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    await client.create_partition("p", [NewItem("a", b"{}")])
    async with pipeline(db_url, table_prefix, make_store) as (approvals, http):
        await wait_until(lambda: _waiting(client, "p", 1), message="parked")
        first = approvals.token("a")
        parked = await http.post(f"/v1/completions/{first}", json={"wait": {"timeout": 600}})
        assert parked.status_code == 200 and parked.json()["status"] == "waiting"
        second = parked.json()["completion_token"]
        assert second != first
        old = await http.post(f"/v1/completions/{first}", json={"done": True})
        assert old.status_code == 409
        with pytest.raises(AlreadyCompletedError):
            await client.complete(first)
        await client.complete(second, gate=1, done=False)
        info = await client.wait("p", timeout=30)
    assert info.status == "complete"
    await client.close()


async def test_the_api_token_is_not_needed_to_complete(db_url, table_prefix,
                                                       make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    await client.create_partition("p", [NewItem("a", b"{}")])
    approvals = Approvals()
    app = handlers.app({0: approvals.ask, 1: approvals.done})
    options = ApiOptions(parse_database_url(db_url), table_prefix, port=0,
                         token="s3cret-s3cret-s3cret")
    async with serve_app(app) as url, api_running(options) as api_url, \
            httpx.AsyncClient(base_url=api_url, timeout=30) as http:
        processor = HttpProcessor(HttpProcessorConfig(handler_url=f"{url}/"))
        watcher = Watcher(make_store(), processor, WatcherConfig(owner_id="w1", **FAST))
        try:
            async with running(watcher):
                await wait_until(lambda: _waiting(client, "p", 1), message="parked")
                refused = await http.get("/v1/partitions/p")
                assert refused.status_code == 401, "the rest of the API still needs it"
                done = await http.post(f"/v1/completions/{approvals.token('a')}",
                                       json={"gate": 1})
                assert done.status_code == 200, done.text
                info = await client.wait("p", timeout=30)
        finally:
            await processor.aclose()
    assert info.status == "complete"
    await client.close()


async def test_a_quorum_of_one_keeps_the_first_providers_answer_over_http(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    released = asyncio.Event()
    calls: list[tuple[str, int]] = []
    tokens: dict[str, str] = {}

    async def ask(item: handlers.Item) -> handlers.Result:
        calls.append((item.id, item.gate))
        if item.id == "slow":
            await asyncio.wait_for(released.wait(), timeout=30)
            return handlers.Result(gate=1, data={"answer": "late"})
        if item.id == "callback":
            tokens[item.id] = item.completion_token
            return handlers.Result(wait={"timeout": 3600})
        return handlers.Result(gate=1, data={"answer": "first"})

    def pick(item: handlers.Item) -> handlers.Result:
        calls.append((item.id, item.gate))
        return handlers.Result(done=True)

    await client.create_partition("p", [NewItem(name, b"{}")
                                        for name in ("fast", "slow", "callback")],
                                  quorum={0: 1})
    options = ApiOptions(parse_database_url(db_url), table_prefix, port=0)
    async with serve_app(handlers.app({0: ask, 1: pick})) as url, \
            api_running(options) as api_url, \
            httpx.AsyncClient(base_url=api_url, timeout=30) as http:
        processor = HttpProcessor(HttpProcessorConfig(handler_url=f"{url}/"))
        watcher = Watcher(make_store(), processor, WatcherConfig(owner_id="w1", **FAST))
        try:
            async with running(watcher):
                # The gate passes while the slow provider still works: its call is
                # given up (it was skipped), and its answer would be discarded.
                info = await client.wait("p", timeout=20)
                late = await http.post(f"/v1/completions/{tokens['callback']}",
                                       json={"gate": 1})
                assert late.status_code == 409, late.text
                released.set()
        finally:
            await processor.aclose()
    assert info.status == "complete" and info.counts == {"complete": 1, "skipped": 2}
    items = {item.id: item for item in await client.items("p")}
    assert items["slow"].data == b"{}", "the late answer is discarded"
    assert sorted(calls) == [("callback", 0), ("fast", 0), ("fast", 1), ("slow", 0)]
    await client.close()


@pytest.mark.parametrize("protocol", ["per-item", "batch"])
async def test_two_of_three_approvals_through_the_api_skip_the_third(
        db_url, table_prefix, make_store, protocol) -> None:
    client = AsyncClient(db_url, table_prefix)
    await client.create_partition("p", [NewItem(name, b"{}") for name in ("ann", "bo", "cy")],
                                  quorum={0: 2})
    async with pipeline(db_url, table_prefix, make_store, protocol) as (approvals, http):
        await wait_until(lambda: _waiting(client, "p", 3), message="three parked")
        for name in ("ann", "bo"):
            answer = await http.post(f"/v1/completions/{approvals.token(name)}",
                                     json={"gate": 1, "data": {"approved": name}})
            assert answer.status_code == 200, answer.text
        skipped = await http.get("/v1/partitions/p/items", params={"status": "skipped"})
        assert skipped.status_code == 200, skipped.text
        assert [item["id"] for item in skipped.json()["items"]] == ["cy"], skipped.text
        late = await http.post(f"/v1/completions/{approvals.token('cy')}", json={"gate": 1})
        assert late.status_code == 409, late.text
        info = await client.wait("p", timeout=20)
        shown = (await http.get("/v1/partitions/p")).json()
    assert info.status == "complete" and info.counts == {"complete": 2, "skipped": 1}
    assert shown["counts"] == {"complete": 2, "skipped": 1}, shown
    await client.close()
