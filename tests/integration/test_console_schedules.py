"""The console's Schedules page on every database: each schedule with its timing, policy,
next and last ticks and a link to its last partition; an empty page says
how to add one."""

from __future__ import annotations

from datetime import datetime

import httpx

from processor import AsyncClient, NewItem
from processor.client.schedules import new_schedule
from processor.console.app import create_app
from processor.console.server import settings_for
from watcher.config import DEFAULT_MAX_ITEM_BYTES
from watcher.schedule_ticker import Ticker
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
