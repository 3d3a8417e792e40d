"""Schedules on real databases, with the store's fixed clock: each tick's partition is
created once by tickers racing, the catch-up policies after downtime, --no-overlap,
pause, resume and delete, a daylight-saving change, and bad input refused with nothing
written."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import datetime

import pytest

from processor import AsyncClient, NewItem
from processor.client.schedules import new_schedule
from watcher.config import DEFAULT_MAX_ITEM_BYTES
from watcher.errors import InvalidInputError, ScheduleExistsError, ScheduleNotFoundError
from watcher.schedule_ticker import Ticker
from watcher.schedules.records import NewSchedule
from watcher.store import Store
from watcher.store.db.clock import FixedClock
from watcher.store.schedules import TickOutcome

T0 = datetime(2030, 1, 1, 12, 0, 0)
ITEMS = [NewItem("a", b'{"n": 1}'), NewItem("b", b'{"n": 2}', gate=1)]


def schedule(name: str, *, cron: str | None = None, every: float | None = None,
             timezone: str | None = None, catch_up: str = "skip",
             no_overlap: bool = False) -> NewSchedule:
    return new_schedule(name, cron=cron, timezone=timezone, every=every, items=ITEMS,
                        reduce_gates=[1], on_item_failure="continue", priority=3, key=None,
                        catch_up=catch_up, no_overlap=no_overlap,
                        max_item_bytes=DEFAULT_MAX_ITEM_BYTES)


async def tick_ids(store: Store, name: str) -> list[str]:
    page = await store.partitions_page(prefix=f"{name}/", limit=10_000, with_counts=False)
    return sorted(info.id for info in page)


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(T0)


@pytest.fixture
def tickers(make_store: Callable[..., Store], clock: FixedClock) -> list[Ticker]:
    """Three processors' tickers on one database, each with its own store."""
    return [Ticker(make_store(clock=clock), f"p{n}") for n in range(3)]


async def race(tickers: list[Ticker]) -> Counter[TickOutcome]:
    total: Counter[TickOutcome] = Counter()
    for outcome in await asyncio.gather(*(ticker.run_once() for ticker in tickers)):
        total.update(outcome)
    return total


async def test_racing_tickers_create_each_tick_once(tickers, clock) -> None:
    store = tickers[0].store
    await store.schedule_add(schedule("race", every=1))
    assert await race(tickers) == Counter()  # nothing due yet
    for _ in range(5):
        clock.advance(1)
        outcomes = await race(tickers)
        assert outcomes[TickOutcome.CREATED] == 1, outcomes
    assert await tick_ids(store, "race") == [f"race/2030-01-01T12:00:0{s}Z" for s in range(1, 6)]
    info = await store.partition_get("race/2030-01-01T12:00:03Z")
    assert info is not None
    assert info.counts == {"available": 2}
    assert info.gate == 0 and info.priority == 3 and info.reduce_gates == (1,)
    assert info.on_item_failure == "continue"
    shown = await store.schedule_get("race")
    assert shown is not None
    assert shown.last_tick == datetime(2030, 1, 1, 12, 0, 5)
    assert shown.last_partition == "race/2030-01-01T12:00:05Z"
    assert shown.next_at == datetime(2030, 1, 1, 12, 0, 6)


async def test_racing_tickers_catch_up_every_missed_tick_once(tickers, clock) -> None:
    store = tickers[0].store
    await store.schedule_add(schedule("burst", every=1, catch_up="all"))
    clock.advance(30)
    outcomes = await race(tickers)
    assert outcomes[TickOutcome.CREATED] == 30
    assert len(await tick_ids(store, "burst")) == 30
    assert await race(tickers) == Counter()


async def test_catch_up_policies_after_downtime(tickers, clock) -> None:
    store = tickers[0].store
    for policy in ("skip", "all", "none"):
        await store.schedule_add(schedule(f"hourly-{policy}", cron="0 * * * *",
                                          catch_up=policy))
    clock.advance(5.5 * 3600)  # every processor down until 17:30
    await race(tickers)
    assert await tick_ids(store, "hourly-skip") == ["hourly-skip/2030-01-01T17:00:00Z"]
    assert await tick_ids(store, "hourly-all") == [
        f"hourly-all/2030-01-01T{hour}:00:00Z" for hour in range(13, 18)]
    assert await tick_ids(store, "hourly-none") == []
    assert (await store.schedule_get("hourly-none")).last_tick == datetime(2030, 1, 1, 17)
    clock.advance(1800 + 5)  # 18:00:05: on time for every policy
    await race(tickers)
    for policy in ("skip", "all", "none"):
        assert f"hourly-{policy}/2030-01-01T18:00:00Z" in await tick_ids(store,
                                                                         f"hourly-{policy}")
    assert len(await tick_ids(store, "hourly-all")) == 6


async def test_no_overlap_skips_ticks_while_the_last_partition_is_open(tickers, clock) -> None:
    store = tickers[0].store
    await store.schedule_add(schedule("single", every=1, no_overlap=True))
    clock.advance(1)
    assert (await race(tickers))[TickOutcome.CREATED] == 1
    clock.advance(1)
    assert (await race(tickers))[TickOutcome.OVERLAP] == 1
    assert await tick_ids(store, "single") == ["single/2030-01-01T12:00:01Z"]
    await store.partition_cancel("single/2030-01-01T12:00:01Z")
    clock.advance(1)
    assert (await race(tickers))[TickOutcome.CREATED] == 1
    assert await tick_ids(store, "single") == ["single/2030-01-01T12:00:01Z",
                                               "single/2030-01-01T12:00:03Z"]


async def test_a_tick_whose_partition_exists_creates_nothing(tickers, clock) -> None:
    store = tickers[0].store
    await store.schedule_add(schedule("taken", every=1))
    await store.partition_create("taken/2030-01-01T12:00:01Z", [NewItem("mine", b"1")])
    clock.advance(1)
    assert (await race(tickers))[TickOutcome.EXISTED] == 1
    items = await store.items_list("taken/2030-01-01T12:00:01Z")
    assert [item.id for item in items] == ["mine"]


async def test_pause_resume_and_delete(tickers, clock) -> None:
    store = tickers[0].store
    await store.schedule_add(schedule("p", every=1))
    assert await store.schedule_pause("p", True) is True
    assert await store.schedule_pause("p", True) is False
    clock.advance(5)
    assert await race(tickers) == Counter()
    assert await store.schedule_pause("p", False) is True
    assert await race(tickers) == Counter()  # the pause's ticks are not caught up
    clock.advance(1)
    assert (await race(tickers))[TickOutcome.CREATED] == 1
    assert await tick_ids(store, "p") == ["p/2030-01-01T12:00:06Z"]
    await store.schedule_delete("p")
    clock.advance(5)
    assert await race(tickers) == Counter()
    assert await tick_ids(store, "p") == ["p/2030-01-01T12:00:06Z"]  # its partitions stay
    with pytest.raises(ScheduleNotFoundError):
        await store.schedule_delete("p")


async def test_daylight_saving_change_in_berlin(tickers, clock) -> None:
    # Fall back on 2026-10-25: 02:30 local happens twice; the job runs at the first.
    clock.set(datetime(2026, 10, 24, 12))
    store = tickers[0].store
    await store.schedule_add(schedule("berlin", cron="30 2 * * *", timezone="Europe/Berlin",
                                      catch_up="all"))
    clock.set(datetime(2026, 10, 27))
    await race(tickers)
    assert await tick_ids(store, "berlin") == ["berlin/2026-10-25T00:30:00Z",
                                               "berlin/2026-10-26T01:30:00Z"]


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"name": "x", "cron": "0 25 * * *"}, "not a cron expression"),
    ({"name": "x", "cron": "0 3 * * *", "timezone": "Europe/Nowhere"}, "unknown time zone"),
    ({"name": "x", "every": 0.5}, "from 1 s"),
    ({"name": "a/b", "every": 60}, "no '/'"),
    ({"name": " x", "every": 60}, "letters, digits"),
    ({"name": "x", "every": 60, "catch_up": "some"}, "skip, all, none"),
    ({"name": "x", "every": 60, "priority": 11}, "priority"),
    ({"name": "x", "every": 60, "items": [NewItem("a", b"1"), NewItem("a", b"2")]}, "a"),
])
async def test_bad_input_is_refused_and_nothing_written(client, kwargs, says) -> None:
    kwargs = dict(kwargs)
    name = kwargs.pop("name")
    with pytest.raises(InvalidInputError, match=says) as raised:
        await client.add_schedule(name, **kwargs)
    assert "\n" not in str(raised.value)
    assert await client.schedules() == []


async def test_a_duplicate_name_is_refused_and_the_first_kept(client) -> None:
    first = await client.add_schedule("dup", every=60, items=ITEMS)
    with pytest.raises(ScheduleExistsError, match="already exists"):
        await client.add_schedule("dup", cron="0 3 * * *")
    assert await client.schedules() == [first]
    assert await client.schedule_items("dup") == [NewItem("a", b'{"n": 1}', 0), ITEMS[1]]
