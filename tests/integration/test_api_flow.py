"""The ingest API's listing of partitions and its flow routes (keys' limits and pauses,
the pause of everything) on every database; what it refuses of repeated query
parameters and JSON keys; and the deadline its server gives a request's headers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from processor import AsyncClient, NewItem
from processor.embedded import listen, serving
from tests.integration.test_api import SMALL, error_of
from tests.integration.test_api import serving as api_serving
from watcher.models import FlowScope

NDJSON = {"content-type": "application/x-ndjson"}
CLOSE_DEADLINE = 30.0


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


@pytest.fixture
async def api(db_url: str, table_prefix: str) -> AsyncIterator[httpx.AsyncClient]:
    async with api_serving(db_url, table_prefix, limits=SMALL) as http:
        yield http


# --------------------------------------------------------------------------- listing


async def test_partitions_are_listed_newest_first_a_page_at_a_time(api, client) -> None:
    for name in ("list/a", "list/b", "list/c", "other"):
        assert (await api.put(f"/v1/partitions/{name.replace('/', '%2F')}",
                              json={"items": [{"id": "x", "data": 1}]})).status_code == 201
    assert await client.cancel("list/b")
    first = (await api.get("/v1/partitions", params={"prefix": "list/", "limit": 2})).json()
    assert [row["id"] for row in first["partitions"]] == ["list/c", "list/b"]
    assert first["partitions"][0]["counts"] == {"available": 1}
    rest = (await api.get("/v1/partitions", params={
        "prefix": "list/", "limit": 2, "after": first["next_cursor"]})).json()
    assert [row["id"] for row in rest["partitions"]] == ["list/a"]
    assert rest["next_cursor"] is None
    cancelled = (await api.get("/v1/partitions", params={"status": "cancelled"})).json()
    assert [row["id"] for row in cancelled["partitions"]] == ["list/b"]
    refused = await api.get("/v1/partitions", params={"prefix": "list\x00"})
    assert refused.status_code == 422 and "id_prefix" in refused.text, refused.text
    assert len((await api.get("/v1/partitions")).json()["partitions"]) == 4
    for query, status, field in (({"status": "lost"}, 422, None), ({"limit": "0"}, 400, "limit"),
                                 ({"after": "nonsense"}, 422, None), ({"x": "1"}, 400, "x")):
        error = error_of(await api.get("/v1/partitions", params=query))
        assert error["status"] == status, (query, error)
        if field:
            assert error["field"] == field


# --------------------------------------------------------------------------- flow


async def test_a_keys_limits_are_set_listed_and_lifted(api, client) -> None:
    await client.create_partition("k1", [NewItem("a", b"1")], key="acme")
    unknown = await api.post("/v1/keys/nobody/limits", json={"max_inflight": 2})
    assert unknown.status_code == 404 and error_of(unknown)["code"] == "key_not_found"
    assert "define" in error_of(unknown)["message"]
    assert await client.flow_controls("key") == []  # nothing was written
    set_ = await api.post("/v1/keys/acme/limits", json={"max_inflight": 3, "rate_limit": 1.5})
    assert set_.json() == {"key": "acme", "max_inflight": 3, "rate_limit": 1.5}
    defined = await api.post("/v1/keys/new%2Fkey/limits",
                             json={"max_inflight": 1, "define": True})
    assert defined.status_code == 200, defined.text
    [acme, new] = await client.flow_controls("key")
    assert (acme.name, acme.max_inflight, acme.rate_limit) == ("acme", 3, 1.5)
    assert (new.name, new.max_inflight) == ("new/key", 1)
    page = (await api.get("/v1/keys", params={"limit": 1})).json()
    assert [row["key"] for row in page["keys"]] == ["acme"]
    assert page["keys"][0] == {"key": "acme", "max_inflight": 3, "rate_limit": 1.5,
                               "paused": False, "paused_at": None, "blocked_until": None}
    more = (await api.get("/v1/keys", params={"after": page["next_cursor"]})).json()
    assert [row["key"] for row in more["keys"]] == ["new/key"] and more["next_cursor"] is None
    lifted = await api.post("/v1/keys/acme/limits", json={"max_inflight": None})
    assert lifted.json() == {"key": "acme", "max_inflight": None}
    assert (await client.flow_controls("key"))[0].rate_limit == 1.5  # left as it was


@pytest.mark.parametrize(("body", "status", "field"), [
    ({}, 400, "max_inflight"),
    ({"define": True}, 400, "max_inflight"),
    ({"max_inflight": 0}, 422, None),
    ({"max_inflight": 1.5}, 422, None),
    ({"max_inflight": 2, "rate_limit": "fast"}, 422, None),
    ({"max_inflight": 2, "define": "yes"}, 400, "define"),
    ({"max_inflight": 2, "other": 1}, 400, "other"),
])
async def test_limits_the_rules_refuse_write_nothing(api, client, body: dict[str, Any],
                                                     status: int, field: str | None) -> None:
    await client.create_partition("k1", [NewItem("a", b"1")], key="acme")
    refused = await api.post("/v1/keys/acme/limits", json=body)
    error = error_of(refused)
    assert error["status"] == status, error
    if field:
        assert error["field"] == field
    assert await client.flow_controls("key") == []


async def test_keys_and_everything_are_paused_and_resumed(api, client) -> None:
    await client.create_partition("k1", [NewItem("a", b"1")], key="acme")
    assert (await api.post("/v1/keys/acme/pause")).json() == {"key": "acme", "paused": True}
    assert (await api.post("/v1/keys/acme/pause")).json()["paused"] is False
    [control] = await client.flow_controls("key")
    assert control.paused_at is not None
    assert (await api.get("/v1/keys")).json()["keys"][0]["paused"] is True
    assert (await api.post("/v1/keys/acme/resume")).json() == {"key": "acme", "resumed": True}
    missing = await api.post("/v1/keys/nobody/pause")
    assert missing.status_code == 404 and error_of(missing)["code"] == "key_not_found"

    assert (await api.get("/v1/fleet")).json() == {"paused": False, "paused_at": None}
    paused = (await api.post("/v1/fleet/pause")).json()
    assert paused["paused"] is True and paused["paused_at"] is not None
    assert [row.scope for row in await client.flow_controls()] == [FlowScope.FLEET.value]
    assert (await api.get("/v1/fleet")).json() == paused
    assert (await api.post("/v1/fleet/pause")).json()["paused"] is False
    assert (await api.post("/v1/fleet/resume")).json() == {"resumed": True, "paused_at": None}
    assert (await api.post("/v1/fleet/resume")).json()["resumed"] is False
    assert (await api.get("/v1/fleet/pause")).status_code == 405


# --------------------------------------------------------------------------- repeats


async def test_a_json_create_takes_its_settings_from_the_query_too(api, client) -> None:
    made = await api.put("/v1/partitions/q", params={"key": "acme", "priority": "3",
                                                     "reduce_gates": "1"},
                         json={"items": [{"id": "a", "data": 1}]})
    assert made.status_code == 201, made.text
    info = await client.partition("q")
    assert (info.key, info.priority, sorted(info.reduce_gates)) == ("acme", 3, [1])
    both = await api.put("/v1/partitions/q2", params={"priority": "1"}, json={"priority": 2})
    assert error_of(both)["field"] == "priority" and both.status_code == 400


@pytest.mark.parametrize(("method", "path", "query"), [
    ("GET", "/v1/partitions/p/items", "limit=1&limit=2"),
    ("GET", "/v1/partitions", "status=failed&status=complete"),
    ("DELETE", "/v1/partitions/p", "force=true&force=false"),
    ("PUT", "/v1/partitions/p", "reduce_gates=1&reduce_gates=2"),
])
async def test_a_query_parameter_given_twice_is_refused(api, method: str, path: str,
                                                        query: str) -> None:
    response = await api.request(method, f"{path}?{query}", content=b"",
                                 headers=NDJSON)
    error = error_of(response)
    assert (error["status"], error["field"]) == (400, query.split("=")[0])
    assert "more than once" in error["message"]


@pytest.mark.parametrize(("body", "headers", "field", "line"), [
    (b'{"items": [], "items": []}', {"content-type": "application/json"}, "items", None),
    (b'{"items": [{"id": "a", "data": {"n": 1, "n": 2}}]}',
     {"content-type": "application/json"}, "n", None),
    (b'{"id": "a", "data": 1}\n{"id": "b", "id": "c", "data": 1}\n', NDJSON, "id", 2),
])
async def test_a_json_key_given_twice_is_refused(api, body: bytes, headers: dict[str, str],
                                                 field: str, line: int | None) -> None:
    refused = await api.put("/v1/partitions/dup", content=body, headers=headers)
    error = error_of(refused)
    assert (error["status"], error["field"], error["line"]) == (400, field, line)
    assert f"the key {field!r} twice" in error["message"]
    assert (await api.get("/v1/partitions/dup")).status_code == 404


# --------------------------------------------------------------------------- headers


async def ok_app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await receive()
        await send({"type": "lifespan.startup.complete"})
        await receive()
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def closed_by_server(port: int, *chunks: bytes) -> bytes:
    """Send ``chunks`` on a new connection, and read until the server closes it (or
    fail after :data:`CLOSE_DEADLINE`); what it sent back."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for chunk in chunks:
            writer.write(chunk)
            await writer.drain()
        async with asyncio.timeout(CLOSE_DEADLINE):
            return await reader.read()  # b"" only once the server closes
    finally:
        writer.close()


@pytest.mark.parametrize("chunks", [
    (b"",),  # connected, sent nothing
    (b"GET /health",),  # part of the request line
    (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ",),  # part of the headers
    # a whole request, then part of the next on the same connection
    (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", b"GET / HT"),
], ids=["nothing", "request-line", "headers", "second-request"])
async def test_unfinished_headers_are_not_kept(chunks: tuple[bytes, ...]) -> None:
    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    async with serving(ok_app, sock, what="a test server", header_timeout=0.5):
        answered = await closed_by_server(port, *chunks)
    assert answered.count(b"HTTP/1.1 200") == (1 if len(chunks) == 2 else 0)


async def test_headers_in_time_are_answered(tmp_path: Any) -> None:
    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    async with serving(ok_app, sock, what="a test server", header_timeout=5):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HT")
        await writer.drain()
        writer.write(b"TP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        async with asyncio.timeout(CLOSE_DEADLINE):
            answered = await reader.read()
        writer.close()
    assert answered.startswith(b"HTTP/1.1 200")


async def test_the_api_closes_a_connection_whose_request_line_never_ends(
        api, db_url: str) -> None:
    if not db_url.startswith("sqlite"):
        pytest.skip("the server's deadline is the same on every database")
    port = httpx.URL(str(api.base_url)).port
    assert port is not None
    assert await closed_by_server(port, b"POST /v1/fleet/pa") == b""
