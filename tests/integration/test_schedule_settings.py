"""A schedule's notify URL, pipeline and pipeline version on every database: each tick's
partition names them (its cancel is sent to the URL, its pipeline is read back); they
are checked as a create checks them, with nothing written; and the URL is shown with
its password and query values masked by the API, the console and the views."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import datetime

import httpx
import pytest

from processor import AsyncClient, NewItem
from processor.api.server import ApiOptions, api_running
from processor.console.app import create_app
from processor.console.server import settings_for
from processor.schedule_views import schedule_dict, schedule_text
from tests.integration.test_api_schedules import conforms
from watcher.errors import InvalidInputError
from watcher.schedule_ticker import Ticker
from watcher.store import Store
from watcher.store.db.clock import FixedClock
from watcher.store.db.urls import parse_database_url

T0 = datetime(2030, 1, 1, 12, 0, 0)
HOOK = "https://ops:pw5ecret@hooks.example.com/sf?token=t0ps3cret"
MASKED = "https://ops:***@hooks.example.com/sf?token=***"


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


async def test_each_tick_partition_gets_them(client: AsyncClient,
                                             make_store: Callable[..., Store]) -> None:
    clock = FixedClock(T0)
    store = make_store(clock=clock)
    info = await client.add_schedule("billing", every=60, items=[NewItem("a", b"1")],
                                     notify=HOOK, pipeline="invoices", pipeline_version="v2")
    assert (info.settings.notify, info.settings.pipeline, info.settings.pipeline_version) == (
        HOOK, "invoices", "v2")
    plain = await client.add_schedule("plain", every=60)
    assert (plain.settings.notify, plain.settings.pipeline,
            plain.settings.pipeline_version) == (None, "default", None)
    clock.advance(61)
    await Ticker(store, "p1").run_once()
    tick = (await client.schedule("billing")).last_partition
    assert tick is not None
    made = await client.partition(tick)
    assert (made.pipeline, made.pipeline_version) == ("invoices", "v2")
    plain_tick = (await client.schedule("plain")).last_partition
    assert plain_tick is not None
    assert (await client.partition(plain_tick)).pipeline == "default"
    assert await client.cancel(tick) and await client.cancel(plain_tick)
    events = await client.notifications()
    assert [(event.partition_id, event.target) for event in events] == [(tick, HOOK)]


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"notify": "ftp://example.com/x"}, "must be an http:// or https:// URL"),
    ({"notify": 7}, "must be an http(s) URL string"),
    ({"pipeline": "no spaces"}, "pipeline 'no spaces' must be ASCII letters"),
    ({"pipeline_version": ""}, "pipeline_version must be a non-empty string"),
])
async def test_bad_values_are_refused_and_nothing_written(client: AsyncClient, kwargs,
                                                          says: str) -> None:
    with pytest.raises(InvalidInputError) as refused:
        await client.add_schedule("bad", every=60, **kwargs)
    assert says in str(refused.value)
    assert await client.schedules() == []


async def test_the_url_is_masked_wherever_it_is_shown(db_url: str, table_prefix: str,
                                                      client: AsyncClient) -> None:
    info = await client.add_schedule("billing", every=60, notify=HOOK, pipeline="invoices",
                                     pipeline_version="v2")
    shown = schedule_dict(info)
    assert (shown["notify"], shown["pipeline"], shown["pipeline_version"]) == (
        MASKED, "invoices", "v2")
    text = schedule_text(info)
    assert f"pipeline invoices@v2, notify {MASKED}" in text and "pw5ecret" not in text
    url = parse_database_url(db_url)
    app = create_app(settings_for(url, table_prefix, host="127.0.0.1", port=8090,
                                  token=None, read_only=False), client)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://127.0.0.1:8090") as http:
        page = (await http.get("/schedules")).text
    assert "invoices@v2" in page and "https://ops:***@hooks.example.com/sf?token=***" in page
    assert "pw5ecret" not in page and "t0ps3cret" not in page


async def test_the_api_takes_and_masks_them(db_url: str, table_prefix: str) -> None:
    options = ApiOptions(parse_database_url(db_url), table_prefix, port=0)
    one = "/v1/schedules/{name}"
    async with api_running(options) as url, httpx.AsyncClient(base_url=url) as http:
        added = await http.put("v1/schedules/billing", json={
            "every": 60, "notify": HOOK, "pipeline": "invoices", "pipeline_version": "v2"})
        assert added.status_code == 201, added.text
        shown = conforms(added, one, "put")
        assert (shown["notify"], shown["pipeline"], shown["pipeline_version"]) == (
            MASKED, "invoices", "v2")
        read = conforms(await http.get("v1/schedules/billing"), one, "get")
        assert read["notify"] == MASKED and "pw5ecret" not in str(read)
        for body, status, field in (
                ({"every": 60, "notify": "ftp://example.com/x"}, 422, "notify"),
                ({"every": 60, "notify": 5}, 400, "notify"),
                ({"every": 60, "pipeline": "no spaces"}, 422, "pipeline"),
                ({"every": 60, "pipeline_version": "v 2"}, 422, "pipeline_version")):
            refused = await http.put("v1/schedules/bad", json=body)
            assert refused.status_code == status, refused.text
            assert conforms(refused, one, "put")["error"]["field"] == field
        assert [row["name"] for row in (await http.get("v1/schedules")).json()["schedules"]
                ] == ["billing"]
