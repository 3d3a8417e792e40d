"""The pure parts of operating statefeed: durations, statuses, pages and cursors, what the
CLI shows, the backlog gauges' schedule, and the lease keeper dropping what a client
stopped. The SQL side is tested in tests/conformance/test_operations.py."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime

import pytest
from prometheus_client.parser import text_string_to_metric_families

from processor.observe.metrics import BacklogGauges, PrometheusHooks
from processor.views import error_cell, item_row, purge_text
from tests.support.engine import wait_until
from tests.support.fake_store import FakeStore
from watcher.config import WatcherConfig
from watcher.errors import ConfigError, InvalidInputError
from watcher.hooks import CountingHooks
from watcher.leasing.keeper import LeaseKeeper
from watcher.leasing.lease import Lease
from watcher.records import ItemInfo, LeaseRenewal, Page, PartitionInfo
from watcher.reports import Backlog, PurgeReport
from watcher.retention import RetentionConfig, check_statuses
from watcher.rules.durations import format_duration, parse_duration
from watcher.store.codecs import decode_partition_cursor, encode_partition_cursor


@pytest.mark.parametrize(("text", "seconds"), [
    ("7d", 604800.0), ("12h", 43200.0), ("30m", 1800.0), ("90s", 90.0), ("90", 90.0),
    ("1.5h", 5400.0), (" 2D ", 172800.0), (".5s", 0.5),
])
def test_durations_parse(text: str, seconds: float) -> None:
    assert parse_duration("--older-than", text) == seconds


@pytest.mark.parametrize("text", ["", "7x", "d", "-1d", "0", "0s", "7 days", "1e3", "1h30m",
                                  "nan", "inf"])
def test_bad_durations_are_one_clear_error(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_duration("--older-than", text)
    message = str(caught.value)
    assert message.startswith("--older-than must be a duration greater than 0 such as 7d")
    assert repr(text) in message and "\n" not in message


@pytest.mark.parametrize(("seconds", "text"), [
    (604800, "7d"), (3600, "1h"), (5400, "90m"), (90, "90s"), (2.5, "2.5s"), (0.25, "0.25s")])
def test_durations_format(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_statuses_a_purge_may_remove() -> None:
    assert check_statuses("--status", "complete, cancelled") == ("complete", "cancelled")
    assert check_statuses("--status", ["failed", "failed"]) == ("failed",)
    with pytest.raises(ConfigError, match=r"only finished statuses .* got 'available'"):
        check_statuses("--status", "complete,available")
    with pytest.raises(ConfigError, match="at least one"):
        check_statuses("--status", " , ")
    with pytest.raises(ConfigError, match="retention must be"):
        RetentionConfig(older_than=0)
    with pytest.raises(ConfigError, match="purge batch"):
        RetentionConfig(older_than=60, batch=0)
    assert RetentionConfig(older_than=60, statuses=("failed",)).statuses == ("failed",)
    with pytest.raises(ConfigError, match="--retention-items"):
        RetentionConfig(older_than=None)
    with pytest.raises(ConfigError, match="item retention"):
        RetentionConfig(older_than=None, items_older_than=0)
    assert RetentionConfig(older_than=None, items_older_than=60).items_older_than == 60


def test_a_page_is_the_list_it_holds() -> None:
    page = Page([1, 2], next_cursor="2")
    assert page == [1, 2] and len(page) == 2 and page[1] == 2 and page.next_cursor == "2"
    (first, second) = page
    assert (first, second) == (1, 2)
    assert Page() == [] and Page().next_cursor is None
    assert repr(page) == "Page([1, 2], next_cursor='2')"


def test_partition_cursors_round_trip_and_refuse_garbage() -> None:
    created = datetime(2030, 5, 6, 7, 8, 9, 123456)
    info = PartitionInfo(id="opening|42 é", status="complete", gate=0, owner="",
                         until=created, version=1, created_at=created)
    cursor = encode_partition_cursor(info)
    assert cursor.isascii() and "=" not in cursor
    assert decode_partition_cursor(cursor) == (created, "opening|42 é")
    for garbage in ["", "!!!", "bm9wZQ", "WzEsMl0"]:  # not base64 / "nope" / [1,2]
        with pytest.raises(InvalidInputError, match="not a cursor"):
            decode_partition_cursor(garbage)


def test_what_the_cli_shows_of_an_item() -> None:
    assert error_cell(None) == "-"
    assert error_cell("boom\nat line 2") == "boom ..."
    assert error_cell("x" * 300).endswith("...") and len(error_cell("x" * 300)) == 103
    item = ItemInfo("p", "i1", "failed", 2, b"secret data", 3, "boom", 7,
                    retry_at=datetime(2030, 1, 1), parent="folder")
    assert item_row(item) == {"id": "i1", "status": "failed", "gate": 2, "attempts": 3,
                              "last_error": "boom", "version": 7,
                              "retry_at": "2030-01-01T00:00:00", "parent": "folder",
                              "deadline": None}
    report = PurgeReport(partitions=3, items=120)
    assert purge_text(report, older_than=604800, statuses=("complete", "cancelled"),
                      dry_run=True) == ("would delete 3 partition(s) (complete, cancelled, last "
                                        "updated more than 7d ago) and 120 item(s)")
    assert purge_text(report, older_than=90, statuses=("failed",), dry_run=False).startswith(
        "deleted 3 partition(s) (failed, last updated more than 90s ago)")


async def test_backlog_gauges_read_once_then_only_after_a_scrape(caplog) -> None:
    hooks = PrometheusHooks()
    reads: list[int] = []
    failing = False

    async def read() -> Backlog:
        if failing:
            from sqlalchemy.exc import OperationalError
            raise OperationalError("SELECT", {}, Exception("down"))
        reads.append(1)
        return Backlog({"available": 2, "complete": 5}, items_waiting=40 + len(reads))

    gauges = BacklogGauges(hooks, read, interval=0.02)
    task = asyncio.create_task(gauges.run())
    await asyncio.sleep(0.15)
    assert len(reads) == 1, "read at start, then not again while nobody scrapes"
    text = hooks.render().decode()
    assert 'statefeed_partitions{status="complete"} 5.0' in text
    assert "statefeed_items_waiting 41.0" in text
    for _ in range(50):  # a scrape leads to one more read within an interval
        await asyncio.sleep(0.01)
        if len(reads) == 2:
            break
    assert len(reads) == 2
    assert "statefeed_items_waiting 42.0" in hooks.render().decode()
    began, before = time.monotonic(), len(reads)
    for _ in range(20):  # scraped as often as you like: at most one read per interval
        hooks.render()
        await asyncio.sleep(0.002)
    intervals = (time.monotonic() - began) / gauges.interval
    assert len(reads) - before <= intervals + 1
    failing = True
    with caplog.at_level(logging.WARNING):
        hooks.render()
        await asyncio.sleep(0.1)
        hooks.render()
        await asyncio.sleep(0.1)
    assert "statefeed_items_waiting" in hooks.render().decode(), "last values kept"
    assert len([r for r in caplog.records if "backlog_read_failed" in r.message]) == 1
    gauges.stop()
    await asyncio.wait_for(task, 1)


async def test_backlog_gauges_appear_only_after_a_read_succeeds() -> None:
    """No false zeros: while the database does not answer, the backlog gauges are absent
    from the scrape (not 0); the first read that succeeds makes them appear."""
    from sqlalchemy.exc import OperationalError

    hooks = PrometheusHooks()
    answers = False

    async def read() -> Backlog:
        if not answers:
            raise OperationalError("SELECT", {}, Exception("down"))
        return Backlog({"available": 1}, items_waiting=3, oldest_waiting=9.0)

    gauges = BacklogGauges(hooks, read, interval=0.02)
    task = asyncio.create_task(gauges.run())
    try:
        assert not await gauges.run_once()
        names = {family.name for family in text_string_to_metric_families(
            hooks.render().decode())}
        assert not names & {"statefeed_items_waiting", "statefeed_partitions",
                            "statefeed_oldest_waiting_item_seconds"}, names
        answers = True

        def scraped() -> str | None:  # each scrape asks for a read within the interval
            text = hooks.render().decode()
            return text if "statefeed_items_waiting 3.0" in text else None

        text = await wait_until(scraped, timeout=5, message="the first successful read")
        assert "statefeed_oldest_waiting_item_seconds 9.0" in text
        assert 'statefeed_partitions{status="available"} 1.0' in text
    finally:
        gauges.stop()
        await asyncio.wait_for(task, 1)


async def test_the_keeper_drops_what_a_client_stopped() -> None:
    store = FakeStore(stopped=["cancelled", "not-mine"])
    hooks = CountingHooks()
    keeper = LeaseKeeper(store, WatcherConfig(owner_id="me", lease_duration=9.0,
                                              poll_interval=0.5), hooks)
    cancelled, running = Lease("cancelled", 3, 0), Lease("running", 2, 0)
    keeper.leases = {"cancelled": cancelled, "running": running}
    assert await keeper.drop_stopped() == ["cancelled"]
    assert store.asked.stopped == [("me", 9.0)]
    assert cancelled.lost and cancelled.wake.is_set(), "its supervisor stops"
    assert set(keeper.leases) == {"running"} and not running.lost
    assert hooks.counts["lease_released"] == 1 and hooks.counts["lease_lost"] == 0
    assert await keeper.drop_stopped() == [], "dropped once"


async def test_a_renewal_that_finds_a_cancel_stops_the_lease_not_loses_it() -> None:
    store = FakeStore(renewal=LeaseRenewal({"kept": (2, None)},
                                           stopped=frozenset({"cancelled"})))
    hooks = CountingHooks()
    keeper = LeaseKeeper(store, WatcherConfig(owner_id="me", lease_duration=9.0,
                                              poll_interval=0.5), hooks)
    kept, cancelled = Lease("kept", 1, 0), Lease("cancelled", 1, 0)
    keeper.leases = {"kept": kept, "cancelled": cancelled}
    assert await keeper.renew() == (1, [])
    assert cancelled.lost and set(keeper.leases) == {"kept"}
    assert hooks.counts["lease_released"] == 1 and hooks.counts["lease_lost"] == 0



async def test_a_scrape_after_a_quiet_spell_reads_the_backlog_first() -> None:
    """Nobody scraped for longer than the interval: the next scrape of ``/metrics``
    reads the backlog before it answers, instead of showing the values of before."""
    import httpx

    from processor.health import HealthApp

    hooks = PrometheusHooks()
    reads: list[int] = []

    async def read() -> Backlog:
        reads.append(1)
        return Backlog({"available": 1}, items_waiting=100 * len(reads))

    gauges = BacklogGauges(hooks, read, interval=0.05)
    assert await gauges.run_once()
    app = HealthApp(checks={}, metrics=hooks.render, before_metrics=gauges.fresh)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://health") as client:
        await wait_until(lambda: time.monotonic() - gauges.refreshed_at > gauges.interval,
                         message="a quiet spell longer than the interval")
        first = (await client.get("/metrics")).text
        assert "statefeed_items_waiting 200.0" in first, "the stale value was answered"
        again = (await client.get("/metrics")).text
    assert "statefeed_items_waiting 200.0" in again
    assert len(reads) == 2, "a scrape within the interval reads nothing more"


def test_a_changed_partition_says_what_was_expected_only_when_something_was() -> None:
    from watcher.errors import PartitionChangedError

    named = str(PartitionChangedError("p", 17, 19))
    assert "at version 19, not 17 as expected" in named
    # A verb that named no version (pipelines move without --expect-version) lost a race
    # between its read and its write: the message must not claim it expected one.
    raced = str(PartitionChangedError("p", None, 19))
    assert "expected" not in raced and "nothing was written" in raced
    assert "version 19" in raced and "repeat" in raced


def test_a_move_that_loses_the_race_blames_no_expected_version() -> None:
    import inspect

    from watcher.store.operator import pipelines

    source = inspect.getsource(pipelines.PipelinesStore.partition_move_version)
    write = source[source.index("rowcount != 1"):]
    assert "PartitionChangedError(partition_id, None," in write.splitlines()[1]
