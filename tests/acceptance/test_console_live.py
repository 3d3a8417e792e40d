"""The partition page follows its partition's live feed in a real browser (Playwright,
Debian's Chromium): with the page's own refreshes blocked, its per-gate counts, its bars
and its status change as a watcher works, drawn from the feed's events alone, as the
server would draw them, without a reload; and the feed stops at the end. Its
screenshot is ``console-live.png`` (in ``STATEFEED_SCREENSHOTS``, else the test's
folder)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from processor import AsyncClient, NewItem
from processor.console.server import console_running
from processor.feed.hub import FeedHub, FeedSettings
from tests.acceptance.harness.browser import chromium
from tests.acceptance.test_console import (
    SEE,
    SteeredHandler,
    _new_page,
    _options,
    _partition_url,
    _screenshot_folder,
    needs_chromium,  # noqa: F401  # a fixture
    sqlite_database,  # noqa: F401  # a fixture
    watchers,
)
from tests.support.servers import serve_app

ITEMS = 12
# The page's live fragment: blocked while the test shows what the feed alone draws.
FRAGMENT = re.compile(r".*/live/partition\?.*")
# A gate's numbers as a page shows them: its text, the bar's label, and its segments.
GATE_SHOWN = """([html, gate]) => {
  const root = html ? new DOMParser().parseFromString(html, "text/html") : document;
  const step = root.querySelector(`li.step[data-gate='${gate}']`);
  return [step.querySelector(".step-numbers").textContent.replace(/\\s+/g, " ").trim(),
          step.querySelector("svg.bar").getAttribute("aria-label"),
          Array.from(step.querySelectorAll("rect.seg")).map(
            (rect) => [rect.getAttribute("class"), parseFloat(rect.getAttribute("x")),
                       parseFloat(rect.getAttribute("width"))])];
}"""


@pytest.mark.usefixtures("needs_chromium")
async def test_the_partition_page_follows_its_live_feed(sqlite_database,  # noqa: F811
                                                         tmp_path: Path) -> None:
    from playwright.async_api import expect

    db_url, prefix = sqlite_database
    handler = SteeredHandler()
    handler.gate(0).clear()
    handler.gate(1).clear()
    hub = FeedHub(FeedSettings(poll_interval=0.1))
    async with serve_app(handler) as handler_url, \
            AsyncClient(db_url, prefix) as client, \
            console_running(_options(db_url, prefix), client, hub) as url, \
            watchers(db_url, prefix, handler_url, "feed-worker-1"), \
            chromium() as browser:
        await client.create_partition("scans-live", [NewItem(f"scan-{n:02}", b"{}")
                                                     for n in range(ITEMS)])
        page, dialogs = await _new_page(browser)
        feeds: list[str] = []
        page.on("request", lambda request: feeds.append(request.url)
                if "/live/partition/events" in request.url else None)
        await page.goto(_partition_url(url, "scans-live"))
        live = page.locator("#live")
        await expect(live).to_have_attribute("data-feed-state", "open", timeout=SEE)
        gate_0 = page.locator("li.step[data-gate='0'] .step-numbers")
        await expect(gate_0).to_have_text(re.compile(rf"0 done\s+{ITEMS} waiting"))
        await page.evaluate("window.__kept = 'this page was not reloaded'")

        # The page's own refreshes fail from now on: what changes, the feed changed.
        blocked: list[str] = []

        async def block(route: Any) -> None:
            blocked.append(route.request.url)
            await route.abort()

        await page.route(FRAGMENT, block)
        handler.gate(0).set()  # gate 0 drains into gate 1, which holds
        await expect(gate_0).to_have_text(f"{ITEMS} done", timeout=SEE)
        # Drawn as the server draws the same state (gate 1 holds every item).
        fragment = await page.request.get(url + "live/partition?id=scans-live")
        assert fragment.ok
        server = await page.evaluate(GATE_SHOWN, [await fragment.text(), 0])
        assert await page.evaluate(GATE_SHOWN, [None, 0]) == server
        assert server[0] == f"{ITEMS} done"
        assert blocked, "the gate move asked for the page's fragment (and was refused)"

        # Let the page fetch its fragment again: gate 1 appears, with its items waiting.
        await page.unroute(FRAGMENT, block)
        await page.evaluate("document.dispatchEvent(new Event('visibilitychange'))")
        gate_1 = page.locator("li.step[data-gate='1'] .step-numbers")
        await expect(gate_1).to_have_text(re.compile(rf"0 done\s+{ITEMS} waiting"),
                                          timeout=SEE)
        await page.screenshot(path=str(_screenshot_folder(tmp_path) / "console-live.png"),
                              full_page=False)

        await page.route(FRAGMENT, block)
        handler.gate(1).set()
        await expect(page.locator("#partition-status .status")).to_have_text(
            "complete", timeout=SEE)
        await expect(gate_1).to_have_text(f"{ITEMS} done")
        await expect(page.locator("#partition-items")).to_have_text(
            f"{ITEMS} · {ITEMS} complete")
        await expect(live).to_have_attribute("data-feed-state", "ended")
        assert await page.evaluate("window.__kept") == "this page was not reloaded"
        assert len(feeds) == 1, f"one feed, closed at its end and never reopened: {feeds}"
        assert hub.subscribers == 0
        assert dialogs == []
        assert (await client.partition("scans-live")).status == "complete"
