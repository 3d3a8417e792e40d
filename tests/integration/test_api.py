"""The ingest API served by uvicorn on loopback, on every database: each route, its errors
in the one shape, idempotent creation, and bad input that writes nothing."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from processor import AsyncClient, NewItem
from processor.api.server import ApiOptions, api_running
from processor.api.upload import Limits
from watcher.errors import ConfigError
from watcher.store.db.urls import parse_database_url

NDJSON = {"content-type": "application/x-ndjson"}
SMALL = Limits(max_item_bytes=1000, max_body_bytes=20_000, max_upload_bytes=200_000)


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


@contextlib.asynccontextmanager
async def serving(db_url: str, table_prefix: str, **options: Any
                  ) -> AsyncIterator[httpx.AsyncClient]:
    opts = ApiOptions(parse_database_url(db_url), table_prefix, port=0, **options)
    async with api_running(opts) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        yield http


@pytest.fixture
async def api(db_url: str, table_prefix: str) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(db_url, table_prefix, limits=SMALL) as http:
        yield http


def lines(*items: dict[str, Any]) -> str:
    return "".join(json.dumps(item) + "\n" for item in items)


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == {"status", "code", "message", "field", "line"}
    assert error["status"] == response.status_code
    return error


async def assert_absent(api: httpx.AsyncClient, partition: str) -> None:
    response = await api.get(f"/v1/partitions/{partition}")
    assert response.status_code == 404, response.text


# --------------------------------------------------------------------------- create


async def test_a_json_create_stores_the_items_as_sent(api, client) -> None:
    body = {"items": [{"id": "a", "data": {"x": 1}}, {"id": "b", "gate": 1, "data_b64": "AAE="},
                      {"id": "c", "data": None}],
            "reduce_gates": [2], "on_item_failure": "continue"}
    response = await api.put("/v1/partitions/job-1", json=body)
    assert response.status_code == 201, response.text
    assert response.json() == {"id": "job-1", "items": 3, "first_gate": 0, "reduce_gates": [2],
                               "on_item_failure": "continue", "key": None, "priority": 0,
                               "quorum": None, "notify": None, "start_at": None,
                               "pipeline": "default", "pipeline_version": None}
    assert response.headers["location"] == "/v1/partitions/job-1"
    assert response.headers["idempotent-replayed"] == "false"
    info = await client.partition("job-1")
    assert (info.reduce_gates, info.on_item_failure, info.counts) == (
        (2,), "continue", {"available": 3})
    stored = {item.id: (item.gate, item.data) for item in await client.items("job-1")}
    assert stored == {"a": (0, b'{"x":1}'), "b": (1, b"\x00\x01"), "c": (0, b"null")}
    page = (await api.get("/v1/partitions/job-1/items")).json()
    shown = {item["id"]: item.get("data", item.get("data_b64")) for item in page["items"]}
    assert shown == {"a": {"x": 1}, "b": "AAE=", "c": None}


async def test_an_ndjson_create_takes_its_settings_from_the_query(api, client) -> None:
    body = (lines({"id": "a", "data": 1}) + "\r\n" + '{"id": "b", "gate": 3, "data": "two"}\r\n'
            + "   \n" + json.dumps({"id": "c", "data": [3]}))  # the last line has no newline
    response = await api.put("/v1/partitions/p?reduce_gates=4,5&on_item_failure=continue"
                             "&pipeline=invoices&pipeline_version=v2", content=body,
                             headers=NDJSON)
    assert response.status_code == 201, response.text
    assert response.json()["items"] == 3
    info = await client.partition("p")
    assert (info.reduce_gates, info.on_item_failure, sum(info.counts.values())) == (
        (4, 5), "continue", 3)
    assert (info.pipeline, info.pipeline_version) == ("invoices", "v2")
    shown = (await api.get("/v1/partitions/p")).json()
    assert (shown["pipeline"], shown["pipeline_version"]) == ("invoices", "v2")
    assert {item.id: item.data for item in await client.items("p")} == {
        "a": b"1", "b": b'"two"', "c": b"[3]"}


async def test_an_empty_create_makes_an_empty_partition(api, client) -> None:
    assert (await api.put("/v1/partitions/empty", json={})).status_code == 201
    assert (await api.put("/v1/partitions/empty-too", content=b"", headers=NDJSON)
            ).status_code == 201
    assert (await client.partition("empty")).counts == {}


async def test_any_id_has_an_address(api, client) -> None:
    partition = "inbox/2026 résumés?#%"
    response = await api.put("/v1/partitions/" + quote(partition, safe=""),
                             json={"items": [{"id": "x/y", "data": 1}]})
    assert response.status_code == 201, response.text
    assert response.json()["id"] == partition
    assert (await api.get(response.headers["location"])).json()["id"] == partition
    assert (await client.partition(partition)).counts == {"available": 1}


async def test_a_retried_create_answers_as_the_first_did(api, client) -> None:
    body = {"items": [{"id": "a", "data": 1}]}
    key = {"idempotency-key": "order-77"}
    first = await api.put("/v1/partitions/p", json=body, headers=key)
    again = await api.put("/v1/partitions/p", json=body, headers=key)
    assert (first.status_code, again.status_code) == (201, 201)
    assert first.json() == again.json()
    assert again.headers["idempotent-replayed"] == "true"
    other_body = await api.put("/v1/partitions/p", json={"items": [{"id": "a", "data": 2}]},
                               headers=key)
    other_key = await api.put("/v1/partitions/p", json=body, headers={"idempotency-key": "x"})
    no_key = await api.put("/v1/partitions/p", json=body)
    for refused in (other_body, other_key, no_key):
        assert refused.status_code == 409
        assert error_of(refused)["code"] == "partition_exists"
    assert [item.data for item in await client.items("p")] == [b"1"]


async def test_a_partition_the_client_made_is_not_replayed(api, client) -> None:
    await client.create_partition("p", [NewItem("a", b"1")])
    response = await api.put("/v1/partitions/p", json={"items": [{"id": "a", "data": 1}]})
    assert response.status_code == 409 and error_of(response)["code"] == "partition_exists"


async def test_concurrent_creates_make_one_partition(api, client) -> None:
    body = lines(*({"id": f"i{n}", "data": n} for n in range(300)))
    answers = await asyncio.gather(*(
        api.put("/v1/partitions/race", content=body, headers={**NDJSON, "idempotency-key": "k"})
        for _ in range(4)))
    assert [answer.status_code for answer in answers] == [201] * 4
    assert sorted(answer.headers["idempotent-replayed"] for answer in answers) == [
        "false", "true", "true", "true"]
    assert (await client.partition("race")).counts == {"available": 300}


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(("body", "line", "words"), [
    ('{"id": "a", "data": 1}\n{"id": "b", "data": 2\n', 2, "line 2 is not valid JSON"),
    ('{"id": "a", "data": 1}\n\n{"id": "b", "dta": 2}\n', 3, "unknown key \"dta\""),
    ('{"id": "a", "data": 1}\n[1, 2]\n', 2, "must be an object"),
    ('{"id": 7, "data": 1}\n', 1, "'id' must be a string"),
    ('{"id": "a", "gate": -1, "data": 1}\n', 1, "'gate' must be an integer"),
    ('{"id": "a"}\n', 1, "needs its content"),
    ('{"id": "a", "data": 1, "data_b64": ""}\n', 1, "both 'data' and 'data_b64'"),
    ('{"id": "a", "data_b64": "%%%"}\n', 1, "not valid base64"),
    ('{"id": "a", "data": NaN}\n', 1, "not valid JSON"),
])
async def test_a_bad_ndjson_line_is_named_and_nothing_is_written(api, body, line,
                                                                 words) -> None:
    response = await api.put("/v1/partitions/p", content=body, headers=NDJSON)
    error = error_of(response)
    assert (response.status_code, error["code"], error["line"]) == (400, "bad_request", line)
    assert words in error["message"] and f"line {line}" in error["message"]
    await assert_absent(api, "p")


@pytest.mark.parametrize(("item", "words"), [
    ({"id": "", "data": 1}, "item id must be a non-empty string"),
    ({"id": "x" * 256, "data": 1}, "the limit is 255"),
    ({"id": "a\u0000b", "data": 1}, "NUL"),
    ({"id": "big", "data_b64": base64.b64encode(b"x" * 1001).decode()}, "max_item_bytes"),
])
async def test_items_the_rules_refuse_are_422_on_both_forms(api, item, words) -> None:
    as_json = await api.put("/v1/partitions/p", json={"items": [{"id": "ok", "data": 1}, item]})
    as_lines = await api.put("/v1/partitions/p", content=lines({"id": "ok", "data": 1}, item),
                             headers=NDJSON)
    for response in (as_json, as_lines):
        error = error_of(response)
        assert (response.status_code, error["code"]) == (422, "invalid_input"), error
        assert words in error["message"]
    assert error_of(as_json)["field"] == "items"
    assert error_of(as_lines)["line"] == 2
    await assert_absent(api, "p")


async def test_repeated_ids_are_named_on_both_forms(api) -> None:
    items = [{"id": "a", "data": 1}, {"id": "b", "data": 1}, {"id": "a", "data": 2}]
    for response in (await api.put("/v1/partitions/p", json={"items": items}),
                     await api.put("/v1/partitions/p", content=lines(*items), headers=NDJSON)):
        error = error_of(response)
        assert (response.status_code, error["code"]) == (422, "duplicate_items")
        assert "'a'" in error["message"] and "'b'" not in error["message"]
    await assert_absent(api, "p")


@pytest.mark.parametrize(("body", "field"), [
    ({"items": [], "gates": [1]}, "gates"),
    ({"items": {"id": "a"}}, "items"),
    ({"items": [{"id": "a", "data": 1, "priority": 3}]}, "items[0]"),
    ({"reduce_gates": "1"}, "reduce_gates"),
    ({"on_item_failure": 1}, "on_item_failure"),
])
async def test_a_bad_json_body_names_its_field(api, body, field) -> None:
    response = await api.put("/v1/partitions/p", json=body)
    assert response.status_code == 400 and error_of(response)["field"] == field
    await assert_absent(api, "p")


async def test_settings_the_rules_refuse(api) -> None:
    bad_policy = await api.put("/v1/partitions/p", json={"on_item_failure": "skip"})
    bad_gate = await api.put("/v1/partitions/p?reduce_gates=1,x", content=b"", headers=NDJSON)
    unknown = await api.put("/v1/partitions/p?reduce_gate=1", content=b"", headers=NDJSON)
    assert (bad_policy.status_code, error_of(bad_policy)["field"]) == (422, "on_item_failure")
    assert (bad_gate.status_code, error_of(bad_gate)["field"]) == (400, "reduce_gates")
    assert (unknown.status_code, error_of(unknown)["field"]) == (400, "reduce_gate")
    await assert_absent(api, "p")


# --------------------------------------------------------------------------- flow control


async def test_a_create_takes_a_key_a_priority_and_a_start_on_both_forms(api, client) -> None:
    later = "2026-11-26T10:00:00+01:00"
    body = {"items": [{"id": "a", "data": 1, "not_before": "2000-01-01T00:00:00Z"}],
            "key": "acme", "priority": 4, "start_at": later}
    made = await api.put("/v1/partitions/j", json=body)
    assert made.status_code == 201, made.text
    assert {name: made.json()[name] for name in ("key", "priority", "start_at")} == {
        "key": "acme", "priority": 4, "start_at": "2026-11-26T09:00:00+00:00"}
    streamed = await api.put(
        f"/v1/partitions/n?key=globex&priority=-2&start_at={quote(later)}",
        content=lines({"id": "b", "data": 2, "not_before": "2000-01-01T00:00:00Z"}),
        headers=NDJSON)
    assert streamed.status_code == 201, streamed.text
    assert (streamed.json()["key"], streamed.json()["priority"]) == ("globex", -2)
    for partition, key, priority in (("j", "acme", 4), ("n", "globex", -2)):
        info = await client.partition(partition)
        assert (info.key, info.priority, info.paused_at) == (key, priority, None)
        assert info.until.isoformat() == "2026-11-26T09:00:00"  # nobody leases it before
        [item] = await client.items(partition)
        assert item.retry_at is not None and item.retry_at.year > 2000  # due: not earlier
        shown = (await api.get(f"/v1/partitions/{partition}")).json()
        assert (shown["key"], shown["priority"], shown["paused"]) == (key, priority, False)


async def test_the_digest_of_an_old_request_is_unchanged_and_flow_settings_count(
        api, client) -> None:
    from processor.api.upload import RequestDigest
    from watcher.records import PartitionSettings

    plain = RequestDigest("k", "application/json")
    plain.update(b"{}")
    # The digest a create without flow settings had before they existed.
    assert plain.settle(PartitionSettings(frozenset({1}), True)) == _old_digest(
        "k", "application/json", b"{}", [1], True)
    keyed = RequestDigest("k", "application/json")
    keyed.update(b"{}")
    assert keyed.settle(PartitionSettings(frozenset({1}), True, key="a")) != (
        _old_digest("k", "application/json", b"{}", [1], True))
    body = {"key": "acme", "items": []}
    key = {"idempotency-key": "order-1"}
    assert (await api.put("/v1/partitions/p", json=body, headers=key)).status_code == 201
    again = await api.put("/v1/partitions/p", json=body, headers=key)
    assert (again.status_code, again.headers["idempotent-replayed"]) == (201, "true")
    other = await api.put("/v1/partitions/p", json={**body, "priority": 1}, headers=key)
    assert other.status_code == 409


def _old_digest(idempotency_key: str, media: str, body: bytes, gates: list[int],
                continues: bool) -> str:
    """The digest as it was computed before keys, priorities and start times."""
    import hashlib

    digest = hashlib.sha256(b"statefeed-create/1\n")
    digest.update(json.dumps([idempotency_key, media]).encode() + b"\n")
    digest.update(body)
    digest.update(b"\n" + json.dumps([sorted(gates), continues]).encode())
    return digest.hexdigest()


@pytest.mark.parametrize(("request_", "status", "field"), [
    ({"json": {"priority": 11}}, 422, "priority"),
    ({"json": {"priority": "high"}}, 400, "priority"),
    ({"json": {"priority": True}}, 400, "priority"),
    ({"json": {"key": 7}}, 400, "key"),
    ({"json": {"key": ""}}, 422, "key"),
    ({"json": {"start_at": "2026-11-26T10:00:00"}}, 422, "start_at"),
    ({"json": {"start_at": "2999-01-01T00:00:00Z"}}, 422, "start_at"),
    ({"json": {"start_at": 1700000000}}, 400, "start_at"),
    ({"params": {"priority": "+1"}}, 400, "priority"),
    ({"params": {"priority": "-11"}}, 422, "priority"),
    ({"params": {"start_at": "soon"}}, 422, "start_at"),
    ({"params": {"key": ""}}, 422, "key"),
    ({"json": {"pipeline": 7}}, 400, "pipeline"),
    ({"json": {"pipeline": "no spaces"}}, 422, "pipeline"),
    ({"params": {"pipeline_version": "v/2"}}, 422, "pipeline_version"),
])
async def test_flow_settings_the_rules_refuse_write_nothing(api, request_, status,
                                                           field) -> None:
    if "json" in request_:
        response = await api.put("/v1/partitions/p", json=request_["json"])
    else:
        response = await api.put("/v1/partitions/p", params=request_["params"],
                                 content=b"", headers=NDJSON)
    assert (response.status_code, error_of(response)["field"]) == (status, field), response.text
    await assert_absent(api, "p")


async def test_pause_and_resume_a_partition(api, client) -> None:
    await client.create_partition("p/1", [NewItem("a", b"1")], key="acme")
    paused = await api.post("/v1/partitions/p%2F1/pause")
    assert paused.status_code == 200, paused.text
    assert (paused.json()["paused"], paused.json()["status"]) == (True, "available")
    info = await client.partition("p/1")
    assert info.paused_at is not None
    again = (await api.post("/v1/partitions/p%2F1/pause")).json()
    assert again["paused"] is False and again["paused_at"] == paused.json()["paused_at"]
    shown = (await api.get("/v1/partitions/p%2F1")).json()
    assert (shown["paused"], shown["key"]) == (True, "acme")
    resumed = (await api.post("/v1/partitions/p%2F1/resume")).json()
    assert (resumed["resumed"], resumed["paused_at"]) == (True, None)
    assert (await client.partition("p/1")).paused_at is None
    assert (await api.post("/v1/partitions/p%2F1/resume")).json()["resumed"] is False
    missing = await api.post("/v1/partitions/nope/pause")
    assert (missing.status_code, error_of(missing)["code"]) == (404, "partition_not_found")
    extra = await api.post("/v1/partitions/p%2F1/pause?now=1")
    assert extra.status_code == 400
    assert (await api.get("/v1/partitions/p%2F1/pause")).status_code == 405


async def test_bodies_over_their_limits_are_413(api) -> None:
    item = {"id": "a", "data": "x" * 900}
    big_json = {"items": [dict(item, id=f"i{n}") for n in range(30)]}
    over_body = await api.put("/v1/partitions/p", json=big_json)

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it comes
        for n in range(250):
            yield (json.dumps(dict(item, id=f"i{n}")) + "\n").encode()

    over_upload = await api.put("/v1/partitions/p", content=chunks(), headers=NDJSON)
    long_line = await api.put("/v1/partitions/p",
                              content=json.dumps({"id": "a", "data": "y" * 70_000}),
                              headers=NDJSON)
    for response in (over_body, over_upload, long_line):
        assert response.status_code == 413 and error_of(response)["code"] == "too_large"
    assert "--max-body-bytes" in error_of(over_body)["message"]
    assert "--max-upload-bytes" in error_of(over_upload)["message"]
    assert error_of(long_line)["line"] == 1
    await assert_absent(api, "p")


async def test_requests_the_api_does_not_take(api) -> None:
    cases = [
        (await api.put("/v1/partitions/p", content=b"{}", headers={"content-type": "text/csv"}),
         415, "unsupported_media_type"),
        (await api.put("/v1/partitions/p", content=b"{}"), 415, "unsupported_media_type"),
        (await api.put("/v1/partitions/p", content=b"{", headers={"content-type":
                                                                   "application/json"}),
         400, "bad_request"),
        (await api.put("/v1/partitions/p", json=[]), 400, "bad_request"),
        (await api.put("/v1/partitions/p", json={}, headers={"idempotency-key": "k" * 256}),
         400, "bad_request"),
        (await api.put("/v1/partitions/p?x=1", json={}), 400, "bad_request"),
        (await api.patch("/v1/partitions/p"), 405, "method_not_allowed"),
        (await api.get("/v1/partition"), 404, "not_found"),
        (await api.put("/v1/partitions/p?key=a", json={"key": "b"}), 400, "bad_request"),
        (await api.put("/v1/partitions/p?key=a&key=b", json={}), 400, "bad_request"),
        (await api.put("/v1/partitions/p", content=b'{"key": "a", "key": "b"}',
                       headers={"content-type": "application/json"}), 400, "bad_request"),
        (await api.get("/v1/partitions/p/other"), 404, "not_found"),
        (await api.get("/v1/partitions/%FF"), 400, "bad_request"),
        (await api.get("/v1/partitions/" + "x" * 256), 422, "invalid_input"),
    ]
    for response, status, code in cases:
        assert (response.status_code, error_of(response)["code"]) == (status, code), \
            response.text
    await assert_absent(api, "p")


# --------------------------------------------------------------------------- add


async def test_add_takes_json_and_ndjson(api, client) -> None:
    await api.put("/v1/partitions/p", json={"items": [{"id": "a", "data": 1}]})
    as_json = await api.post("/v1/partitions/p/items", json={"items": [{"id": "b", "data": 2}]})
    as_lines = await api.post("/v1/partitions/p/items", content=lines({"id": "c", "gate": 2,
                                                                         "data": 3}),
                              headers=NDJSON)
    assert as_json.json() == {"id": "p", "added": 1, "reopened": False}
    assert as_lines.json() == {"id": "p", "added": 1, "reopened": False}
    assert sorted(item.id for item in await client.items("p")) == ["a", "b", "c"]


async def test_add_refuses_what_the_client_refuses(api, client) -> None:
    await client.create_partition("p", [NewItem("a", b"1", 2)])
    cases = [
        (await api.post("/v1/partitions/p/items", json={"items": [{"id": "a", "gate": 2,
                                                                   "data": 1}]}),
         409, "items_exist"),
        (await api.post("/v1/partitions/p/items", json={"items": [{"id": "z", "gate": 0,
                                                                   "data": 1}]}),
         409, "gate_conflict"),
        (await api.post("/v1/partitions/p/items", json={"items": []}), 422, "invalid_input"),
        (await api.post("/v1/partitions/p/items", json={}), 400, "bad_request"),
        (await api.post("/v1/partitions/none/items", json={"items": [{"id": "a", "data": 1}]}),
         404, "partition_not_found"),
    ]
    for response, status, code in cases:
        assert (response.status_code, error_of(response)["code"]) == (status, code), \
            response.text
    assert [item.id for item in await client.items("p")] == ["a"]


# --------------------------------------------------------------------------- reads


async def test_read_and_page(api, client) -> None:
    await client.create_partition("p", [NewItem(f"i{n:02}", b"%d" % n) for n in range(25)])
    view = (await api.get("/v1/partitions/p")).json()
    assert (view["status"], view["finished"], view["total"], view["counts"]) == (
        "available", False, 25, {"available": 25})
    seen, after = [], None
    while True:
        page = (await api.get("/v1/partitions/p/items",
                              params={"limit": 10, **({"after": after} if after else {})})
                ).json()
        seen += [item["id"] for item in page["items"]]
        after = page["next_cursor"]
        if after is None:
            break
    assert seen == [f"i{n:02}" for n in range(25)]
    bare = (await api.get("/v1/partitions/p/items?data=false&limit=1")).json()["items"][0]
    assert "data" not in bare and "data_b64" not in bare
    for query, status in (("limit=0", 400), ("limit=x", 400), ("gate=-1", 400),
                          ("status=done", 422), ("data=maybe", 400), ("sort=id", 400)):
        response = await api.get(f"/v1/partitions/p/items?{query}")
        assert response.status_code == status, (query, response.text)
        error_of(response)
    missing = await api.get("/v1/partitions/none/items")
    assert error_of(missing)["code"] == "partition_not_found"


async def test_wait_is_a_long_poll(api, client) -> None:
    await client.create_partition("p", [NewItem("a", b"1")])
    still_open = await api.get("/v1/partitions/p/wait?timeout=0.2")
    assert still_open.status_code == 202 and still_open.json()["finished"] is False

    async def cancel_soon() -> None:
        await asyncio.sleep(0.3)
        await client.cancel("p")

    waiter = asyncio.create_task(api.get("/v1/partitions/p/wait?timeout=20"))
    await cancel_soon()
    finished = await asyncio.wait_for(waiter, 20)
    assert finished.status_code == 200
    assert (finished.json()["status"], finished.json()["finished"]) == ("cancelled", True)
    for query in ("timeout=-1", "timeout=301", "timeout=soon"):
        response = await api.get(f"/v1/partitions/p/wait?{query}")
        assert response.status_code == 400 and error_of(response)["field"] == "timeout"
    assert (await api.get("/v1/partitions/none/wait?timeout=0")).status_code == 404


# --------------------------------------------------------------------------- operations


async def test_cancel_retry_and_delete(api, client) -> None:
    await client.create_partition("p", [NewItem("a", b"1"), NewItem("b", b"2")])
    first = await api.post("/v1/partitions/p/cancel")
    again = await api.post("/v1/partitions/p/cancel")
    assert first.json() == {"id": "p", "cancelled": True, "status": "cancelled"}
    assert again.json() == {"id": "p", "cancelled": False, "status": "cancelled"}
    retried = (await api.post("/v1/partitions/p/retry")).json()
    assert (retried["status_before"], retried["status"], retried["reopened"]) == (
        "cancelled", "available", True)
    deleted = await api.delete("/v1/partitions/p?force=false")
    assert deleted.json() == {"id": "p", "deleted": True, "items_deleted": 2}
    await assert_absent(api, "p")
    for response in (await api.post("/v1/partitions/p/cancel"),
                     await api.post("/v1/partitions/p/retry"),
                     await api.delete("/v1/partitions/p")):
        assert response.status_code == 404 and error_of(response)["code"] == \
            "partition_not_found"
    bad = await api.delete("/v1/partitions/p?force=perhaps")
    assert bad.status_code == 400 and error_of(bad)["field"] == "force"


# --------------------------------------------------------------------------- who may call


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_a_bind_beyond_loopback_needs_a_token(db_url, table_prefix) -> None:
    with pytest.raises(ConfigError, match=r"the API listens on 0\.0\.0\.0, beyond loopback"):
        ApiOptions(parse_database_url(db_url), table_prefix, host="0.0.0.0", port=0)
    with pytest.raises(ConfigError, match="at least 16 characters"):
        ApiOptions(parse_database_url(db_url), table_prefix, port=0, token="short")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_the_token_guards_every_route_but_healthz(db_url, table_prefix, caplog) -> None:
    token = "t0ken-" + "s" * 20
    async with serving(db_url, table_prefix, token=token) as api:
        anonymous = await api.put("/v1/partitions/p", json={})
        wrong = await api.get("/v1/openapi.json", headers={"authorization": "Bearer nope"})
        assert (anonymous.status_code, wrong.status_code) == (401, 401)
        assert error_of(anonymous)["code"] == "unauthorized"
        assert anonymous.headers["www-authenticate"].startswith("Bearer")
        assert (await api.get("/healthz")).status_code == 200
        signed = {"authorization": f"Bearer {token}"}
        assert (await api.put("/v1/partitions/p", json={}, headers=signed)).status_code == 201
    assert token not in caplog.text


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_a_loopback_api_refuses_other_host_names(db_url, table_prefix) -> None:
    async with serving(db_url, table_prefix) as api:
        rebound = await api.get("/healthz", headers={"host": "attacker.example:8091"})
        assert rebound.status_code == 421 and error_of(rebound)["code"] == "misdirected_request"
        assert (await api.get("/healthz", headers={"host": "localhost:8091"})).status_code == 200


async def test_a_partition_shows_the_version_a_rewind_takes(api, client) -> None:
    await client.create_partition("p", [NewItem("a", b"{}")])
    await client.cancel("p")
    shown = (await api.get("/v1/partitions/p")).json()
    assert shown["version"] == (await client.partition("p")).version
    [listed] = (await api.get("/v1/partitions")).json()["partitions"]
    assert listed["version"] == shown["version"]
    stale = await api.post("/v1/partitions/p/rewind",
                           json={"gate": 0, "version": shown["version"] - 1})
    assert (stale.status_code, error_of(stale)["code"]) == (409, "version_conflict")
    done = await api.post("/v1/partitions/p/rewind",
                          json={"gate": 0, "version": shown["version"]})
    assert done.status_code == 200, done.text
    assert (await api.get("/v1/partitions/p")).json()["version"] > shown["version"]


@pytest.mark.parametrize(("method", "path", "body", "key"), [
    ("PUT", "/v1/partitions/p", b'{"items": [], "priority": 1, "priority": 2}', "priority"),
    ("PUT", "/v1/partitions/p", b'{"items": [{"id": "a", "id": "b", "data": 1}]}', "id"),
    ("POST", "/v1/partitions/q/items", b'{"items": [{"id": "a", "data": {"x": 1, "x": 2}}]}',
     "x"),
    ("POST", "/v1/partitions/q/items", b'{"items": [], "items": [{"id": "a", "data": 1}]}',
     "items"),
])
async def test_a_repeated_key_is_refused_naming_it(api, client, method, path, body,
                                                   key) -> None:
    await client.create_partition("q", [])
    response = await api.request(method, path, content=body,
                                 headers={"content-type": "application/json"})
    error = error_of(response)
    assert (response.status_code, error["field"]) == (400, key), response.text
    assert f"{key!r} twice" in error["message"]
    await assert_absent(api, "p")
    assert await client.items("q") == []
