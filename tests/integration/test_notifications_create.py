"""The notify URL through the ingest API's creates: taken from the JSON body or the
query, echoed, stored (a holder's lease reads it), part of the idempotency digest; a
bad one refused with one line naming the field, and nothing written."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from processor import AsyncClient
from processor.api.server import ApiOptions, api_running
from watcher.store import Store
from watcher.store.db.urls import parse_database_url

NDJSON = {"content-type": "application/x-ndjson"}
HOOK = "https://hooks.example.com/statefeed?k=1"


@pytest.fixture
async def api(db_url: str, table_prefix: str) -> AsyncIterator[httpx.AsyncClient]:
    options = ApiOptions(parse_database_url(db_url), table_prefix, port=0)
    async with api_running(options) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        yield http


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


async def test_the_body_and_the_query_set_it(api: httpx.AsyncClient, store: Store) -> None:
    made = await api.put("/v1/partitions/a", json={"items": [], "notify": HOOK})
    assert made.status_code == 201, made.text
    assert made.json()["notify"] == HOOK
    made = await api.put("/v1/partitions/b", params={"notify": HOOK},
                         content=b'{"id": "x", "data": 1}\n', headers=NDJSON)
    assert made.status_code == 201, made.text
    rows = {row.id: row for row in await store.leases_read_free(10)}
    assert rows["a"].settings.notify == HOOK and rows["b"].settings.notify == HOOK
    # The same request again is a replay; another URL under the same key is a conflict.
    key = {"idempotency-key": "k1"}
    first = await api.put("/v1/partitions/c", json={"notify": HOOK}, headers=key)
    again = await api.put("/v1/partitions/c", json={"notify": HOOK}, headers=key)
    assert (first.status_code, again.headers["idempotent-replayed"]) == (201, "true")
    other = await api.put("/v1/partitions/c", json={"notify": HOOK + "2"}, headers=key)
    assert other.status_code == 409, other.text


@pytest.mark.parametrize(("notify", "status"), [("ftp://x.example/", 422),
                                                 ("hooks.example.com", 422), (7, 400),
                                                 (["https://x.example/"], 400)])
async def test_a_bad_url_is_refused_naming_the_field(api: httpx.AsyncClient,
                                                     client: AsyncClient, notify: object,
                                                     status: int) -> None:
    refused = await api.put("/v1/partitions/p", json={"items": [], "notify": notify})
    assert refused.status_code == status, refused.text
    error = refused.json()["error"]
    assert error["field"] == "notify" and "notify" in error["message"]
    assert (await api.get("/v1/partitions/p")).status_code == 404


async def test_a_url_in_the_body_and_the_query_is_refused(api: httpx.AsyncClient) -> None:
    refused = await api.put("/v1/partitions/p", params={"notify": HOOK},
                            json={"notify": HOOK})
    assert refused.status_code == 400 and refused.json()["error"]["field"] == "notify"
