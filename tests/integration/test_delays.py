"""Delays on real databases: an item's not_before, a partition's start_at and a handler's
snooze are never early by the database clock, a snooze uses up no attempt, and bad
delays are refused with nothing written."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from processor import AsyncClient, NewItem
from tests.support.engine import running, wait_until
from watcher import Result, Watcher, WatcherConfig, WorkItem
from watcher.errors import InvalidInputError, PartitionNotFoundError
from watcher.store import Store

FAST = {"poll_interval": 0.05, "lease_duration": 3.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2}
# Long enough that the undelayed item is called before it even on a busy machine (CI saw
# MariaDB take 1.54 s from the create to the first call).
HOLD = timedelta(seconds=4)


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


async def db_now(client: AsyncClient) -> datetime:
    """The database clock, aware (the tables store naive UTC)."""
    return (await client.now()).replace(tzinfo=UTC)


class Recorder:
    """A processor that notes the database time of each call, and answers ``answers``
    in turn (the last one for every later call)."""

    def __init__(self, client: AsyncClient, *answers: Result) -> None:
        self.client = client
        self.answers = answers or (Result(done=True),)
        self.calls: dict[str, list[tuple[datetime, int]]] = {}

    async def __call__(self, item: WorkItem) -> Result:
        seen = self.calls.setdefault(item.id, [])
        seen.append((await db_now(self.client), item.attempt))
        return self.answers[min(len(seen), len(self.answers)) - 1]


async def test_an_item_waits_for_its_not_before_and_the_others_do_not(
        client: AsyncClient, store: Store) -> None:
    recorder = Recorder(client)
    # The processor runs before the partition is written, so that its start (slow on a
    # busy machine) is not counted in the delay: the undelayed item's call must come
    # within a poll or so, well before the other's not_before.
    async with running(Watcher(store, recorder, WatcherConfig(**FAST))):
        not_before = await db_now(client) + HOLD
        await client.create_partition("p", [NewItem("now", b"{}"),
                                            NewItem("later", b"{}", not_before=not_before)])
        await wait_until(lambda: recorder.calls.get("now"), message="the undelayed item's call")
        await wait_until(lambda: recorder.calls.get("later"), timeout=15,
                         message="the delayed item's call")
        info = await client.wait("p", timeout=15)
    assert info.status == "complete"
    [(now_called_at, _)] = recorder.calls["now"]
    assert now_called_at < not_before  # the undelayed item did not wait for the other
    [(called_at, _)] = recorder.calls["later"]
    assert called_at >= not_before
    # An idle processor wakes for it (about a poll, plus a loaded machine's scheduling):
    # sooner than a lease duration, which is when a processor that waited for its next
    # lease cycle would call it.
    assert called_at - not_before < timedelta(seconds=FAST["lease_duration"])


async def test_a_scheduled_partition_is_not_leased_before_its_start(
        client: AsyncClient, store: Store) -> None:
    start_at = await db_now(client) + HOLD
    await client.create_partition("scheduled", [NewItem("a", b"{}")], start_at=start_at)
    await client.create_partition("plain", [NewItem("b", b"{}")])
    free = {row.id for row in await store.leases_read_free(10)}
    assert free == {"plain"}
    recorder = Recorder(client)
    async with running(Watcher(store, recorder, WatcherConfig(**FAST))):
        info = await client.wait("scheduled", timeout=15)
    assert info.status == "complete"
    [(called_at, _)] = recorder.calls["a"]
    assert called_at >= start_at


async def test_a_snooze_calls_again_later_at_the_same_gate_with_no_attempt_used(
        client: AsyncClient, store: Store) -> None:
    await client.create_partition("p", [NewItem("poll", b'{"n": 0}')])
    recorder = Recorder(client, Result(snooze=0.6, data=b'{"n": 1}'),
                        Result(snooze=0.6, data=b'{"n": 2}'), Result(done=True))
    async with running(Watcher(store, recorder, WatcherConfig(**FAST))):
        info = await client.wait("p", timeout=15)
    assert info.status == "complete"
    calls = recorder.calls["poll"]
    assert len(calls) == 3
    assert [attempt for _, attempt in calls] == [1, 1, 1]
    for (before, _), (after, _) in itertools.pairwise(calls):
        assert after - before >= timedelta(seconds=0.6)
    [item] = await client.items("p")
    assert item.data == b'{"n": 2}' and item.attempts == 0 and item.last_error is None


@pytest.mark.parametrize(("answer", "words"), [
    (Result(snooze=10 * 24 * 3600.0), "longer than"),
    (Result(snooze=-1.0), "above 0"),
    (Result(snooze=5.0, done=True), "cannot come with"),
])
async def test_a_bad_snooze_fails_the_item_and_says_why(
        client: AsyncClient, store: Store, answer: Result, words: str) -> None:
    await client.create_partition("p", [NewItem("a", b"{}")])
    recorder = Recorder(client, answer)
    async with running(Watcher(store, recorder, WatcherConfig(**FAST))):
        info = await client.wait("p", timeout=15)
    assert info.status == "failed"
    [item] = await client.items("p")
    assert item.status == "failed" and words in (item.last_error or "")
    assert len(recorder.calls["a"]) == 1  # not retried: another call answers the same


@pytest.mark.parametrize("when", [
    datetime(2030, 1, 1, 12, 0),  # naive: local time or UTC?
    datetime.now(UTC) + timedelta(days=400),
    "2030-01-01T12:00:00Z",
])
async def test_a_bad_not_before_or_start_at_is_refused_and_nothing_is_written(
        client: AsyncClient, when: object) -> None:
    with pytest.raises(InvalidInputError, match="not_before"):
        await client.create_partition("p", [NewItem("a", b"{}", not_before=when)])  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="start_at"):
        await client.create_partition("q", [NewItem("a", b"{}")], start_at=when)  # type: ignore[arg-type]
    for partition_id in ("p", "q"):
        with pytest.raises(PartitionNotFoundError):
            await client.partition(partition_id)


async def test_a_not_before_in_any_zone_or_the_past_is_kept_as_that_instant(
        client: AsyncClient, store: Store) -> None:
    now = await db_now(client)
    paris = now.astimezone(__import__("zoneinfo").ZoneInfo("Europe/Paris")) + HOLD
    await client.create_partition("p", [NewItem("zoned", b"{}", not_before=paris),
                                        NewItem("past", b"{}",
                                                not_before=now - timedelta(days=3))])
    ready = {item.id for item in await store.items_ready("p", 0, 10)}
    assert ready == {"past"}
    [zoned] = [item for item in await client.items("p") if item.id == "zoned"]
    assert zoned.retry_at is not None
    assert abs(zoned.retry_at.replace(tzinfo=UTC) - (now + HOLD)) < timedelta(milliseconds=1)
