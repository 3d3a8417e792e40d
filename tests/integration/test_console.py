"""The console on real databases: the store reads it needs (gate counts, prefix pages,
partitions finished per minute), and its pages and actions over HTTP in process (no
browser): escaping, no database URL, cross-site refusals, read-only, and speed with
10,000 partitions."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from bench.console_pages import fill
from processor import AsyncClient, NewItem
from processor.console.app import create_app, settings_for
from tests.conformance.test_operations import make_finished
from watcher.errors import InvalidInputError
from watcher.records import ItemWrite
from watcher.store import Store
from watcher.store.db.clock import FixedClock
from watcher.store.db.urls import parse_database_url

XSS_ID = "<img src=x onerror=alert(1)>"
XSS_ERROR = "<script>alert('item')</script> & more"
PASSWORD = "sekret-pw-4711"
ORIGIN = "http://127.0.0.1:8090"


def utc_now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


def _url_with_password(db_url: str) -> str:
    """The test URL with a password in it (PostgreSQL's test server trusts 127.0.0.1, so
    any password connects); other databases keep theirs."""
    if db_url.startswith("postgresql://postgres@"):
        return db_url.replace("postgres@", f"postgres:{PASSWORD}@", 1)
    return db_url


@pytest.fixture
async def web(db_url: str, table_prefix: str) -> AsyncIterator[httpx.AsyncClient]:
    """The console (actions on) as an in-process HTTP client on its own AsyncClient."""
    async with _web(db_url, table_prefix, read_only=False) as opened:
        yield opened


@contextlib.asynccontextmanager
async def _web(db_url: str, table_prefix: str, *, read_only: bool
               ) -> AsyncIterator[httpx.AsyncClient]:
    url = parse_database_url(_url_with_password(db_url))
    async with AsyncClient(url, table_prefix) as console_client:
        app = create_app(settings_for(url, table_prefix, host="127.0.0.1", port=8090,
                                      token=None, read_only=read_only), console_client)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url=ORIGIN) as http:
            yield http


def _csrf(page: str) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert match, "no CSRF token in the page"
    return match.group(1)


# -- the store's reads ----------------------------------------------------------

async def test_gate_counts_cover_the_partitions_asked_for(client: AsyncClient) -> None:
    await client.create_partition("p", [NewItem("a", b""), NewItem("b", b"", gate=2),
                                        NewItem("c", b"", gate=2)])
    await client.create_partition("empty", [])
    await client.create_partition("other", [NewItem("z", b"")])
    counts = await client.gate_counts(["p", "empty", "missing", "p"])
    assert counts == {"p": {0: {"available": 1}, 2: {"available": 2}}, "empty": {}}
    assert await client.gate_counts([]) == {}
    with pytest.raises(InvalidInputError, match="at most 1000"):
        await client.gate_counts([f"p{n}" for n in range(1001)])
    with pytest.raises(InvalidInputError, match="partition id"):
        await client.gate_counts([""])


async def test_prefix_pages_match_exactly(client: AsyncClient) -> None:
    ids = ["a%b", "a_b", "a[b]", "a/b", "axb", "A-upper", "ab", "b-a"]
    for partition_id in ids:
        await client.create_partition(partition_id, [NewItem("i", b"")])
    for prefix, expected in [("a%", {"a%b"}), ("a_", {"a_b"}), ("a[", {"a[b]"}),
                             ("a/", {"a/b"}), ("A", {"A-upper"}), ("b", {"b-a"}),
                             ("a", {"a%b", "a_b", "a[b]", "a/b", "axb", "ab"}), ("zz", set())]:
        page = await client.partitions(id_prefix=prefix)
        assert {info.id for info in page} == expected, prefix
        assert all(info.counts == {"available": 1} for info in page)
    # Paged with a prefix: every match once, and no counts when not asked for.
    seen: list[str] = []
    after = None
    while True:
        page = await client.partitions(limit=2, after=after, id_prefix="a",
                                       with_counts=False)
        seen += [info.id for info in page]
        assert all(info.counts == {} for info in page)
        if page.next_cursor is None:
            break
        after = page.next_cursor
    assert sorted(seen) == sorted(["a%b", "a_b", "a[b]", "a/b", "axb", "ab"])
    for bad in ("x" * 256, "a\x00"):  # too long; a NUL, which PostgreSQL refuses in text
        with pytest.raises(InvalidInputError, match="id_prefix"):
            await client.partitions(id_prefix=bad)


async def test_partitions_finished_per_minute(make_store, client: AsyncClient) -> None:
    now = utc_now()
    clock = FixedClock(now)
    store: Store = make_store(clock=clock)
    await make_finished(store, clock, "done-now", "complete", at=now - timedelta(seconds=10))
    await make_finished(store, clock, "done-2", "complete", at=now - timedelta(seconds=150))
    await make_finished(store, clock, "failed-2", "failed", at=now - timedelta(seconds=170))
    await make_finished(store, clock, "cancelled", "cancelled", at=now - timedelta(seconds=70))
    await make_finished(store, clock, "too-old", "complete", at=now - timedelta(minutes=20))
    await make_finished(store, clock, "open", "available", at=now - timedelta(seconds=5))
    clock.set(now)
    counted = await store.partitions_finished_per_minute(5, 100)
    assert counted.minutes == 5
    assert counted.finished == {"complete": (0, 0, 1, 0, 1), "failed": (0, 0, 1, 0, 0),
                                "cancelled": (0, 0, 0, 1, 0)}
    capped = await store.partitions_finished_per_minute(5, 1)
    assert capped.finished["complete"] == (0, 0, 1, 0, 1)
    # Through the client, by the database's own clock: the recent ones are in the window.
    recent = await client.throughput(30)
    assert sum(recent.finished["complete"]) >= 1 and len(recent.finished["failed"]) == 30
    with pytest.raises(InvalidInputError, match="minutes"):
        await client.throughput(0)
    with pytest.raises(InvalidInputError, match="cap"):
        await client.backlog(0)


async def test_lease_holders_and_now(client: AsyncClient, store: Store) -> None:
    for name in ("a", "b", "c"):
        await client.create_partition(name, [NewItem("i", b"")])
    free = await store.leases_read_free(10)
    await store.leases_take(free[:2], "w-busy", 30)
    await store.leases_take(free[2:], "w-idle", 30)
    assert await client.lease_holders() == {"w-busy": 2, "w-idle": 1}
    assert abs((await client.now() - utc_now()).total_seconds()) < 60


# -- the web pages, in process ----------------------------------------------------

async def test_pages_escape_ids_and_errors_and_never_show_the_url(
        web: httpx.AsyncClient, client: AsyncClient, store: Store, db_url: str) -> None:
    await client.create_partition(XSS_ID, [NewItem("<b>item</b>", b"{}"), NewItem("ok", b"")])
    await store.leases_take(await store.leases_read_free(5), "<i>owner</i>", 30)
    ready = {item.id: item for item in await store.items_ready(XSS_ID, 0, 10)}
    await store.items_apply([ItemWrite(XSS_ID, "<b>item</b>", ready["<b>item</b>"].version,
                                       "failed", 0, 3, last_error=XSS_ERROR)], "<i>owner</i>")
    paths = ["/", "/partitions", f"/partitions?prefix={XSS_ID}", "/live/overview",
             "/live/partitions", f"/partition?id={XSS_ID}", f"/live/partition?id={XSS_ID}",
             f"/partition?id={XSS_ID}&status=failed", f"/partition/delete?id={XSS_ID}",
             "/partition?id=<nope>", "/partitions?status=<bad>"]
    secrets = [PASSWORD, db_url, parse_database_url(db_url).redacted()]
    for path in paths:
        answer = await web.get(path)
        assert answer.status_code in (200, 400, 404), (path, answer.status_code)
        page = answer.text
        for raw in (XSS_ID, "<b>item</b>", "<i>owner</i>", "<script>alert", "<nope>",
                    "<bad>"):
            assert raw not in page, (path, raw)
        for secret in secrets:
            assert secret not in page, (path, secret)
        assert "127.0.0.1:5432" not in page and "3306" not in page
    partition = (await web.get(f"/partition?id={XSS_ID}")).text
    assert "&lt;img src=x onerror=alert(1)&gt;" in partition
    assert "&lt;script&gt;alert(&#39;item&#39;)&lt;/script&gt; &amp; more" in partition
    assert "&lt;i&gt;owner&lt;/i&gt;" in partition
    assert (await web.get("/partition?id=<nope>")).status_code == 404
    assert (await web.get("/partitions?status=<bad>")).status_code == 400
    assert (await web.get("/partition?id=x&gate=-1")).status_code == 400


async def test_retry_failed_on_a_complete_partition_re_opens_it_and_says_so(
        web: httpx.AsyncClient, client: AsyncClient, store: Store) -> None:
    """A "continue" partition complete with a failure offers Retry failed; the retry
    re-opens it (nothing is stranded) and the page says what the retry did."""
    await client.create_partition("job", [NewItem("a", b""), NewItem("b", b"")],
                                  on_item_failure="continue")
    [won] = await store.leases_take(await store.leases_read_free(5), "setup", 30)
    ready = {item.id: item for item in await store.items_ready("job", 0, 5)}
    assert await store.items_apply([
        ItemWrite("job", "a", ready["a"].version, "failed", 0, 1, last_error="scan"),
        ItemWrite("job", "b", ready["b"].version, "complete", 1, 0)], "setup") == [True, True]
    await store.partition_transition("job", won.version, "setup", gate=1, status="complete")
    page = (await web.get("/partition?id=job")).text
    assert 'id="retry"' in page
    retried = await web.post("/partition/retry", data={"id": "job", "csrf": _csrf(page)},
                             headers={"origin": ORIGIN})
    assert retried.status_code == 303
    shown = (await web.get(retried.headers["location"])).text
    assert ("Retried: re-opened partition &#39;job&#39; (complete at gate 1) at gate 0; "
            "1 failed item(s) reset.") in shown
    info = await client.partition("job")
    assert (info.status, info.gate, info.counts) == ("available", 0,
                                                     {"available": 1, "complete": 1})


async def test_actions_need_the_session_token_and_a_page_of_the_console(
        web: httpx.AsyncClient, client: AsyncClient) -> None:
    await client.create_partition("job", [NewItem("i", b"")])
    page = (await web.get("/partition?id=job")).text
    csrf = _csrf(page)
    form = {"id": "job", "csrf": csrf}
    cross_site = await web.post("/partition/cancel", data=form,
                                headers={"origin": "http://evil.example"})
    assert cross_site.status_code == 403 and "cross-site" in cross_site.text
    no_origin = await web.post("/partition/cancel", data=form)
    assert no_origin.status_code == 403
    stale = await web.post("/partition/cancel", data={"id": "job", "csrf": "0" * 32},
                           headers={"origin": ORIGIN})
    assert stale.status_code == 403 and "reload" in stale.text
    # Another browser (another session cookie) cannot use this session's token.
    cookies = dict(web.cookies)
    web.cookies.clear()
    stolen = await web.post("/partition/cancel", data=form, headers={"origin": ORIGIN})
    assert stolen.status_code == 403
    web.cookies.clear()
    web.cookies.update(cookies)
    as_json = await web.post("/partition/cancel", json=form, headers={"origin": ORIGIN})
    assert as_json.status_code == 400
    assert (await client.partition("job")).status == "available"

    done = await web.post("/partition/cancel", data=form, headers={"origin": ORIGIN})
    assert done.status_code == 303
    assert done.headers["location"] == "/partition?id=job&notice=cancelled"
    assert (await client.partition("job")).status == "cancelled"
    shown = await web.get(done.headers["location"])
    assert "Cancelled: no processor dispatches its items" in shown.text

    again = await web.post("/partition/retry", data=form, headers={"referer": ORIGIN + "/"})
    assert again.status_code == 303 and "notice=retried" in again.headers["location"]
    assert (await client.partition("job")).status == "available"

    gone = await web.post("/partition/delete", data=form, headers={"origin": ORIGIN})
    assert gone.status_code == 303
    assert gone.headers["location"] == "/partitions?notice=deleted&id=job&count=1"
    assert "Deleted partition job and its 1 item(s)." in (await web.get(
        gone.headers["location"])).text
    assert (await web.post("/partition/cancel", data=form, headers={"origin": ORIGIN})
            ).status_code == 404
    assert (await web.post("/partition/explode", data=form, headers={"origin": ORIGIN})
            ).status_code == 404


async def test_a_leased_partition_asks_for_force(web: httpx.AsyncClient, client: AsyncClient,
                                                  store: Store) -> None:
    await client.create_partition("busy", [NewItem("i", b"")])
    await store.leases_take(await store.leases_read_free(5), "worker-7", 30)
    confirm = (await web.get("/partition/delete?id=busy")).text
    assert "worker-7" in confirm and 'name="force"' in confirm
    form = {"id": "busy", "csrf": _csrf(confirm)}
    refused = await web.post("/partition/delete", data=form, headers={"origin": ORIGIN})
    assert refused.status_code == 409 and "worker-7" in refused.text
    forced = await web.post("/partition/delete", data={**form, "force": "yes"},
                            headers={"origin": ORIGIN})
    assert forced.status_code == 303
    assert await client.partitions() == []


async def test_read_only_hides_and_refuses_the_actions(db_url: str, table_prefix: str,
                                                       client: AsyncClient) -> None:
    await client.create_partition("job", [NewItem("i", b"")])
    await client.cancel("job")
    async with _web(db_url, table_prefix, read_only=True) as web:
        page = (await web.get("/partition?id=job")).text
        assert "read-only" in page
        assert "<form" not in page and "Delete" not in page and "Retry" not in page
        assert (await web.get("/partition/delete?id=job")).status_code == 403
        for verb in ("retry", "cancel", "delete"):
            refused = await web.post(f"/partition/{verb}", data={"id": "job", "csrf": "x"},
                                     headers={"origin": ORIGIN})
            assert refused.status_code == 403 and "read-only" in refused.text
    assert (await client.partition("job")).status == "cancelled"


async def test_items_page_in_pages_with_filters(web: httpx.AsyncClient,
                                               client: AsyncClient) -> None:
    await client.create_partition("big", [NewItem(f"item-{n:03}", b"", gate=n % 2)
                                          for n in range(70)])
    first = (await web.get("/partition?id=big")).text
    assert first.count('<tr data-key="item-') == 50
    cursor = re.search(r'href="/partition\?id=big&amp;after=(item-049)"', first)
    assert cursor, "no next page of items"
    second = (await web.get("/partition?id=big&after=item-049")).text
    assert second.count('<tr data-key="item-') == 20 and "item-050" in second
    assert "first page" in second and "next page" not in second
    at_gate = (await web.get("/partition?id=big&gate=1&status=available")).text
    rows = re.findall(r'<tr data-key="(item-\d+)"', at_gate)
    assert len(rows) == 35 and all(int(row[-3:]) % 2 == 1 for row in rows)
    assert (await web.get("/partition?id=big&status=lost")).status_code == 400


async def test_a_database_failure_is_a_503_that_names_no_url() -> None:
    url = parse_database_url(f"postgresql://app:{PASSWORD}@127.0.0.1:1/jobs")
    async with AsyncClient(url) as unreachable:
        app = create_app(settings_for(url, "", host="127.0.0.1", port=8090, token=None,
                                      read_only=False), unreachable)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url=ORIGIN) as web:
            for path in ("/", "/partitions", "/partition?id=x", "/live/overview"):
                answer = await web.get(path)
                assert answer.status_code == 503, path
                assert "Database unavailable" in answer.text
                assert PASSWORD not in answer.text and "127.0.0.1:1" not in answer.text
            fragment = (await web.get("/live/partition?id=x")).text
            assert fragment.lstrip().startswith('<section class="panel problem"')


# -- 10,000 partitions -------------------------------------------------------------

PARTITIONS = 10_000
# Statements one page may send, whatever the number of partitions: a page of 50 rows
# that read each row's items (or every partition) would send one per row. How long a
# page takes is measured by `python -m bench.console_pages`, not asserted here.
STATEMENTS_PER_PAGE = 25


async def test_pages_stay_fast_with_10000_partitions(db_url: str, table_prefix: str,
                                                     web: httpx.AsyncClient) -> None:
    await asyncio.to_thread(fill, db_url, table_prefix, PARTITIONS)
    first = await web.get("/partitions")
    cursor = re.search(r'href="/partitions\?after=([^"&]+)"', first.text)
    assert cursor, "no next page link"
    paths = ["/", "/live/overview", "/partitions", "/partitions?status=failed",
             "/partitions?prefix=job-09", "/partitions?prefix=nothing-matches",
             f"/live/partitions?after={cursor.group(1)}", "/partition?id=job-04321",
             "/partition?id=job-04321&status=complete", "/live/partition?id=job-00005"]
    sent: list[str] = []

    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    event.listen(Engine, "before_cursor_execute", note)
    try:
        for path in paths:
            sent.clear()
            answer = await web.get(path)
            assert answer.status_code == 200, (path, answer.text[:500])
            # A page's reads are bounded by the page, not by the 10,000 partitions.
            assert 0 < len(sent) <= STATEMENTS_PER_PAGE, (path, len(sent), sent)
    finally:
        event.remove(Engine, "before_cursor_execute", note)
    listing = (await web.get("/partitions")).text
    assert listing.count('class="id"><a href="/partition?id=job-') == 50
    assert "job-09999" in listing  # newest first
    overview = (await web.get("/")).text
    assert ">2,500<" in overview  # each status's count
    prefixed = (await web.get("/partitions?prefix=job-099")).text
    assert prefixed.count('href="/partition?id=job-099') == 50


# -- a partition with thousands of gates ---------------------------------------------

MANY_GATES = 4000


async def test_a_partition_with_thousands_of_gates(client: AsyncClient,
                                                   web: httpx.AsyncClient) -> None:
    """Each page works out what it shows: a list row its 8 gates (and how many more), the
    partition page every gate once. (The work per page is counted in
    tests/unit/test_console_pages.py; here the pages answer, with the right numbers.)"""
    await client.create_partition("wide", [NewItem(f"i{gate:05}", b"{}", gate=gate)
                                           for gate in range(MANY_GATES)])
    await client.create_partition("narrow", [NewItem("a", b"{}")])
    paths = ["/", "/live/overview", "/partitions", "/live/partitions", "/partition?id=wide",
             "/live/partition?id=wide"]
    answers = {path: await web.get(path) for path in paths}
    for path, answer in answers.items():
        assert answer.status_code == 200, (path, answer.text[:500])
    listing = answers["/partitions"].text
    # A row of "wide" (at gate 0): gates 0..7 and the rest counted.
    assert listing.count('class="minigate state-') == 8 + 1
    assert f"+{MANY_GATES - 8} gates" in listing
    assert 'data-key="g7"' in listing and 'data-key="g8"' not in listing
    page = answers["/partition?id=wide"].text
    assert page.count('class="step state-') == MANY_GATES
    # The last gate: every other item is still available before it.
    last = page[page.index(f'data-key="gate-{MANY_GATES - 1}"'):]
    assert f"{MANY_GATES - 1:,} not reached" in last[:2000]
