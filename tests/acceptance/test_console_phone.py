"""Every page the console serves fits a 390 px phone, in a real browser (Playwright,
Debian's Chromium): the document is no wider than the screen.

The pages come from the console's own routes (every GET route but its live parts, its
feed and its files), so a new page fails here until it is given an address below, with
data whose ids, keys, names, URLs and errors are long enough to push a page wider if
anything in it does not wrap or scroll in a box of its own.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from starlette.routing import Route

from processor import AsyncClient, NewItem
from processor.console.app import create_app, settings_for
from processor.console.feed_page import FEED_PATH
from processor.console.server import console_running
from processor.notify.deliverer import Deliverer
from processor.notify.policy import NotifyConfig
from tests.acceptance.harness.browser import chromium
from tests.acceptance.test_console import (
    PHONE,
    SEE,
    TOKEN,
    _fits,
    _options,
    needs_chromium,  # noqa: F401  # a fixture
    sqlite_database,  # noqa: F401  # a fixture
)
from tests.support.engine import running, wait_until
from tests.support.receiver import Receiver
from tests.support.servers import serve_app
from watcher import Result, Wait, Watcher, WorkItem
from watcher.config import WatcherConfig
from watcher.protocol import NonRetryableError
from watcher.store import Store
from watcher.store.db.urls import parse_database_url

# Long, unbroken names: what a page must wrap or scroll inside a box of its own.
LONG = "x" * 90
PARTITION = f"quarterly-{LONG}-report"
PARKED = f"approvals-{LONG}-2026"
KEY = f"tenant-{LONG}-eu"
OWNER = f"processor-{LONG}-7f3a"
SCHEDULE = f"nightly-{LONG}-export"
PIPELINE = "invoices-" + "x" * 46 + "-pipeline"  # 64 characters: the limit
ERROR = "scan has no text layer: " + "y" * 200
SECRET = b"whsec-test-0123456789abcdef-secret"


class LongRunner:
    """Gate 0: items named ``failed-...`` fail for good with a long error, ``parked-...``
    park for a completion (a day at most), the rest move to gate 1; gate 1 completes."""

    async def __call__(self, item: WorkItem) -> Result:
        if item.id.startswith("failed-"):
            raise NonRetryableError(f"{ERROR} ({item.id})")
        if item.id.startswith("parked-") and item.gate == 0:
            return Result(wait=Wait(86400.0))
        return Result(done=True) if item.gate else Result(gate=1)


def page_paths(app: Any) -> set[str]:
    """The paths of the pages ``app`` (a console) serves to a browser: its GET routes but
    the live parts the pages fetch, the live feed and the icon (its static files are a
    mount, not a route)."""
    return {route.path for route in app.app.routes
            if isinstance(route, Route) and "GET" in (route.methods or ())
            and not route.path.startswith("/live/") and route.path not in (
                FEED_PATH, "/favicon.ico")}


def addresses() -> dict[str, list[str]]:
    """Each page's addresses (path and query) over the data :func:`long_names` writes."""
    def at(path: str, **query: str) -> str:
        return path + ("?" + urlencode(query) if query else "")

    return {
        "/": [at("/")],
        "/partitions": [at("/partitions"), at("/partitions", prefix="done-" + LONG),
                        at("/partitions", status="available")],
        "/partition": [at("/partition", id=PARTITION), at("/partition", id=PARKED),
                       at("/partition", id=PARTITION, status="failed"),
                       at("/partition", id="nothing-here")],
        "/item": [at("/item", partition=PARTITION, id=f"failed-{LONG}"),
                  at("/item", partition=PARTITION, id=f"done-{LONG}-0"),
                  at("/item", partition=PARKED, id=f"parked-{LONG}-0")],
        "/partition/rewind": [at("/partition/rewind", id=PARTITION)],
        "/partition/delete": [at("/partition/delete", id=PARTITION)],
        "/flow": [at("/flow")],
        "/schedules": [at("/schedules")],
        "/schedules/add": [at("/schedules/add")],
        "/schedules/delete": [at("/schedules/delete", name=SCHEDULE)],
        "/notifications": [at("/notifications")],
        "/login": [at("/login")],
    }


async def long_names(db_url: str, prefix: str, client: AsyncClient) -> None:
    """Partitions, items, keys, grants, schedules and a dead notification, each with a
    long name; the partitions run to where the pages show them (done, failed, parked)."""
    store = Store.open(db_url, prefix)
    config = WatcherConfig(owner_id=OWNER, poll_interval=0.05, lease_duration=3.0,
                           retry_backoff=0.05, retry_backoff_max=0.2)
    data = json.dumps({"note": "z" * 300, "nested": {"path": "/a" * 80}}).encode()
    try:
        async with running(Watcher(store, LongRunner(), config)):
            await client.create_partition(PARTITION, [
                *(NewItem(f"done-{LONG}-{n}", data) for n in range(3)),
                NewItem(f"failed-{LONG}", data)], on_item_failure="continue", key=KEY)
            await client.create_partition(PARKED, [NewItem(f"parked-{LONG}-{n}", data)
                                                   for n in range(2)])
            assert (await client.wait(PARTITION, timeout=60)).status == "complete"

            async def parked() -> bool:
                return (await client.partition(PARKED)).counts.get("waiting") == 2
            await wait_until(parked, message="the long-named items parked")
        await client.set_key_limit(KEY, 8)
        await client.pause_key(KEY)
        await store.flow_grant(KEY, OWNER, limit=8, wanted=5, in_use=0, duration=300)
        receiver = Receiver(SECRET, status=400)
        async with serve_app(receiver) as base:
            await client.add_schedule(SCHEDULE, cron="0 3 * * *", items=[NewItem("a", b"{}")],
                                      pipeline=PIPELINE, notify=f"{base}/{LONG}?token={LONG}")
            await client.create_partition(f"cancelled-{LONG}", [NewItem("a", b"{}")],
                                          notify=f"{base}/hooks/{LONG}")
            await client.cancel(f"cancelled-{LONG}")
            deliverer = Deliverer(store, OWNER, NotifyConfig(
                secret=SECRET, allow_private=True, timeout=2.0, backoff=0.01,
                backoff_cap=0.05, interval=0.05, max_attempts=1))
            try:
                async def dead() -> bool:
                    await deliverer.run_once()
                    return bool(await client.notifications(state="dead"))
                await wait_until(dead, message="the notification dead")
            finally:
                await deliverer.close()
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def signed_in(browser: Any, url: str, **context: Any) -> AsyncIterator[Any]:
    """A page of a fresh browser context, signed in to the console at ``url``."""
    made = await browser.new_context(**context)
    page = await made.new_page()
    await page.goto(f"{url}?token={TOKEN}")
    try:
        yield page
    finally:
        await made.close()


@pytest.mark.usefixtures("needs_chromium")
async def test_every_page_the_console_serves_fits_a_390_px_phone(
        sqlite_database, tmp_path: Path) -> None:  # noqa: F811
    from playwright.async_api import expect

    db_url, prefix = sqlite_database
    served = page_paths(create_app(settings_for(
        parse_database_url(db_url), prefix, host="127.0.0.1", port=0, token=TOKEN,
        read_only=False)))
    pages = addresses()
    assert served <= set(pages), (
        f"pages without an address here: {sorted(served - set(pages))}; give each one "
        "(with long names in its data) so that it is checked on a phone")
    assert {"/", "/partitions", "/partition", "/item", "/flow", "/schedules",
            "/notifications"} <= served
    async with AsyncClient(db_url, prefix) as client, \
            console_running(_options(db_url, prefix, token=TOKEN)) as url, \
            chromium() as browser:
        await long_names(db_url, prefix, client)
        # The phone as a phone: its layout viewport widens to a page that is too wide,
        # which _fits catches by the screen's width, not innerWidth alone.
        phones = [dict(viewport=PHONE, device_scale_factor=2, is_mobile=True, has_touch=True),
                  dict(viewport=PHONE)]
        too_wide: list[str] = []  # every page that does not fit, not only the first
        for phone in phones:
            async with signed_in(browser, url, **phone) as page:
                for path in sorted(pages):
                    for address in pages[path]:
                        await page.goto(url + address.lstrip("/"))
                        try:
                            await _fits(page)
                        except AssertionError as problem:
                            too_wide.append(str(problem).splitlines()[0])
                assert not too_wide, "\n".join(too_wide)
                # The answers of forms: a completion path with its note, and the add
                # form's refusal, long values and all.
                await page.goto(f"{url}item?" + urlencode(
                    {"partition": PARKED, "id": f"parked-{LONG}-1"}))
                await page.locator("#show-completion-url").click()
                await expect(page.locator("#completion-url-note")).to_be_visible(timeout=SEE)
                await _fits(page)
                await page.goto(f"{url}schedules/add")
                await page.locator("#schedule-name").fill(SCHEDULE + "-2")
                await page.locator("#schedule-every").fill(LONG)
                await page.locator("#confirm-add").click()
                await expect(page.locator("#add-error")).to_be_visible(timeout=SEE)
                await _fits(page)
        # The nav wraps: every link of it is on the screen, none scrolled away.
        async with signed_in(browser, url, **phones[0]) as page:
            await page.goto(f"{url}partition?" + urlencode({"id": PARKED}))
            for link in await page.locator("header nav a").all():
                box = await link.bounding_box()
                assert box is not None and box["x"] >= 0 and \
                    box["x"] + box["width"] <= PHONE["width"], await link.text_content()
            await expect(page.locator("#parked")).to_be_visible()
            # A look at it (tests/acceptance/test_console.py takes the docs' phone shot).
            await page.screenshot(path=str(tmp_path / "console-phone-parked.png"))
            assert (tmp_path / "console-phone-parked.png").stat().st_size > 20_000
