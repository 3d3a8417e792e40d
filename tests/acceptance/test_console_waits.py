"""The console's item page of a parked item in a real browser (Playwright, Debian's
Chromium): its deadline, its Complete and Fail forms and an operator's completion URL
fit a 390 px phone, and Complete writes the data and ends the wait. Its screenshot is
docs/console-item-waiting.png (with ``STATEFEED_SCREENSHOTS=docs``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from processor import AsyncClient, NewItem
from processor.console.server import console_running
from tests.acceptance.harness.browser import chromium
from tests.acceptance.test_console import (
    PHONE,
    SEE,
    _fits,
    _item_url,
    _new_page,
    _options,
    _partition_url,
    _screenshot_folder,
    needs_chromium,  # noqa: F401  # a fixture
    sqlite_database,  # noqa: F401  # a fixture
)
from tests.integration.test_waits import Parker, config
from tests.support.engine import running, wait_until
from watcher import Result, Watcher, WorkItem
from watcher.errors import AlreadyCompletedError
from watcher.store import Store

INVOICE = b'{"invoice": "INV-2026-0042", "amount": 1840.5, "currency": "EUR"}'


class KeepsData(Parker):
    """:class:`Parker`, keeping the item's data as it parks (the page shows the invoice)."""

    async def __call__(self, item: WorkItem) -> Result:
        self.tokens.setdefault(item.id, []).append(item.completion_token)
        return Result(wait=self.wait) if item.gate == 0 else Result(done=True)


@pytest.mark.usefixtures("needs_chromium")
async def test_a_parked_item_is_completed_from_its_page(sqlite_database,  # noqa: F811
                                                        tmp_path: Path) -> None:
    from playwright.async_api import expect

    db_url, prefix = sqlite_database
    parker = KeepsData(timeout=48 * 3600.0)
    store = Store.open(db_url, prefix)
    async with AsyncClient(db_url, prefix) as client, \
            console_running(_options(db_url, prefix)) as url, \
            running(Watcher(store, parker, config())), chromium() as browser:
        await client.create_partition("approvals-2026-11", [
            NewItem("invoice-0042", INVOICE), NewItem("invoice-0043", INVOICE)])

        async def parked() -> bool:
            return len(await client.items("approvals-2026-11", status="waiting")) == 2
        await wait_until(parked, message="both invoices parked")

        page, dialogs = await _new_page(browser)
        await page.goto(_item_url(url, "approvals-2026-11", "invoice-0042"))
        await expect(page.locator("#item-deadline")).to_contain_text(" UTC in 1 d")
        await expect(page.locator("#complete")).to_be_visible()
        folder = _screenshot_folder(tmp_path)
        await page.screenshot(path=str(folder / "console-item-waiting.png"))
        assert (folder / "console-item-waiting.png").stat().st_size > 20_000
        for token in parker.tokens["invoice-0042"]:
            assert token not in await page.content()

        phone = await browser.new_context(viewport=PHONE, device_scale_factor=2,
                                          is_mobile=True)
        small = await phone.new_page()
        await small.goto(_item_url(url, "approvals-2026-11", "invoice-0043"))
        await expect(small.locator("#fail")).to_be_visible()
        await _fits(small)
        # An operator asks for a completion URL: shown once, in the answer to the POST.
        await small.locator("#show-completion-url").click()
        shown = small.locator("#completion-url")
        await expect(shown).to_be_visible(timeout=SEE)
        await _fits(small)
        path = await shown.input_value()
        assert path.startswith("/v1/completions/") and "/item" in small.url
        assert path.rsplit("/", 1)[1] not in small.url, "never in the page's address"
        await small.locator("#complete-data").fill('{"approved_by": "ada"}')
        await small.locator("#complete-done").check()  # done: not run again at its gate
        await small.locator("#complete").click()
        await expect(small.locator("#item-notice")).to_contain_text("Completed", timeout=SEE)
        await expect(small.locator("#complete")).to_have_count(0)
        await _fits(small)
        item = await client.item("approvals-2026-11", "invoice-0043")
        assert item.data == b'{"approved_by":"ada"}' and item.status != "waiting"
        with pytest.raises(AlreadyCompletedError):  # the page's Complete won: once
            await client.complete(path.rsplit("/", 1)[1])
        # The page loaded before the completion is stale: its Fail is told so.
        await page.locator("#fail-message").fill("too late")
        await page.goto(_item_url(url, "approvals-2026-11", "invoice-0043"))
        await expect(page.locator("#fail")).to_have_count(0)
        assert dialogs == []


@pytest.mark.usefixtures("needs_chromium")
async def test_a_parked_partition_shows_as_parked_not_stuck_or_finished(
        sqlite_database, tmp_path: Path) -> None:  # noqa: F811
    """A partition whose items all wait for a completion: its processor lets go of the
    lease, and the console says it is parked (its items, the next deadline by the
    database clock), with no ETA, its waiting items listed and counted, and an overview
    that does not call it a problem. Screenshot: docs/console-partition-parked.png."""
    from playwright.async_api import expect

    db_url, prefix = sqlite_database
    parker = Parker(timeout=3 * 3600.0)
    store = Store.open(db_url, prefix)
    async with AsyncClient(db_url, prefix) as client, \
            console_running(_options(db_url, prefix)) as url, \
            running(Watcher(store, parker, config())), chromium() as browser:
        await client.create_partition("approvals-2026-12", [
            NewItem(f"invoice-{n:04}", INVOICE) for n in range(3)])

        async def let_go() -> bool:
            info = await client.partition("approvals-2026-12")
            return info.counts.get("waiting") == 3 and not info.owner
        await wait_until(let_go, message="all three parked and the lease let go")

        page, dialogs = await _new_page(browser)
        await page.goto(url)
        note = page.locator("#lease-note")
        await expect(note).to_have_attribute("data-kind", "parked")
        await expect(note).to_contain_text("3 items waiting for completion")
        await expect(note).not_to_contain_text("Start one")
        await expect(page.locator("#items-parked .card-count")).to_have_text("3")
        row = page.locator("tr[data-key='approvals-2026-12']")
        await expect(row).to_contain_text(
            "parked: 3 items waiting for completion, next deadline in 2 h")
        await expect(row).not_to_contain_text("waiting for a processor")
        await expect(row.locator(".minigate-count")).to_have_text("0/3 3⏸")

        await page.goto(_partition_url(url, "approvals-2026-12"))
        await expect(page.locator("#live-state")).to_have_text("live", timeout=SEE)
        await expect(page.locator("#parked")).to_contain_text(
            "Parked: 3 items waiting for completion, next deadline in 2 h")
        await expect(page.locator(".eta-time")).to_have_text("none while parked")
        await expect(page.locator(".eta-covers")).not_to_contain_text("(0)")
        await expect(page.locator("#waiting-count")).to_have_text("3")
        await expect(page.locator("tr.waiting-item")).to_have_count(3)
        await expect(page.locator("tr.waiting-item").first).to_contain_text(" UTC in 2 h")
        gate = page.locator("li.step[data-gate='0'] .step-numbers")
        await expect(gate).to_contain_text("3 parked")
        await expect(page.locator("#partition-gate")).to_contain_text("parked")
        await expect(page.locator("main")).not_to_contain_text("waiting for a processor")
        folder = _screenshot_folder(tmp_path)
        await page.screenshot(path=str(folder / "console-partition-parked.png"))
        assert (folder / "console-partition-parked.png").stat().st_size > 20_000

        phone = await browser.new_context(viewport=PHONE, device_scale_factor=2,
                                          is_mobile=True)
        small = await phone.new_page()
        await small.goto(_partition_url(url, "approvals-2026-12"))
        await expect(small.locator("#parked")).to_be_visible()
        await _fits(small)
        assert dialogs == []
    await store.close()
