"""The console's Schedules page on every database: each schedule with its timing, policy,
next and last ticks and a link to its last partition; an empty page says
how to add one. Its actions (``pause``, ``resume``, ``delete`` after a confirmation, and
the add form) change a schedule as ``processor schedules`` does, follow the cross-site and
session-token rules of every action, are refused on a read-only console, and name an
unknown schedule or a refused input in one line with nothing written."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from html import unescape

import httpx
import pytest

from processor import AsyncClient, NewItem
from processor.client.schedules import new_schedule
from processor.console.app import create_app
from processor.console.server import settings_for
from tests.integration.test_console import _csrf, _web
from tests.integration.test_waits import config
from tests.support.engine import running
from watcher import Result, Watcher, WorkItem
from watcher.config import DEFAULT_MAX_ITEM_BYTES
from watcher.errors import ScheduleNotFoundError
from watcher.protocol import NonRetryableError, ReduceCall, ReduceResult
from watcher.schedule_ticker import Ticker
from watcher.store import Store
from watcher.store.db.clock import FixedClock
from watcher.store.db.urls import parse_database_url

ORIGIN = "http://127.0.0.1:8090"


async def test_schedules_page_lists_next_and_last_ticks(db_url, table_prefix, make_store
                                                        ) -> None:
    url = parse_database_url(db_url)
    async with AsyncClient(url, table_prefix) as client:
        app = create_app(settings_for(url, table_prefix, host="127.0.0.1", port=8090,
                                      token=None, read_only=False), client)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url=ORIGIN) as http:
            empty = await http.get("/schedules")
            assert empty.status_code == 200
            assert "No schedules" in empty.text and 'href="/schedules"' in empty.text

            clock = FixedClock(datetime(2030, 1, 1, 12))
            store = make_store(clock=clock)
            await store.schedule_add(new_schedule(
                "ticks", cron=None, timezone=None, every=60, items=[NewItem("a", b"1")],
                reduce_gates=(), on_item_failure="fail", priority=0, key=None,
                catch_up="all", no_overlap=True, max_item_bytes=DEFAULT_MAX_ITEM_BYTES))
            await client.add_schedule("nightly", cron="0 3 * * *", timezone="Europe/Berlin")
            await client.pause_schedule("nightly")
            clock.advance(61)
            await Ticker(store, "p1").run_once()

            page = (await http.get("/schedules")).text
            assert "every 1m" in page and "all, no overlap" in page
            assert "2030-01-01T12:02:00Z" in page  # next tick
            assert "2030-01-01T12:01:00Z" in page  # last tick
            assert 'href="/partition?id=ticks%2F2030-01-01T12%3A01%3A00Z"' in page
            assert "cron &#39;0 3 * * *&#39; Europe/Berlin" in page
            assert "status-paused" in page


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


@pytest.fixture
async def web(db_url: str, table_prefix: str) -> AsyncIterator[httpx.AsyncClient]:
    async with _web(db_url, table_prefix, read_only=False) as opened:
        yield opened


def alert(page: str) -> str:
    """The one line a refusal shows (its alert, or an error page's message)."""
    match = re.search(r'<p class="alert" role="alert"[^>]*>(.*?)</p>', page, re.S) or \
        re.search(r'class="panel problem" role="alert">.*?<p>(.*?)</p>', page, re.S)
    assert match, "no error line in the page"
    return unescape(match.group(1))


async def post(web: httpx.AsyncClient, path: str, form: dict[str, str]) -> httpx.Response:
    return await web.post(path, data=form, headers={"origin": ORIGIN})


async def test_pause_resume_and_delete_act_as_the_cli_does(
        web: httpx.AsyncClient, client: AsyncClient) -> None:
    await client.add_schedule("nightly", cron="0 3 * * *", timezone="Europe/Berlin")
    page = (await web.get("/schedules")).text
    assert 'action="/schedules/pause"' in page and 'href="/schedules/delete?name=nightly"' \
        in page and 'id="add-schedule"' in page
    form = {"name": "nightly", "csrf": _csrf(page)}

    paused = await post(web, "/schedules/pause", form)
    assert paused.status_code == 303
    assert paused.headers["location"] == "/schedules?notice=paused&name=nightly"
    assert (await client.schedule("nightly")).paused_at is not None
    shown = (await web.get(paused.headers["location"])).text
    assert "schedule nightly paused: no ticks until it is resumed" in shown
    assert 'action="/schedules/resume"' in shown and "status-paused" in shown
    again = await post(web, "/schedules/pause", form)
    assert again.headers["location"] == "/schedules?notice=not-paused&name=nightly"
    assert "schedule nightly was paused already" in (await web.get(again.headers["location"])
                                                      ).text

    resumed = await post(web, "/schedules/resume", form)
    assert resumed.headers["location"] == "/schedules?notice=resumed&name=nightly"
    after = await client.schedule("nightly")
    assert after.paused_at is None and after.next_at is not None
    again = await post(web, "/schedules/resume", form)
    assert again.headers["location"] == "/schedules?notice=not-resumed&name=nightly"

    confirm = (await web.get("/schedules/delete?name=nightly")).text
    assert "Delete schedule" in confirm and "cron &#39;0 3 * * *&#39; Europe/Berlin" in confirm
    assert await client.schedule("nightly")  # asking writes nothing
    deleted = await post(web, "/schedules/delete", {**form, "csrf": _csrf(confirm)})
    assert deleted.headers["location"] == "/schedules?notice=deleted&name=nightly"
    with pytest.raises(ScheduleNotFoundError):
        await client.schedule("nightly")
    gone = (await web.get(deleted.headers["location"])).text
    assert "schedule nightly deleted; the partitions it created stay" in gone
    assert "No schedules" in gone


async def test_the_add_form_adds_what_the_cli_would(
        web: httpx.AsyncClient, client: AsyncClient) -> None:
    form_page = (await web.get("/schedules/add")).text
    assert 'name="items"' in form_page and 'value="skip" selected' in form_page
    csrf = _csrf(form_page)
    added = await post(web, "/schedules/add", {
        "csrf": csrf, "name": "ticks", "cron": "", "timezone": "", "every": "90s",
        "catch_up": "all", "no_overlap": "yes",
        "items": '{"id": "a", "data": {"n": 1}}\r\n\r\n{"id": "b", "gate": 1, "data": 2}\r\n'})
    assert added.status_code == 303
    assert added.headers["location"] == "/schedules?notice=added&name=ticks"
    info = await client.schedule("ticks")
    assert info.timing.every == 90 and info.catch_up == "all" and info.no_overlap
    assert info.item_count == 2 and info.paused_at is None
    items = await client.schedule_items("ticks")
    assert [(item.id, item.gate, item.data) for item in items] == [
        ("a", 0, b'{"n":1}'), ("b", 1, b"2")]

    cron = await post(web, "/schedules/add", {
        "csrf": csrf, "name": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Berlin",
        "catch_up": "skip", "items": ""})
    assert cron.status_code == 303
    nightly = await client.schedule("nightly")
    assert (nightly.timing.cron, nightly.timing.timezone) == ("0 3 * * *", "Europe/Berlin")
    assert nightly.catch_up == "skip" and not nightly.no_overlap and nightly.item_count == 0
    listed = (await web.get(cron.headers["location"])).text
    assert "schedule nightly added" in listed and 'data-key="schedule-ticks"' in listed


class Summing:
    """A reduce pipeline: gate 0 sends each item on to gate 1, where one reduce call
    sums the whole gate; an item called at gate 1 is an error (no such route), as an
    HTTP pipeline's handler answers a reduce gate its partition does not know about."""

    async def __call__(self, item: WorkItem) -> Result:
        if item.gate == 0:
            return Result(gate=1)
        raise NonRetryableError(f"gate {item.gate} is a reduce gate: no per-item route")

    async def reduce(self, call: ReduceCall) -> ReduceResult:
        total = sum(json.loads(item.data)["n"] for item in call.items)
        return ReduceResult(default=Result(done=True), result=json.dumps(total).encode())


async def test_a_schedule_added_with_reduce_gates_ticks_partitions_that_reduce(
        web: httpx.AsyncClient, client: AsyncClient,
        make_store: Callable[..., Store]) -> None:
    form_page = (await web.get("/schedules/add")).text
    assert 'name="reduce_gates"' in form_page
    added = await post(web, "/schedules/add", {
        "csrf": _csrf(form_page), "name": "sums", "every": "1m", "reduce_gates": " 1 ",
        "catch_up": "skip",
        "items": '{"id": "a", "data": {"n": 2}}\n{"id": "b", "data": {"n": 5}}'})
    assert added.status_code == 303, alert(added.text)
    assert (await client.schedule("sums")).settings.reduce_gates == frozenset({1})
    # The ticker and the processor at a time past the next tick (the database's clock,
    # moved on: the tick's items are ready from the tick's time).
    clock = FixedClock(await client.now() + timedelta(minutes=2))
    await Ticker(make_store(clock=clock), "p1").run_once()
    tick = (await client.schedule("sums")).last_partition
    assert tick is not None
    assert (await client.partition(tick)).reduce_gates == (1,)
    async with running(Watcher(make_store(clock=clock), Summing(), config())):
        done = await client.wait(tick, timeout=60)
    assert done.status == "complete", done.last_error
    assert done.result == b"7"


@pytest.mark.parametrize(("fields", "status", "line"), [
    ({"every": "1h", "reduce_gates": "1;3"}, 400,
     "reduce gates must be gates separated by commas, such as 1,3; got '1;3'"),
    ({"every": "1h", "reduce_gates": "one"}, 400, "reduce gates must be gates separated"),
    ({"every": "1h", "reduce_gates": "1,1"}, 400, "reduce gates [1] of partition"),
    ({"every": "1h", "reduce_gates": "1,99999999999"}, 400, "reduce gate 99999999999"),
    ({"cron": "0 3 * *"}, 400, "'0 3 * *' is not a cron expression of five fields"),
    ({"cron": "0 3 * * *", "every": "1h"}, 400, "exactly one of a cron expression"),
    ({"every": "soon"}, 400, "every must be a duration greater than 0"),
    ({"every": "1h", "catch_up": "sometimes"}, 400, "sometimes"),
    ({"every": "1h", "items": '{"id": "a", "data": 1}\n{"id": "b"'}, 400, "items line 2"),
    ({"every": "1h", "items": '{"id": "a", "data": 1}\n{"id": "a", "data": 2}'}, 400, "'a'"),
    ({"name": "taken", "every": "1h"}, 409, "schedule 'taken' already exists"),
    ({"name": "a/b", "every": "1h"}, 400, "schedule"),
])
async def test_the_add_form_refuses_in_one_line_and_writes_nothing(
        web: httpx.AsyncClient, client: AsyncClient, fields: dict[str, str], status: int,
        line: str) -> None:
    await client.add_schedule("taken", every=60)
    csrf = _csrf((await web.get("/schedules/add")).text)
    form = {"csrf": csrf, "name": "fresh", "catch_up": "skip", "items": "", **fields}
    refused = await post(web, "/schedules/add", form)
    assert refused.status_code == status
    shown = alert(refused.text)
    assert line in shown and "\n" not in shown.strip()
    assert f'value="{form["name"]}"' in refused.text  # the form as it was filled in
    if "reduce_gates" in fields:
        assert f'value="{fields["reduce_gates"]}"' in refused.text
    assert [info.name for info in await client.schedules()] == ["taken"]
    assert (await client.schedule("taken")).timing.every == 60


async def test_a_read_only_console_shows_schedules_but_refuses_their_actions(
        db_url: str, table_prefix: str, client: AsyncClient) -> None:
    await client.add_schedule("nightly", cron="0 3 * * *")
    async with _web(db_url, table_prefix, read_only=True) as web:
        page = (await web.get("/schedules")).text
        assert 'data-key="schedule-nightly"' in page
        for hidden in ("/schedules/pause", "/schedules/delete", "/schedules/add", "csrf"):
            assert hidden not in page
        for path in ("/schedules/add", "/schedules/delete?name=nightly"):
            answer = await web.get(path)
            assert answer.status_code == 403 and "read-only" in answer.text
        for verb in ("pause", "resume", "delete", "add"):
            answer = await post(web, f"/schedules/{verb}", {
                "name": "nightly", "csrf": "0" * 32, "every": "1h"})
            assert answer.status_code == 403 and "read-only" in answer.text, verb
    info = await client.schedule("nightly")
    assert info.paused_at is None and [s.name for s in await client.schedules()] == ["nightly"]


async def test_cross_site_and_unsigned_posts_are_refused(
        web: httpx.AsyncClient, client: AsyncClient) -> None:
    await client.add_schedule("nightly", cron="0 3 * * *")
    csrf = _csrf((await web.get("/schedules")).text)
    for verb in ("pause", "delete", "add"):
        form = {"name": "nightly" if verb != "add" else "other", "csrf": csrf, "every": "1h"}
        cross = await web.post(f"/schedules/{verb}", data=form,
                               headers={"origin": "http://evil.example"})
        assert cross.status_code == 403 and "cross-site" in cross.text, verb
        unsigned = await post(web, f"/schedules/{verb}", {**form, "csrf": "0" * 32})
        assert unsigned.status_code == 403 and "session token" in unsigned.text, verb
    assert [info.name for info in await client.schedules()] == ["nightly"]
    assert (await client.schedule("nightly")).paused_at is None
    unknown_verb = await post(web, "/schedules/explode", {"name": "nightly", "csrf": csrf})
    assert unknown_verb.status_code == 404


async def test_an_unknown_schedule_is_one_line(web: httpx.AsyncClient) -> None:
    csrf = _csrf((await web.get("/schedules/add")).text)  # no schedules: no row forms
    for verb in ("pause", "resume", "delete"):
        answer = await post(web, f"/schedules/{verb}", {"name": "ghost", "csrf": csrf})
        assert answer.status_code == 404, verb
        assert alert(answer.text) == ("schedule 'ghost' does not exist; list the schedules "
                                      "with `processor schedules list`")
    confirm = await web.get("/schedules/delete?name=ghost")
    assert confirm.status_code == 404 and "schedule &#39;ghost&#39; does not exist" in \
        confirm.text
    bad = await post(web, "/schedules/pause", {"name": "", "csrf": csrf})
    assert bad.status_code == 400 and "\n" not in alert(bad.text).strip()
