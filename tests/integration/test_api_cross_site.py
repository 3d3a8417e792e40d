"""The ingest API, served by uvicorn on loopback, refuses what a web page on another site
sends to change state (every method but GET, HEAD and OPTIONS, every route), and a body
of a type a page can send without a preflight; scripts, SDKs, its own origin and bearer
tokens go on. On SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from processor import AsyncClient
from processor.api.routes import ROUTES
from processor.api.server import ApiOptions, api_running
from watcher.store.db.urls import parse_database_url

pytestmark = pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)

EVIL = {"origin": "http://evil.example", "sec-fetch-site": "cross-site",
        "content-type": "text/plain"}
# What a browser sends: each alone shows the request came from elsewhere.
FOREIGN = [
    EVIL,
    {"origin": "http://evil.example"},
    {"origin": "null"},
    {"sec-fetch-site": "cross-site"},
    {"sec-fetch-site": "same-site", "origin": "http://127.0.0.1.evil.example"},
    {"referer": "http://evil.example/page.html"},
    {"origin": "https://127.0.0.1:1"},  # another port is another origin
]
OPERATIONS = ["cancel", "pause", "retry", "resume"]


@contextlib.asynccontextmanager
async def serving(db_url: str, table_prefix: str, **options: Any
                  ) -> AsyncIterator[tuple[httpx.AsyncClient, AsyncClient]]:
    opts = ApiOptions(parse_database_url(db_url), table_prefix, port=0, **options)
    async with (api_running(opts) as url, httpx.AsyncClient(base_url=url, timeout=30) as http,
                AsyncClient(db_url, table_prefix) as client):
        yield http, client


def refused(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["status"], error["code"]) == (status, code)
    message: str = error["message"]
    return message


def own_origin(http: httpx.AsyncClient) -> str:
    return str(http.base_url).rstrip("/")


@pytest.mark.parametrize("headers", FOREIGN)
async def test_a_cross_site_request_changes_nothing_on_any_state_changing_route(
        db_url: str, table_prefix: str, headers: dict[str, str]) -> None:
    async with serving(db_url, table_prefix) as (http, client):
        await client.create_partition("victim", [])
        for operation in OPERATIONS:
            answer = await http.post(f"/v1/partitions/victim/{operation}", headers=headers,
                                     content=b"{}")
            message = refused(answer, 403, "cross_site_request")
            assert "another site" in message and "Authorization: Bearer" in message
        info = await client.partition("victim")
        assert (info.status, info.paused_at) == ("available", None)
        # Every state-changing method of every route, now and later: the rule is the
        # middleware's, not a route's.
        for template, handlers in ROUTES.items():
            path = "/" + "/".join(template).replace("{id}", "victim")
            for method in set(handlers) - {"GET", "HEAD"}:
                answer = await http.request(method, path, headers=headers, content=b"{}")
                refused(answer, 403, "cross_site_request")
        answer = await http.request("PATCH", "/v1/partitions/victim", headers=headers)
        refused(answer, 403, "cross_site_request")
        assert (await client.partition("victim")).status == "available"
        # Reads stay open to a page: the answer is the browser's to withhold.
        assert (await http.get("/v1/partitions/victim", headers=headers)).status_code == 200


async def test_scripts_sdks_the_own_origin_and_a_bearer_token_go_on(
        db_url: str, table_prefix: str) -> None:
    async with serving(db_url, table_prefix) as (http, client):
        await client.create_partition("p", [])
        assert (await http.post("/v1/partitions/p/pause")).json()["paused"] is True
        same = {"origin": own_origin(http), "sec-fetch-site": "same-origin",
                "content-type": "application/json"}
        assert (await http.post("/v1/partitions/p/resume", headers=same)).status_code == 200
        typed = {"sec-fetch-site": "none", "referer": own_origin(http) + "/v1/openapi.json"}
        assert (await http.post("/v1/partitions/p/pause", headers=typed)).status_code == 200
        # A bearer header is no simple request: a page cannot send it unasked.
        signed = {"origin": "http://tool.example", "authorization": "Bearer abc"}
        assert (await http.post("/v1/partitions/p/resume", headers=signed)).status_code == 200
        created = await http.put("/v1/partitions/q", json={"items": [{"id": "a", "data": 1}]},
                                 headers={"origin": own_origin(http)})
        assert created.status_code == 201, created.text
        lines = await http.post("/v1/partitions/q/items",
                                content=b'{"id": "b", "data": 2}\n',
                                headers={"content-type": "application/x-ndjson"})
        assert lines.status_code == 200, lines.text
        assert (await http.post("/v1/partitions/q/cancel")).json()["cancelled"] is True


async def test_a_token_api_refuses_a_cross_site_page_that_lacks_the_token(
        db_url: str, table_prefix: str) -> None:
    token = "t0ken-" + "x" * 20
    async with serving(db_url, table_prefix, token=token) as (http, client):
        await client.create_partition("p", [])
        refused(await http.post("/v1/partitions/p/cancel", headers=EVIL), 401, "unauthorized")
        signed = {**EVIL, "content-type": "application/json",
                  "authorization": f"Bearer {token}"}
        assert (await http.post("/v1/partitions/p/pause", headers=signed)).status_code == 200


@pytest.mark.parametrize("media", ["text/plain", "application/x-www-form-urlencoded",
                                   "multipart/form-data; boundary=x", "text/plain; a=json"])
async def test_a_body_a_page_can_send_unasked_is_refused_before_it_is_read(
        db_url: str, table_prefix: str, media: str) -> None:
    async with serving(db_url, table_prefix) as (http, client):
        await client.create_partition("p", [])
        for method, path in (("POST", "/v1/partitions/p/cancel"),
                             ("POST", "/v1/partitions/p/items"),
                             ("PUT", "/v1/partitions/new"),
                             ("DELETE", "/v1/partitions/p")):
            answer = await http.request(method, path, headers={"content-type": media},
                                        content=b'{"items": [{"id": "z", "data": 1}]}')
            message = refused(answer, 415, "unsupported_media_type")
            assert "application/json" in message
        assert (await client.partition("p")).status == "available"
        assert await client.partitions() and len(list(await client.partitions())) == 1
