"""The console's rewind form on real databases, over HTTP in process: it carries the
version the page read, follows the cross-site and session-token rules of every action,
shows a refusal as one line with nothing written, and says what a rewind did."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest

from processor import AsyncClient, NewItem
from tests.integration.test_console import ORIGIN, _csrf, _web
from watcher.records import ItemWrite
from watcher.store import Store


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


@pytest.fixture
async def web(db_url: str, table_prefix: str) -> AsyncIterator[httpx.AsyncClient]:
    async with _web(db_url, table_prefix, read_only=False) as opened:
        yield opened


async def finished(client: AsyncClient, store: Store) -> None:
    """Partition "job", complete at gate 1: "a" failed at gate 0, "b" complete at gate 1."""
    await client.create_partition("job", [NewItem("a", b""), NewItem("b", b"")],
                                  on_item_failure="continue")
    [won] = await store.leases_take(
        [row for row in await store.leases_read_free(5) if row.id == "job"], "setup", 30)
    ready = {item.id: item for item in await store.items_ready("job", 0, 5)}
    assert await store.items_apply([
        ItemWrite("job", "a", ready["a"].version, "failed", 0, 1, last_error="scan"),
        ItemWrite("job", "b", ready["b"].version, "complete", 1, 0)], "setup") == [True, True]
    await store.partition_transition("job", won.version, "setup", gate=1, status="complete")


def version_in(page: str) -> str:
    match = re.search(r'name="version" value="(\d+)"', page)
    assert match, "no version in the form"
    return match.group(1)


async def test_the_form_rewinds_and_the_page_says_what_it_did(
        web: httpx.AsyncClient, client: AsyncClient, store: Store) -> None:
    await finished(client, store)
    assert 'id="rewind"' in (await web.get("/partition?id=job")).text
    form_page = (await web.get("/partition/rewind?id=job")).text
    info = await client.partition("job")
    assert version_in(form_page) == str(info.version)
    form = {"id": "job", "csrf": _csrf(form_page), "version": str(info.version), "gate": "0"}

    refused = {
        "cross-site": await web.post("/partition/rewind", data=form,
                                     headers={"origin": "http://evil.example"}),
        "no token": await web.post("/partition/rewind", data={**form, "csrf": "0" * 32},
                                   headers={"origin": ORIGIN}),
        "above": await web.post("/partition/rewind", data={**form, "gate": "5"},
                                headers={"origin": ORIGIN}),
        "stale": await web.post("/partition/rewind",
                                data={**form, "version": str(info.version - 1)},
                                headers={"origin": ORIGIN}),
        "unknown item": await web.post("/partition/rewind", data={**form, "items": "zz\n"},
                                       headers={"origin": ORIGIN}),
        "not a gate": await web.post("/partition/rewind", data={**form, "gate": "x"},
                                     headers={"origin": ORIGIN}),
    }
    assert {name: response.status_code for name, response in refused.items()} == {
        "cross-site": 403, "no token": 403, "above": 409, "stale": 409, "unknown item": 409,
        "not a gate": 409}
    assert "only goes back" in refused["above"].text
    assert "changed: it is at version" in refused["stale"].text
    assert "no item &#39;zz&#39;" in refused["unknown item"].text
    assert (await client.partition("job")).version == info.version  # nothing written

    done = await web.post("/partition/rewind", data={**form, "failed_only": "yes"},
                          headers={"origin": ORIGIN})
    assert done.status_code == 303, done.text
    assert done.headers["location"] == (
        "/partition?id=job&notice=rewound&count=1")
    shown = (await web.get(done.headers["location"])).text
    assert "Rewound: 1 item(s) back at its gate" in shown
    # The timeline lists the rewind: from gate 1 to gate 0, one item back, none removed.
    rows = re.search(r'<table class="grid rewinds" id="rewinds">(.*?)</table>', shown, re.S)
    assert rows, "no rewinds table"
    assert re.search(r'<td class="num">1</td><td class="num">0</td><td class="num">1</td>'
                     r'<td class="num">0</td>', rows.group(1)), rows.group(1)
    after = await client.partition("job")
    assert (after.status, after.gate, after.counts) == ("available", 0,
                                                        {"available": 1, "complete": 1})


async def test_a_read_only_console_refuses_the_form(db_url: str, table_prefix: str,
                                                    client: AsyncClient) -> None:
    await client.create_partition("job", [NewItem("a", b"")])
    async with _web(db_url, table_prefix, read_only=True) as web:
        assert 'id="rewind"' not in (await web.get("/partition?id=job")).text
        assert (await web.get("/partition/rewind?id=job")).status_code == 403
        posted = await web.post("/partition/rewind", data={"id": "job", "gate": "0"},
                                headers={"origin": ORIGIN})
        assert posted.status_code == 403
    assert (await client.partition("job")).status == "available"
