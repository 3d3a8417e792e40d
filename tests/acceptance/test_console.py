"""The web console in headless Chromium, against real watchers and a real uvicorn handler.

The console, the watchers and the handler run in this test's event loop (the
console on its own uvicorn socket, as ``processor console`` serves it); the
browser is the system's Chromium, driven by Playwright. ``processor console``
and ``processor demo --console`` also run as subprocesses.

With ``STATEFEED_SCREENSHOTS=docs`` (or another folder) the screenshot test
writes the docs' images there (docs/how-to/console.md and the README show them);
otherwise into the test's temporary folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import httpx
import pytest

from processor import AsyncClient, NewItem
from processor.console.server import ConsoleOptions, console_running
from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from tests.acceptance.harness.browser import chromium, require_chromium
from tests.acceptance.harness.processes import run_cli, spawn
from tests.support.engine import wait_until
from tests.support.servers import answered_probe, read_body, send_json, serve_app
from watcher.config import WatcherConfig
from watcher.errors import ConfigError, PartitionNotFoundError
from watcher.records import ItemWrite
from watcher.store import Store
from watcher.store.db.clock import FixedClock
from watcher.store.db.migrate import downgrade, upgrade
from watcher.store.db.urls import parse_database_url
from watcher.watcher import Watcher

XSS_ID = "<img src=x onerror=alert(1)>"
XSS_ITEM = "<img src=y onerror=alert(2)>"
XSS_ERROR = "<script>alert(3)</script> scan has no text layer"
TOKEN = "console-test-token-0123456789"
# How long a browser expectation waits: a few of the pages' 1.5 s refreshes.
SEE = 15_000
# An ETA needs the running partition's progress in its timeline, which the lease
# holder writes with its renewals: give a loaded machine a few renewals' time.
SEE_PROGRESS = 45_000
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def needs_chromium() -> None:
    """Skip (locally) or fail (with CI set) a browser test where Chromium is missing."""
    require_chromium()


browser_test = pytest.mark.usefixtures("needs_chromium")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(database URL, table prefix): a migrated namespace on SQLite or PostgreSQL."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'console.db'}"
    else:
        from tests.conftest import POSTGRES_URL, require_postgres

        require_postgres()
        url = POSTGRES_URL
    prefix = f"con{uuid.uuid4().hex[:8]}_"
    upgrade(url, prefix)
    yield url, prefix
    downgrade(url, prefix)


@pytest.fixture
def sqlite_database(tmp_path: Path) -> tuple[str, str]:
    """(database URL, table prefix) on a fresh SQLite file."""
    url = f"sqlite:///{tmp_path / 'console.db'}"
    upgrade(url, "")
    return url, ""


@dataclass
class SteeredHandler:
    """A two-gate handler a test steers: calls at gate g wait while ``gates[g]`` is clear,
    items named in ``failing`` fail for good with ``error``, and every call takes
    ``delay`` seconds. Gate 0 moves an item to gate 1; gate 1 completes it."""

    gates: dict[int, asyncio.Event] = field(default_factory=dict)
    failing: set[str] = field(default_factory=set)
    error: str = "unreadable scan: no text layer"
    delay: float = 0.0

    def gate(self, gate: int) -> asyncio.Event:
        """The event gate ``gate``'s calls wait for (open unless a test closed it)."""
        if gate not in self.gates:
            self.gates[gate] = asyncio.Event()
            self.gates[gate].set()
        return self.gates[gate]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await answered_probe(scope, send):
            return
        await read_body(receive)
        headers = dict(scope["headers"])
        item = unquote(headers.get(b"x-item-id", b"").decode())
        gate = int(headers.get(b"x-gate", b"0"))
        await self.gate(gate).wait()
        if self.delay:
            await asyncio.sleep(self.delay)
        if item in self.failing:
            await send_json(send, 422, {"error": {"message": self.error, "no_retry": True}})
        elif gate == 0:
            await send_json(send, 200, {"gate": 1, "data": {"item": item}})
        else:
            await send_json(send, 200, {"done": True})


@contextlib.asynccontextmanager
async def watchers(db_url: str, prefix: str, handler_url: str, *owners: str
                   ) -> AsyncIterator[list[Watcher]]:
    """Real watchers on the database, POSTing to ``handler_url``, for the block."""
    started: list[tuple[Watcher, HttpProcessor, Store, asyncio.Task[None]]] = []
    for owner in owners:
        store = Store.open(db_url, prefix)
        http = HttpProcessor(HttpProcessorConfig(handler_url=f"{handler_url}/"))
        watcher = Watcher(store, http, WatcherConfig(
            owner_id=owner, concurrency=4, poll_interval=0.1, lease_duration=5.0,
            retry_backoff=0.05, retry_backoff_max=0.2, shutdown_timeout=2.0))
        started.append((watcher, http, store, asyncio.create_task(watcher.run())))
    try:
        yield [watcher for watcher, *_ in started]
    finally:
        for watcher, http, store, task in started:
            await watcher.stop()
            await task
            await http.aclose()
            await store.close()


def _options(db_url: str, prefix: str, **overrides: Any) -> ConsoleOptions:
    return ConsoleOptions(db_url=parse_database_url(db_url), table_prefix=prefix, port=0,
                          **overrides)


async def _new_page(browser: Any) -> tuple[Any, list[str]]:
    """A page in a fresh context, and the list its dialogs (alert, confirm) go to."""
    context = await browser.new_context(viewport={"width": 1360, "height": 900})
    page = await context.new_page()
    dialogs: list[str] = []

    async def dismissed(dialog: Any) -> None:
        dialogs.append(dialog.message)
        await dialog.dismiss()

    page.on("dialog", dismissed)
    return page, dialogs


def _partition_url(base: str, partition_id: str, **params: str) -> str:
    query = "&".join(f"{key}={quote(value)}" for key, value in params.items())
    return f"{base}partition?id={quote(partition_id, safe='')}" + (f"&{query}" if query
                                                                   else "")


@browser_test
async def test_overview_and_list_follow_a_processor_at_work(database) -> None:
    from playwright.async_api import expect

    db_url, prefix = database
    handler = SteeredHandler()
    handler.gate(0).clear()
    handler.gate(1).clear()
    async with serve_app(handler) as handler_url, \
            AsyncClient(db_url, prefix) as client, \
            console_running(_options(db_url, prefix)) as url, \
            watchers(db_url, prefix, handler_url, "console-worker-1"), \
            chromium() as browser:
        await client.create_partition("opening-7", [NewItem(f"resume-{n:02}", b"{}")
                                                    for n in range(20)])
        page, _ = await _new_page(browser)
        await page.goto(url)
        row = page.locator("tr[data-key='opening-7']")
        await expect(row).to_contain_text("console-worker-1", timeout=SEE)
        holders = page.locator("table.holders")
        await expect(holders).to_contain_text("console-worker-1")
        await expect(holders.locator("td.num")).to_have_text("1")
        await expect(row.locator(".minigate[data-key='g0'] .minigate-count")).to_have_text("0/20")
        await page.evaluate("window.__kept = 'this page was not reloaded'")

        handler.gate(0).set()  # gate 0 drains; gate 1 holds
        await expect(row.locator(".minigate[data-key='g0'] .minigate-count")).to_have_text(
            "20/20", timeout=SEE)
        await expect(row.locator(".minigate[data-key='g1'] .minigate-count")).to_have_text(
            "0/20")
        await expect(row).to_contain_text("1 · items")
        assert await page.evaluate("window.__kept") == "this page was not reloaded"

        await page.goto(f"{url}partitions")
        listed = page.locator("tr[data-key='opening-7']")
        await expect(listed).to_contain_text("available")
        await page.evaluate("window.__kept = 'still the same page'")
        handler.gate(1).set()
        await expect(listed.locator(".status")).to_have_text("complete", timeout=SEE)
        await expect(listed.locator(".minigate[data-key='g1'] .minigate-count")).to_have_text(
            "20/20")
        assert await page.evaluate("window.__kept") == "still the same page"
        assert (await client.partition("opening-7")).status == "complete"

        await page.goto(url)
        await expect(page.locator(".card-complete .card-count")).to_have_text("1")
        await expect(page.locator("tr[data-key='opening-7']")).to_have_count(0)


@browser_test
async def test_a_failed_partition_shows_its_error_and_retry_completes_it(
        sqlite_database) -> None:
    from playwright.async_api import expect

    db_url, prefix = sqlite_database
    handler = SteeredHandler(failing={"resume-bad"})
    async with serve_app(handler) as handler_url, \
            AsyncClient(db_url, prefix) as client, \
            console_running(_options(db_url, prefix)) as url, \
            watchers(db_url, prefix, handler_url, "worker-a"), \
            chromium() as browser:
        await client.create_partition("batch-9", [
            *(NewItem(f"resume-{n}", b"{}") for n in range(4)), NewItem("resume-bad", b"{}")])
        failed = await client.wait("batch-9", timeout=30)
        assert failed.status == "failed"
        page, _ = await _new_page(browser)
        await page.goto(_partition_url(url, "batch-9"))
        await expect(page.locator(".summary .status")).to_have_text("failed")
        failure = page.locator("section.failures tr[data-key='resume-bad']")
        await expect(failure).to_contain_text("unreadable scan: no text layer")
        await expect(page.locator(".timeline .state-failed")).to_contain_text("1 failed")

        handler.failing.clear()
        await page.click("#retry")
        await expect(page.locator(".notice")).to_contain_text(
            "Retried: re-opened partition 'batch-9' (failed at gate 0) at gate 0; 1 failed "
            "item(s) reset.")
        await expect(page.locator(".summary .status")).to_have_text("complete", timeout=SEE)
        await expect(page.locator("section.failures")).to_have_count(0)
        assert (await client.partition("batch-9")).counts == {"complete": 5}


@browser_test
async def test_cancel_and_delete_and_read_only_hides_them(sqlite_database) -> None:
    from playwright.async_api import expect

    db_url, prefix = sqlite_database
    handler = SteeredHandler()
    handler.gate(0).clear()  # the partition stays in flight, leased by the watcher
    async with serve_app(handler) as handler_url, \
            AsyncClient(db_url, prefix) as client, \
            console_running(_options(db_url, prefix)) as url, \
            console_running(_options(db_url, prefix, read_only=True)) as read_only_url, \
            watchers(db_url, prefix, handler_url, "worker-b"), \
            chromium() as browser:
        await client.create_partition("long-1", [NewItem(f"i{n}", b"{}") for n in range(3)])
        await wait_until(lambda: _leased(client, "long-1"), timeout=15, message="a lease")

        viewer, _ = await _new_page(browser)
        await viewer.goto(_partition_url(read_only_url, "long-1"))
        await expect(viewer.locator(".badge.readonly")).to_have_text("read-only")
        await expect(viewer.locator(".summary")).to_contain_text("worker-b")
        for action in ("#retry", "#cancel", "#delete"):
            await expect(viewer.locator(action)).to_have_count(0)
        refused = await viewer.request.post(f"{read_only_url}partition/cancel",
                                            form={"id": "long-1", "csrf": "x"},
                                            headers={"origin": read_only_url.rstrip("/")})
        assert refused.status == 403

        page, dialogs = await _new_page(browser)
        await page.goto(_partition_url(url, "long-1"))
        await page.click("#cancel")
        await expect(page.locator(".notice")).to_contain_text("Cancelled")
        await expect(page.locator(".summary .status")).to_have_text("cancelled")
        assert (await client.partition("long-1")).status == "cancelled"

        await page.click("#delete")
        await expect(page.locator("h1")).to_contain_text("Delete partition long-1?")
        assert (await client.partition("long-1")).status == "cancelled"  # asked first
        await page.click("#confirm-delete")
        await expect(page.locator(".notice")).to_have_text(
            "Deleted partition long-1 and its 3 item(s).")
        await expect(page.locator("tr[data-key='long-1']")).to_have_count(0)
        with pytest.raises(PartitionNotFoundError):
            await client.partition("long-1")
        assert dialogs == []
        handler.gate(0).set()


@browser_test
async def test_bulk_retry_and_cancel_from_the_list(sqlite_database) -> None:
    """Tick partitions in the list and cancel or retry them at once: each is acted on as
    its own page's button would, the list says how many of those ticked were, the
    ticks survive the list's live refresh, and a read-only console shows no boxes."""
    from playwright.async_api import expect

    db_url, prefix = sqlite_database
    async with AsyncClient(db_url, prefix) as client, \
            console_running(_options(db_url, prefix)) as url, \
            console_running(_options(db_url, prefix, read_only=True)) as read_only_url, \
            chromium() as browser:
        names = ["bulk-a", f"bulk-{XSS_ID}", "bulk-c"]
        for name in names:
            await client.create_partition(name, [NewItem("i", b"{}")])
        page, dialogs = await _new_page(browser)
        await page.goto(f"{url}partitions")
        boxes = {name: page.locator(f"tr[data-key={json.dumps(name)}] td.select input")
                 for name in names}
        await boxes["bulk-a"].check()
        await boxes[names[1]].check()
        await _live_update(page)  # a refresh keeps what was ticked
        assert await boxes["bulk-a"].is_checked() and await boxes[names[1]].is_checked()
        await page.click("#bulk-cancel")
        await expect(page.locator(".notice")).to_have_text(
            "Cancelled 2 of 2 selected partition(s): no processor dispatches their items "
            "any more. Retry resumes them.")
        assert [(await client.partition(name)).status for name in names] == [
            "cancelled", "cancelled", "available"]

        for name in names:
            await boxes[name].check()
        await page.click("#bulk-retry")
        await expect(page.locator(".notice")).to_contain_text(
            "Retried 2 of 3 selected partition(s)")
        await expect(page.locator(".notice")).to_contain_text("1 had nothing to retry.")
        assert {(await client.partition(name)).status for name in names} == {"available"}

        await page.click("#bulk-cancel")  # nothing ticked: nothing done, and it says so
        await expect(page.locator(".notice")).to_have_text(
            "Nothing selected: tick the partitions to act on first.")
        assert dialogs == []

        viewer, _ = await _new_page(browser)
        await viewer.goto(f"{read_only_url}partitions")
        await expect(viewer.locator("tr[data-key='bulk-a']")).to_be_visible()
        await expect(viewer.locator("td.select, #bulk")).to_have_count(0)
        refused = await viewer.request.post(f"{read_only_url}partitions/bulk",
                                            form={"verb": "cancel", "id": "bulk-a",
                                                  "csrf": "x"},
                                            headers={"origin": read_only_url.rstrip("/")})
        assert refused.status == 403
        cross = await page.request.post(f"{url}partitions/bulk",
                                        form={"verb": "cancel", "id": "bulk-a", "csrf": "x"},
                                        headers={"origin": "http://elsewhere.example"})
        assert cross.status == 403
        assert (await client.partition("bulk-a")).status == "available"


async def _leased(client: AsyncClient, partition_id: str) -> bool:
    return bool((await client.partition(partition_id)).owner)


@browser_test
async def test_markup_in_ids_and_errors_renders_as_text(sqlite_database) -> None:
    from playwright.async_api import expect

    db_url, prefix = sqlite_database
    handler = SteeredHandler(failing={XSS_ITEM}, error=XSS_ERROR)
    async with serve_app(handler) as handler_url, \
            AsyncClient(db_url, prefix) as client, \
            console_running(_options(db_url, prefix)) as url, \
            watchers(db_url, prefix, handler_url, "<b>worker</b>"), \
            chromium() as browser:
        await client.create_partition(XSS_ID, [NewItem(XSS_ITEM, b"{}"), NewItem("ok", b"")])
        assert (await client.wait(XSS_ID, timeout=30)).status == "failed"
        page, dialogs = await _new_page(browser)
        await page.goto(url)  # the failed partition is counted there, not listed
        await expect(page.locator(".card-failed .card-count")).to_have_text("1")
        for address in (f"{url}partitions", _partition_url(url, XSS_ID),
                        _partition_url(url, XSS_ID, status="failed")):
            await page.goto(address)
            await expect(page.get_by_text(XSS_ID, exact=True).first).to_be_visible()
            assert await _live_update(page)  # one live update patched the page
        await expect(page.locator("#partition-id")).to_have_text(XSS_ID)
        await expect(page.locator("tr[data-key='<img src=y onerror=alert(2)>']")).to_contain_text(
            XSS_ERROR)
        assert await page.locator("main img, main script").count() == 0
        assert dialogs == []


@browser_test
async def test_without_the_token_a_console_beyond_loopback_answers_401(
        sqlite_database) -> None:
    from playwright.async_api import expect

    db_url, prefix = sqlite_database
    with pytest.raises(ConfigError, match="beyond loopback"):
        _options(db_url, prefix, host="127.0.0.2")
    # 127.0.0.2 is not one of the three loopback names, so it needs the token like any
    # other address; and it is this machine, so the test binds it for real.
    async with AsyncClient(db_url, prefix) as client, \
            console_running(_options(db_url, prefix, host="127.0.0.2", token=TOKEN)) as url, \
            chromium() as browser:
        assert url.startswith("http://127.0.0.2:")
        await client.create_partition("secret-job", [NewItem("i", b"")])
        async with httpx.AsyncClient() as http:
            for path in ("", "partitions", "live/overview", "live/partitions"):
                answer = await http.get(url + path)
                assert answer.status_code == 401, path
                assert "secret-job" not in answer.text  # the listings are not shown
            assert (await http.get(f"{url}partition?id=secret-job")).status_code == 401
            assert (await http.post(f"{url}partition/cancel",
                                    data={"id": "secret-job"})).status_code == 401
            bearer = await http.get(url, headers={"authorization": f"Bearer {TOKEN}"})
            assert bearer.status_code == 200 and "secret-job" in bearer.text

        page, _ = await _new_page(browser)
        refused = await page.goto(url)
        assert refused is not None and refused.status == 401
        await expect(page.locator("h1")).to_have_text("Sign in")
        await page.goto(f"{url}partitions?token={TOKEN}")
        assert page.url == f"{url}partitions"  # the token left the address bar
        await expect(page.locator("tr[data-key='secret-job']")).to_be_visible()
        await page.goto(_partition_url(url, "secret-job"))
        await expect(page.locator("#partition-id")).to_have_text("secret-job")

        other, _ = await _new_page(browser)
        await other.goto(url)
        await other.fill("input[name=token]", "not-the-token-at-all")
        await other.click("button[type=submit]")
        await expect(other.locator(".alert")).to_contain_text("not this console's token")
        await other.fill("input[name=token]", TOKEN)
        await other.click("button[type=submit]")
        await expect(other.locator("h1")).to_have_text("Overview")


async def test_processor_console_as_a_command(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    for host in ("0.0.0.0", "127.0.0.2"):
        refused = run_cli("console", "--db-url", db, "--host", host, env={
            "PROCESSOR_CONSOLE_TOKEN": ""})
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.count("\n") == 1 and "beyond loopback" in refused.stderr
    short = run_cli("console", "--db-url", db, "--token", "short")
    assert short.returncode == 2 and "at least 16 characters" in short.stderr
    unmigrated = run_cli("console", "--db-url", db, "--port", "0")
    assert unmigrated.returncode == 1, unmigrated.stderr
    assert unmigrated.stderr.count("\n") == 1 and "processor migrate" in unmigrated.stderr

    upgrade(db)
    proc = await spawn("console", ["console", "--db-url", db, "--port", "0", "--read-only"],
                       tmp_path)
    try:
        line = await wait_until(lambda: _printed_url(proc.stdout_path), timeout=20,
                                message="the console's address")
        assert "(read-only)" in line
        url = re.search(r"http://127\.0\.0\.1:\d+/", line).group(0)  # type: ignore[union-attr]
        async with httpx.AsyncClient() as http:
            answer = await http.get(url)
            assert answer.status_code == 200 and "read-only" in answer.text
            port = url.rsplit(":", 1)[1].rstrip("/")
            busy = run_cli("console", "--db-url", db, "--port", port)
            assert busy.returncode == 2 and "cannot listen on 127.0.0.1:" in busy.stderr
    finally:
        code = await proc.terminate()
    assert code == 0, proc.stderr()
    assert "Traceback" not in proc.stderr()


def _printed_url(path: Path) -> str | None:
    text = path.read_text(errors="replace") if path.exists() else ""
    return next((line for line in text.splitlines() if "http://" in line), None)


@browser_test
async def test_demo_keeps_the_console_open(tmp_path: Path) -> None:
    from playwright.async_api import expect

    proc = await spawn("demo", ["demo", "--console", "--console-port", "0"], tmp_path,
                       env={"COLUMNS": "120"})
    try:
        line = await wait_until(lambda: _printed_url(proc.stdout_path), timeout=30,
                                message="the console's address")
        url = re.search(r"http://127\.0\.0\.1:\d+/", line).group(0)  # type: ignore[union-attr]
        async with chromium() as browser:
            page, _ = await _new_page(browser)
            await page.goto(f"{url}partitions")  # before the demo's partition exists
            row = page.locator("tr[data-key='opening-42']")
            await expect(row).to_be_visible(timeout=SEE)  # it appears by itself
            await expect(row.locator(".status")).to_have_text("complete", timeout=30_000)
            await page.goto(_partition_url(url, "opening-42"))
            await expect(page.locator("pre.result")).to_contain_text('"ranked": 34')
            await expect(page.locator("section.failures")).to_contain_text("resume-")
        await wait_until(lambda: "stays open" in proc.stdout_path.read_text(), timeout=30,
                         message="the demo's end")
        proc.process.send_signal(signal.SIGINT)
        code = await proc.wait(20)
    finally:
        if proc.running:
            proc.kill()
    output = proc.output()
    assert code == 0, output
    assert "resumes ranked" in output and "Traceback" not in output


# -- items, search, timeline, phones -----------------------------------------------

SCRIPT_DATA = {"name": "<script>alert(4)</script>", "n": 7}
RAW = bytes(range(256)) * 12  # 3,072 bytes, not JSON: a hex dump, cut at 1 KiB
PHONE = {"width": 390, "height": 844}
LONG_ID = "quarterly-" + "x" * 70 + "-report"


@dataclass
class InspectedHandler:
    """Gate 0 moves each item to gate 1 (``parent-0`` also spawns ``child-0`` there);
    gate 1 completes it. ``flaky`` fails twice (retryable), then for good. Gate 1's
    calls of items numbered ``hold_from`` or more wait for ``release``."""

    hold_from: int = 30
    release: asyncio.Event = field(default_factory=asyncio.Event)
    calls: dict[str, int] = field(default_factory=dict)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await answered_probe(scope, send):
            return
        await read_body(receive)
        headers = dict(scope["headers"])
        item = unquote(headers.get(b"x-item-id", b"").decode())
        gate = int(headers.get(b"x-gate", b"0"))
        self.calls[item] = self.calls.get(item, 0) + 1
        if item == "flaky":
            if self.calls[item] < 3:
                await send_json(send, 503, {"error": {
                    "message": f"scanner busy (call {self.calls[item]})"}})
            else:
                await send_json(send, 422, {"error": {"message": "unreadable scan",
                                                      "no_retry": True}})
        elif gate == 0:
            spawn = ([{"id": "child-0", "gate": 1, "data": {"from": "parent-0"}}]
                     if item == "parent-0" else [])
            await send_json(send, 200, {"gate": 1, "spawn": spawn})
        else:
            number = item.rsplit("-", 1)[-1]
            if number.isdigit() and int(number) >= self.hold_from:
                await self.release.wait()
            await send_json(send, 200, {"done": True})


@contextlib.asynccontextmanager
async def inspected(db_url: str, prefix: str) -> AsyncIterator[tuple[str, AsyncClient]]:
    """A console over two partitions that both hold ``resume-07``: ``shelf-a`` complete
    (JSON, binary, spawned and failed items), ``shelf-b`` running at gate 1 with half of
    its items held there. Yields the console's URL and a client."""
    handler = InspectedHandler()
    async with serve_app(handler) as handler_url, \
            AsyncClient(db_url, prefix) as client, \
            console_running(_options(db_url, prefix)) as url, \
            watchers(db_url, prefix, handler_url, "processor-a1"):
        await client.create_partition(LONG_ID, [
            *(NewItem(f"resume-{n:02}", json.dumps(SCRIPT_DATA).encode()) for n in range(10)),
            NewItem("scan-raw", RAW), NewItem("flaky", b"{}"), NewItem("parent-0", b"{}"),
        ], on_item_failure="continue")
        # After the first one: shelf-b's held calls fill the processor's slots.
        assert (await client.wait(LONG_ID, timeout=60)).status == "complete"
        await client.create_partition("shelf-b", [NewItem(f"resume-{n:02}", b"{}")
                                                  for n in range(60)])
        try:
            yield url, client
        finally:
            handler.release.set()


async def _fits(page: Any) -> None:
    """The page has no horizontal overflow: the document is no wider than the screen.

    A mobile context lays a page that is too wide out in a wider layout viewport
    (``innerWidth`` grows with it), so the screen's width is the context's viewport,
    not ``innerWidth`` alone. Measured once the page has loaded: before its stylesheet
    applies, a page lays long ids out unbroken."""
    await page.wait_for_load_state("load")
    width, inner = await page.evaluate(
        "[document.documentElement.scrollWidth, window.innerWidth]")
    screen = page.viewport_size["width"]
    assert width <= inner <= screen, (f"{page.url}: {width} px wide (layout viewport "
                                      f"{inner} px) on a {screen} px screen")


# Resolves with the live-state text once the page's live part has been patched by a
# refresh: the one the page makes when its tab comes back into view, asked for at once
# rather than waited for (every 1.5 s); null on a page without a live part.
_LIVE_UPDATE = """() => new Promise((resolve) => {
  const state = document.getElementById("live-state");
  if (!document.querySelector("[data-live]") || !state) { resolve(null); return; }
  const observer = new MutationObserver(() => {
    observer.disconnect(); window.clearTimeout(late); resolve(state.textContent); });
  const late = window.setTimeout(() => {
    observer.disconnect(); resolve("no live update in 15 s"); }, 15000);
  observer.observe(state, {attributes: true, childList: true, characterData: true});
  document.dispatchEvent(new Event("visibilitychange"));
})"""


async def _live_update(page: Any) -> bool:
    """Have the page refresh its live part now and wait until the update is patched in
    (``console.js`` writes the live state after the patch). Returns whether the page
    has a live part.

    Raises:
        AssertionError: the update did not come within 15 s or did not succeed.
    """
    state = await page.evaluate(_LIVE_UPDATE)
    assert state in (None, "live"), f"{page.url}: {state}"
    return state is not None


def _item_url(base: str, partition_id: str, item_id: str, **params: str) -> str:
    query = "".join(f"&{key}={quote(value)}" for key, value in params.items())
    return (f"{base}item?partition={quote(partition_id, safe='')}"
            f"&id={quote(item_id, safe='')}{query}")


@browser_test
async def test_item_pages_search_by_item_id_and_the_timeline(database) -> None:
    from playwright.async_api import expect

    db_url, prefix = database
    async with inspected(db_url, prefix) as (url, client), chromium() as browser:
        page, dialogs = await _new_page(browser)
        # Search: the exact item id finds it in both partitions.
        await page.goto(f"{url}partitions?prefix=resume-07")
        found = page.locator("#found")
        await expect(found.locator("tbody tr")).to_have_count(2)
        await expect(found).to_contain_text("shelf-b")
        await found.locator(f"tr[data-key='{LONG_ID}'] a.item-link").click()
        await expect(page.locator("#item-id")).to_have_text("resume-07")
        await expect(page.locator("#item-partition")).to_have_text(LONG_ID)
        await expect(page.locator(".summary .status")).to_have_text("complete")
        await expect(page.locator("#item-gate")).to_have_text("1")
        await expect(page.locator("#item-data")).to_contain_text(
            '"name": "<script>alert(4)</script>"')
        assert await page.locator("main script").count() == 0
        await page.goto(f"{url}partitions?prefix=resume-0")  # a prefix finds no item
        await expect(page.locator("#found-none")).to_contain_text("resume-0")

        # The error history, the latest first.
        await page.goto(_item_url(url, LONG_ID, "flaky"))
        history = page.locator("table.history tbody tr")
        await expect(history).to_have_count(3)
        await expect(history.nth(0)).to_contain_text("unreadable scan")
        await expect(history.nth(2)).to_contain_text("scanner busy (call 1)")
        assert [await row.locator("td.num").first.inner_text() for row in
                await history.all()] == ["3", "2", "1"]

        # Data that is not JSON: a hex dump, cut, and all of it on asking.
        await page.goto(_item_url(url, LONG_ID, "scan-raw"))
        await expect(page.locator("#data-title")).to_contain_text("3,072 bytes · hex")
        await expect(page.locator("#item-data")).not_to_contain_text("00000400")
        await page.click("#show-all")
        await expect(page.locator("#item-data")).to_contain_text("00000bf0  f0 f1 f2")
        await expect(page.locator("#show-all")).to_have_count(0)

        # A spawned item links its parent; the partition's items link their pages.
        await page.goto(_item_url(url, LONG_ID, "child-0"))
        await page.locator("#item-parent a").click()
        await expect(page.locator("#item-id")).to_have_text("parent-0")
        await page.goto(_partition_url(url, LONG_ID))
        await page.locator("table.items tr[data-key='scan-raw'] a").click()
        await expect(page.locator("#item-id")).to_have_text("scan-raw")
        missing = await page.goto(_item_url(url, LONG_ID, "no-such-item"))
        assert missing is not None and missing.status == 404

        # The timeline of a finished partition: both gates' stays, no ETA.
        await page.goto(_partition_url(url, LONG_ID))
        stays = page.locator("table.gate-times tbody tr")
        await expect(stays).to_have_count(2)
        await expect(stays.nth(0).locator("td").first).to_have_text("1")
        # Gate 0: 13 items left it (one failed for good); gate 1: 12 and the spawned one.
        await expect(stays.locator("td:nth-child(4)")).to_have_text(["13", "13"])
        await expect(page.locator(".eta-time")).to_have_text("—")
        await expect(page.locator(".eta-covers")).to_contain_text("the partition is complete")
        await expect(page.locator("#timeline-title")).to_contain_text("26 in all")

        # A running partition: gate 1's ETA from the recent rate, for the whole partition.
        await page.goto(_partition_url(url, "shelf-b"))
        await expect(page.locator(".eta-time")).to_have_text(re.compile(r"\d"),
                                                    timeout=SEE_PROGRESS)
        await expect(page.locator(".eta-covers")).to_contain_text(
            "the whole partition: gate 1 is its last gate with waiting items (30)")
        await expect(page.locator(".eta-rate")).to_contain_text("/s over the last 5 min")
        await expect(page.locator("table.gate-times tr.current")).to_contain_text("so far")
        timeline = await client.partition_timeline("shelf-b")
        assert [span.gate for span in timeline.gates] == [0, 1]
        assert dialogs == []


@browser_test
async def test_every_page_fits_a_390_px_phone(sqlite_database) -> None:
    db_url, prefix = sqlite_database
    async with inspected(db_url, prefix) as (url, client), chromium() as browser:
        context = await browser.new_context(viewport=PHONE, device_scale_factor=2,
                                            is_mobile=True, has_touch=True)
        page = await context.new_page()
        addresses = [
            url, f"{url}partitions", f"{url}partitions?prefix=resume-07",
            _partition_url(url, LONG_ID), _partition_url(url, "shelf-b"),
            _partition_url(url, LONG_ID, status="failed"),
            _item_url(url, LONG_ID, "flaky"), _item_url(url, LONG_ID, "scan-raw", all="1"),
            _item_url(url, LONG_ID, "resume-07"),
            f"{url}partition/delete?id={quote(LONG_ID)}", _item_url(url, "nope", "nope"),
        ]
        for address in addresses:
            await page.goto(address)
            await _fits(page)
            if await _live_update(page):  # after a live update too
                await _fits(page)
        # The narrow layout hides secondary columns rather than squeezing them.
        await page.goto(_partition_url(url, LONG_ID))
        assert not await page.locator("table.items th.secondary").first.is_visible()
        assert await client.partition(LONG_ID)


# -- screenshots ------------------------------------------------------------------

def _screenshot_folder(tmp_path: Path) -> Path:
    named = os.environ.get("STATEFEED_SCREENSHOTS")
    if not named:
        return tmp_path
    folder = Path(named) if Path(named).is_absolute() else REPO / named
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@dataclass
class HeldResumes:
    """The resume example handler, with the calls of chosen partitions held: item calls
    at gate 0 of items past ``hold_after`` in ``held_items``, and reduce calls of
    ``held_reduces``, until ``release`` is set."""

    app: Any
    held_items: set[str] = field(default_factory=set)
    held_reduces: set[str] = field(default_factory=set)
    hold_after: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = dict(scope["headers"])
            partition = unquote(headers.get(b"x-partition-id", b"").decode())
            item = unquote(headers.get(b"x-item-id", b"").decode())
            reducing = scope["path"].endswith("/reduce")
            number = int(item.rsplit("-", 1)[1]) if item[-1:].isdigit() else 0
            if (reducing and partition in self.held_reduces) or (
                    not reducing and partition in self.held_items
                    and number >= self.hold_after):
                await self.release.wait()
        await self.app(scope, receive, send)


@browser_test
async def test_screenshots_of_every_page(sqlite_database, tmp_path: Path) -> None:

    from handlers.examples.resumes import app as resumes_app
    from handlers.examples.samples import sample_resumes

    db_url, prefix = sqlite_database
    folder = _screenshot_folder(tmp_path)
    handler = HeldResumes(resumes_app, held_items={"opening-43"}, held_reduces={"opening-44"},
                          hold_after=22)
    now = datetime.now(UTC).replace(tzinfo=None)
    clock = FixedClock(now)
    aged = Store.open(db_url, prefix, clock=clock)
    try:
        # Partitions that finished over the last quarter of an hour, for the chart.
        for n in range(40):
            status = "failed" if n % 9 == 4 else "cancelled" if n % 13 == 7 else "complete"
            clock.set(now - timedelta(seconds=800 - n * 19 - (n % 4) * 7))
            await _finished(aged, f"nightly-{n:02}", status)
    finally:
        await aged.close()
    async with serve_app(handler) as handler_url, \
            AsyncClient(db_url, prefix) as client, \
            console_running(_options(db_url, prefix)) as url, \
            watchers(db_url, prefix, handler_url, "processor-7f3a", "processor-c41d"), \
            chromium() as browser:
        async def opening(name: str, size: int, unreadable: int, policy: str) -> None:
            await client.create_partition(name, [
                NewItem(f"resume-{n:03}", document) for n, document in enumerate(
                    sample_resumes(size, seed=len(name) + size, unreadable=unreadable))
            ], reduce_gates=[1], on_item_failure=policy)

        # The finished ones first: the held calls fill the processors' slots.
        await opening("opening-40", 12, 1, "fail")
        await opening("opening-42", 36, 2, "continue")
        assert (await client.wait("opening-42", timeout=60)).status == "complete"
        assert (await client.wait("opening-40", timeout=60)).status == "failed"
        await opening("opening-43", 40, 1, "continue")
        await opening("opening-44", 28, 0, "continue")
        await wait_until(lambda: _settled_before_hold(client), timeout=60,
                         message="the held partitions at rest")

        try:
            await _take_screenshots(browser, url, folder, client)
        finally:
            handler.release.set()


async def _finished(store: Store, partition_id: str, status: str) -> None:
    """A partition of 3 items that its processor finished ``status`` at the store's time:
    its items complete (one failed, for a failed one), or left as they were (cancelled)."""
    await store.partition_create(partition_id, [NewItem(f"item-{n}", b"{}") for n in range(3)])
    if status == "cancelled":
        await store.partition_cancel(partition_id)
        return
    [row] = [row for row in await store.leases_read_free(100) if row.id == partition_id]
    [lease] = await store.leases_take([row], "processor-c41d", 30)
    ready = await store.items_ready(partition_id, 0, 10)
    await store.items_apply([
        ItemWrite(partition_id, item.id, item.version,
                  "failed" if status == "failed" and n == 0 else "complete", 0, 1,
                  last_error="timeout after 30 s" if status == "failed" and n == 0 else None)
        for n, item in enumerate(ready)], "processor-c41d")
    await store.partition_transition(partition_id, lease.version, "processor-c41d",
                                     status=status)


async def _take_screenshots(browser: Any, url: str, folder: Path, client: AsyncClient) -> None:
    from playwright.async_api import expect

    page, dialogs = await _new_page(browser)
    [failed] = list(await client.items("opening-40", status="failed", limit=1))
    shots = {
        "console-overview.png": url,
        "console-partitions.png": f"{url}partitions",
        "console-partition.png": _partition_url(url, "opening-42"),
        "console-partition-running.png": _partition_url(url, "opening-43"),
        "console-partition-failed.png": _partition_url(url, "opening-40"),
        "console-item.png": _item_url(url, "opening-40", failed.id),
    }
    for file_name, address in shots.items():
        await page.goto(address)
        if file_name != "console-item.png":  # the item page is not live
            await expect(page.locator("#live-state")).to_have_text("live", timeout=SEE)
        await page.wait_for_timeout(400)  # the bars' transitions end
        target = folder / file_name
        # The first screen of each page (all of the overview): what a docs reader sees.
        await page.screenshot(path=str(target), full_page=file_name == "console-overview.png")
        assert target.stat().st_size > 20_000, file_name
    # The running partition's timeline: items per minute, time per gate, its ETA.
    await page.goto(_partition_url(url, "opening-43"))
    await expect(page.locator(".eta-time")).to_have_text(re.compile(r"\d"),
                                                    timeout=SEE_PROGRESS)
    await page.wait_for_timeout(400)
    await page.locator("#timeline").screenshot(path=str(folder / "console-timeline.png"))
    assert (folder / "console-timeline.png").stat().st_size > 10_000
    # A phone: the partition page, 390 px wide, with nothing sticking out.
    phone = await browser.new_context(viewport=PHONE, device_scale_factor=2, is_mobile=True)
    small = await phone.new_page()
    await small.goto(_partition_url(url, "opening-40"))
    await expect(small.locator("#live-state")).to_have_text("live", timeout=SEE)
    await _fits(small)
    await small.screenshot(path=str(folder / "console-phone.png"))
    assert (folder / "console-phone.png").stat().st_size > 20_000
    assert dialogs == []


async def _settled_before_hold(client: AsyncClient) -> bool:
    running = await client.gate_counts(["opening-43", "opening-44"])
    held_items = running.get("opening-43", {}).get(1, {}).get("available", 0)
    reducing = running.get("opening-44", {}).get(1, {}).get("available", 0)
    return held_items >= 21 and reducing >= 28


# -- flow control -------------------------------------------------------------------

@browser_test
async def test_the_flow_page_and_the_partition_pause(sqlite_database, tmp_path: Path) -> None:
    """The Flow page lists keys with their limits, pauses and live grants per processor;
    its buttons pause and resume a key and everything (the database says so), it fits
    a 390 px phone, and the partition page shows a key, a priority and a pause with its
    Pause and Resume buttons. Its screenshot is docs/console-flow.png."""
    from playwright.async_api import expect

    db_url, prefix = sqlite_database
    store = Store.open(db_url, prefix)
    async with AsyncClient(db_url, prefix) as client, \
            console_running(_options(db_url, prefix)) as url, \
            console_running(_options(db_url, prefix, read_only=True)) as read_only_url, \
            chromium() as browser:
        for key, count in (("acme-corp", 3), ("globex", 1), ("initech", 2)):
            for n in range(count):
                await client.create_partition(f"{key}-{n}", [NewItem("a", b"{}")], key=key,
                                              priority=2 if key == "globex" else 0)
        await client.set_key_limit("acme-corp", 8)
        await client.set_key_rate("acme-corp", 25)
        await client.set_key_limit("initech", 2)
        await client.pause_key("initech")
        # Live grants, as processors under a limit hold them (globex: the default limit).
        for key, owner, limit, wanted in (("acme-corp", "processor-7f3a", 8, 5),
                                          ("acme-corp", "processor-c41d", 8, 3),
                                          ("globex", "processor-c41d", 4, 1)):
            await store.flow_grant(key, owner, limit=limit, wanted=wanted, in_use=0,
                                   duration=300)
        page, dialogs = await _new_page(browser)
        await page.goto(f"{url}flow")
        acme = page.locator("tr[data-key='key-acme-corp']")
        await expect(acme).to_contain_text("processor-7f3a: 5")
        await expect(acme).to_contain_text("processor-c41d: 3")
        await expect(acme.locator("td").nth(3)).to_have_text("8")  # granted in all
        await expect(page.locator("tr[data-key='key-globex'] td").nth(1)).to_have_text(
            "default")
        await expect(page.locator("tr[data-key='key-initech']")).to_contain_text("paused")
        await _fits(page)
        folder = _screenshot_folder(tmp_path)
        await page.screenshot(path=str(folder / "console-flow.png"))

        await acme.locator("button").click()
        await expect(page.locator(".notice")).to_contain_text("Paused key 'acme-corp'")
        assert [row.name for row in await client.flow_controls() if row.paused_at] == [
            "acme-corp", "initech"]
        await page.click("#pause-all")
        await expect(page.locator("#fleet-paused")).to_contain_text("Everything is paused")
        assert ("fleet", "") in [(row.scope, row.name) for row in await client.flow_controls()
                                 if row.paused_at]
        await page.click("#resume-all")
        await expect(page.locator(".notice")).to_contain_text("Resumed everything")
        await expect(page.locator("#fleet-paused")).to_have_count(0)
        await page.locator("tr[data-key='key-acme-corp'] button").click()
        await expect(page.locator(".notice")).to_contain_text("Resumed key 'acme-corp'")
        assert [row.name for row in await client.flow_controls() if row.paused_at] == [
            "initech"]

        await page.goto(_partition_url(url, "globex-0"))
        await expect(page.locator("#flow-key")).to_have_text("globex")
        await expect(page.locator("#priority")).to_have_text("+2")
        await page.click("#pause")
        await expect(page.locator(".notice")).to_contain_text("Paused")
        await expect(page.locator("#paused")).to_contain_text("paused")
        assert (await client.partition("globex-0")).paused_at is not None
        await page.click("#resume")
        await expect(page.locator("#paused")).to_have_text("no")
        assert (await client.partition("globex-0")).paused_at is None
        assert dialogs == []

        viewer, _ = await _new_page(browser)
        await viewer.goto(f"{read_only_url}flow")
        await expect(viewer.locator("tr[data-key='key-acme-corp']")).to_be_visible()
        await expect(viewer.locator("#pause-all")).to_have_count(0)
        await expect(viewer.locator("table.flow-keys button")).to_have_count(0)
        refused = await viewer.request.post(f"{read_only_url}flow/pause-all", form={"csrf": "x"},
                                            headers={"origin": read_only_url.rstrip("/")})
        assert refused.status == 403
        cross = await page.request.post(f"{url}flow/pause-all", form={"csrf": "x"},
                                        headers={"origin": "http://elsewhere.example"})
        assert cross.status == 403
        assert not any(row.scope == "fleet" and row.paused_at
                       for row in await client.flow_controls())

        context = await browser.new_context(viewport=PHONE, device_scale_factor=2,
                                            is_mobile=True, has_touch=True)
        phone = await context.new_page()
        await client.pause_all()
        for address in (f"{url}flow", _partition_url(url, "acme-corp-0")):
            await phone.goto(address)
            await _fits(phone)
        await expect(phone.locator("#fleet-paused")).to_have_count(0)  # partition page
    await store.close()


async def _inside(page: Any, selector: str) -> list[dict[str, float]]:
    """The boxes of what ``selector`` matches, each checked to lie within the viewport
    (not cut off by a scrolling box or the screen's edge)."""
    boxes = await page.evaluate("""selector => [...document.querySelectorAll(selector)]
        .map(element => { const r = element.getBoundingClientRect();
          let box = element.parentElement, clipped = false;
          while (box) { const b = box.getBoundingClientRect(), s = getComputedStyle(box);
            if (s.overflowX !== 'visible' && (r.right > b.right + 0.5 || r.left < b.left - 0.5))
              clipped = true;
            box = box.parentElement; }
          return {left: r.left, right: r.right, width: r.width, clipped}; })""", selector)
    width = PHONE["width"]  # the phone's, however wide a page overflowing it lays out
    assert boxes, selector
    for box in boxes:
        assert not box["clipped"] and box["left"] >= 0 and box["right"] <= width, (selector,
                                                                                    box)
    return boxes


@browser_test
async def test_a_phone_sees_the_flow_buttons_and_whole_error_lines(
        sqlite_database, tmp_path: Path) -> None:
    """At 390 px the Flow page's buttons are on screen, not in a box scrolled sideways,
    and the item page's error history reads in lines of a sane width, not 10
    characters. Screenshots: console-phone-flow.png and console-phone-item.png."""
    db_url, prefix = sqlite_database
    folder = _screenshot_folder(tmp_path)
    store = Store.open(db_url, prefix)
    async with inspected(db_url, prefix) as (url, client), chromium() as browser:
        for key in ("acme-corp", "globex-international-holdings"):
            await client.create_partition(f"{key}-0", [NewItem("a", b"{}")], key=key)
            await client.set_key_limit(key, 8)
        await client.pause_key("acme-corp")
        await store.flow_grant("globex-international-holdings", "processor-7f3a", limit=8,
                               wanted=5, in_use=0, duration=300)
        context = await browser.new_context(viewport=PHONE, device_scale_factor=2,
                                            is_mobile=True, has_touch=True)
        phone = await context.new_page()
        await phone.goto(f"{url}flow")
        await _fits(phone)
        await _inside(phone, "table.flow-keys button")
        await _inside(phone, "#pause-all")
        await phone.screenshot(path=str(folder / "console-phone-flow.png"), full_page=True)
        await phone.goto(_item_url(url, LONG_ID, "flaky"))
        await _fits(phone)
        await _inside(phone, ".crumbs a")  # the long partition id wraps
        for box in await _inside(phone, ".history pre.error"):
            assert box["width"] >= 250, box  # a line of text, not a column of 10 letters
        await phone.screenshot(path=str(folder / "console-phone-item.png"), full_page=True)
    await store.close()
