"""A partition that an item failed says why, everywhere it is shown: its ``last_error``
names the item, the gate and the item's error (``status --json``, the API's reads,
the console's top card), the console marks its remaining items as not run, and a
retry clears the reason (and does not call it a reduce re-armed)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from processor import AsyncClient, NewItem
from processor.console.app import create_app, settings_for
from processor.views import partition_row
from tests.support.engine import running
from watcher import Result, Watcher, WatcherConfig, WorkItem
from watcher.dispatch.failures import ItemFailure, partition_error
from watcher.protocol import NonRetryableError
from watcher.store import Store
from watcher.store.db.urls import parse_database_url

FAST = {"poll_interval": 0.05, "lease_duration": 3.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2}
ORIGIN = "http://127.0.0.1:8090"


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


def test_the_reason_names_the_item_the_gate_the_error_and_what_follows() -> None:
    one = partition_error(2, 1, ItemFailure("scan-7", 3, "HTTP 500:\nboom"))
    assert one == ("item 'scan-7' failed at gate 2 after 3 attempts: HTTP 500: boom; "
                   "the partition failed and runs nothing more until a retry")
    many = partition_error(0, 3, ItemFailure("a", 1, "bad"))
    assert "item 'a' failed at gate 0 after 1 attempt (and 2 more failed items): bad" in many
    assert partition_error(1, 2, None).startswith("2 items failed at gate 1; ")


async def test_a_failed_partition_stores_and_shows_why(client: AsyncClient, store: Store,
                                                       db_url: str, table_prefix: str) -> None:
    async def process(item: WorkItem) -> Result:
        if item.id == "bad" and item.gate == 1:
            raise NonRetryableError("unreadable <scan>")
        return Result(gate=1) if item.gate == 0 else Result(done=True)

    await client.create_partition("p", [NewItem("ok", b""), NewItem("bad", b"")])
    await client.add_items("p", [NewItem("later", b"", gate=3)])
    async with running(Watcher(store, process, WatcherConfig(owner_id="w", **FAST))):
        info = await client.wait("p", timeout=20)
    assert info.status == "failed"
    assert info.last_error is not None
    assert info.last_error.startswith("item 'bad' failed at gate 1 after 1 attempt: ")
    assert "unreadable <scan>" in info.last_error and "until a retry" in info.last_error
    assert partition_row(info)["last_error"] == info.last_error

    url = parse_database_url(db_url)
    async with AsyncClient(url, table_prefix) as console_client:
        app = create_app(settings_for(url, table_prefix, host="127.0.0.1", port=8090,
                                      token=None, read_only=True), console_client)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url=ORIGIN) as web:
            page = (await web.get("/partition", params={"id": "p"})).text
    summary = page[page.index('aria-label="summary"'):page.index('id="gates-title"')]
    assert "Failed: nothing more runs until a retry (1 item(s) not run)" in summary
    assert "item &#39;bad&#39; failed at gate 1" in summary and "&lt;scan&gt;" in summary
    assert "not run: partition failed" in page

    report = await client.retry_failed("p")
    assert report.items_reset == 1 and not report.reduce_rearmed
    assert (await client.partition("p")).last_error is None
