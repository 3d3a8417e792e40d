"""Fleet-wide rate limits and Retry-After holds on real databases: several processors
together keep to a handler's rate and to a key's; a handler's 429 with Retry-After holds
every processor's calls until then, and the item that met it loses no attempt."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from processor import AsyncClient, NewItem
from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from tests.support.engine import running, wait_until
from tests.support.servers import read_body, send_json, serve_app
from watcher import Result, ThrottledError, Watcher, WatcherConfig, WorkItem
from watcher.errors import InvalidInputError
from watcher.models import FlowScope
from watcher.rules.buckets import BURST_SECONDS, TOKEN_LIFETIME
from watcher.store import Store

FAST = {"poll_interval": 0.05, "lease_duration": 1.5, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2}
# How far a call's noted start may trail the token it took, on a machine whose cores are
# busy with other work (the process is not scheduled for a while between the two): 0.3 s
# was seen with five other test runs on two cores; three times that.
STAMP_JITTER = 1.0


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


class Stamps:
    """A processor that notes when each call starts (monotonic) and completes the item."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.by_partition: dict[str, list[float]] = {}

    async def __call__(self, item: WorkItem) -> Result:
        now = time.monotonic()
        self.starts.append(now)
        self.by_partition.setdefault(item.partition_id, []).append(now)
        return Result(done=True)


def steady_rate(starts: list[float], skip: float = 0.5) -> float:
    """Calls per second after the first ``skip`` seconds (the burst and the start)."""
    first = min(starts) + skip
    later = sorted(start for start in starts if start >= first)
    return (len(later) - 1) / (later[-1] - later[0])


def over_the_bucket(starts: list[float], rate: float, sharers: int = 1) -> str | None:
    """The first window of calls more than a bucket of ``rate`` lets through, or
    ``None``. A bucket gives at most a burst (:data:`BURST_SECONDS` of its rate) and
    then its rate, in any window; a call may use a token claimed up to
    :data:`TOKEN_LIFETIME` before it. A processor whose event loop stalled (a busy
    machine) comes back to a full burst, so the calls of a window of a few seconds
    may run over the rate by that burst, and no more.

    The times are the calls' starts in the processors, each a moment after its call
    took its token, so the scheduling between the two is slack the count allows: a
    call each of the ``sharers`` processors may hold, and the tokens of the bucket's
    rate over :data:`STAMP_JITTER` (the calls of a window took their tokens up to that
    much before it; a stalled loop bunches them). A bucket ignored (each processor at
    the rate, or no bound) still runs over this by a multiple over a few seconds."""
    burst = max(1.0, rate * BURST_SECONDS) + sharers + rate * STAMP_JITTER
    ordered = sorted(starts)
    for first in range(len(ordered)):
        for last in range(first, len(ordered)):
            calls = last - first + 1
            allowed = burst + rate * (ordered[last] - ordered[first] + TOKEN_LIFETIME)
            if calls > allowed:
                return (f"{calls} calls in {ordered[last] - ordered[first]:.3f} s "
                        f"(from call {first}); a bucket of {rate}/s allows {allowed:.1f}")
    return None


async def test_a_handler_rate_holds_across_three_processors(
        client: AsyncClient, make_store: Callable[..., Store]) -> None:
    for n in range(6):
        await client.create_partition(f"p{n}", [NewItem(f"i{m}", b"{}") for m in range(60)])
    stamps = Stamps()
    watchers = [Watcher(make_store(), stamps,
                        WatcherConfig(**FAST, owner_id=f"w{n}", rate_limit=40.0))
                for n in range(3)]
    async with running(*watchers):
        await wait_until(lambda: len(stamps.starts) >= 150, timeout=30,
                         message="150 rate-limited calls")
    rate = steady_rate(stamps.starts)
    print(f"steady rate of three processors under one 40/s limit: {rate:.1f}/s")
    # Not starved: a bucket that lets half its tokens go unused is a fault, not load (a
    # loaded machine measured 29-30/s; the rate itself is measured by the benchmark).
    assert 40 * 0.5 <= rate, rate
    # Exact, at every window: the steady rate alone ran over 44/s once on a loaded
    # machine, by the burst a stalled event loop came back to.
    problem = over_the_bucket(stamps.starts, 40.0, sharers=len(watchers))
    assert problem is None, f"{problem}; steady rate {rate:.1f}/s"


async def test_a_key_rate_limits_that_key_only(
        client: AsyncClient, store: Store) -> None:
    await client.create_partition("slow-1", [NewItem(f"i{m}", b"{}") for m in range(40)],
                                  key="slow")
    await client.create_partition("fast-1", [NewItem(f"i{m}", b"{}") for m in range(200)],
                                  key="fast")
    await client.set_key_rate("slow", 10.0)
    stamps = Stamps()
    async with running(Watcher(store, stamps, WatcherConfig(**FAST))):
        assert (await client.wait("fast-1", timeout=30)).status == "complete"
        assert (await client.wait("slow-1", timeout=30)).status == "complete"
    # The slow key keeps to its bucket at every window (a steady rate over the whole
    # run ran over by the burst a stalled loop came back to, on a loaded machine).
    problem = over_the_bucket(stamps.by_partition["slow-1"], 10.0)
    assert problem is None, problem
    # The fast key is not held to it: well over the slow key's rate.
    assert steady_rate(stamps.by_partition["fast-1"], skip=0.0) > 10 * 2


async def test_a_throttled_item_loses_no_attempt_and_holds_the_processor(
        client: AsyncClient, store: Store) -> None:
    await client.create_partition("p", [NewItem(f"i{m}", b"{}") for m in range(20)])
    starts: list[tuple[str, float, int]] = []

    async def once_throttled(item: WorkItem) -> Result:
        starts.append((item.id, time.monotonic(), item.attempt))
        if len(starts) == 1:
            raise ThrottledError("slow down", retry_after=1.0)
        return Result(done=True)

    config = WatcherConfig(**FAST, concurrency=1, max_retries=0)
    async with running(Watcher(store, once_throttled, config)):
        info = await client.wait("p", timeout=30)
    assert info.status == "complete"  # with no retries allowed, an attempt lost would fail it
    first_id, first_at, _ = starts[0]
    second_at = starts[1][1]
    assert second_at - first_at >= 0.9  # every call waited out the hold
    again = [attempt for item_id, _, attempt in starts[1:] if item_id == first_id]
    assert again == [1]


async def test_a_processor_started_during_a_hold_honours_it_from_its_first_call(
        client: AsyncClient, store: Store) -> None:
    # The hold another processor stored (its handler answered Retry-After: 6). This one
    # polls seldom, so only a read of the hold before its first call can keep that
    # call back.
    hold, read_late = 6.0, 1.5
    await store.flow_block(FlowScope.HANDLER, "h", hold)
    stored_at = time.monotonic()
    await client.create_partition("p", [NewItem(f"i{m}", b"{}") for m in range(3)])
    stamps = Stamps()
    config = WatcherConfig(**{**FAST, "poll_interval": 1.0, "lease_duration": 4.0},
                           handler_name="h", max_retries=0)
    async with running(Watcher(store, stamps, config)):
        assert (await client.wait("p", timeout=30)).status == "complete"
    early = [round(start - stored_at, 2) for start in stamps.starts
             if start < stored_at + hold - read_late]
    assert early == [], f"calls made {early} s into a {hold} s hold stored before the start"


class LoopTurns:
    """Counts turns of the event loop a poll long: a busy machine may stall the whole
    process, and a call sent before the stall then reaches the handler long after it
    was sent, so a wait meant as "a few polls" is counted in turns, not seconds."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.count = 0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.count += 1


def throttling_handler(seconds: int, first: int, turns: LoopTurns | None = None
                       ) -> tuple[Any, list[tuple[float, int]]]:
    """An HTTP handler that answers 429 with Retry-After to its first ``first`` calls,
    then completes every item; it notes when each call arrives (monotonic, and the loop
    turns counted by ``turns`` then)."""
    arrivals: list[tuple[float, int]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await read_body(receive)
        arrivals.append((time.monotonic(), 0 if turns is None else turns.count))
        if len(arrivals) <= first:
            await send_json(send, 429, {"error": {"message": "too many requests"}},
                            headers=[("retry-after", str(seconds))])
            return
        await send_json(send, 200, {"done": True})

    return app, arrivals


async def test_a_retry_after_holds_every_processors_calls_fleet_wide(
        client: AsyncClient, make_store: Callable[..., Store]) -> None:
    for n in range(4):
        await client.create_partition(f"p{n}", [NewItem(f"i{m}", b"{}") for m in range(30)])
    turns = LoopTurns(FAST["poll_interval"])
    counting = asyncio.create_task(turns.run())
    app, arrivals = throttling_handler(seconds=2, first=1, turns=turns)
    published: list[tuple[float, int]] = []  # when the hold was first seen stored

    async def watch_for_the_hold() -> None:
        await wait_until(lambda: client.flow_controls("handler"), timeout=30, interval=0.01,
                         message="the hold stored for the fleet")
        published.append((time.monotonic(), turns.count))

    async with serve_app(app) as url:
        watching = asyncio.create_task(watch_for_the_hold())
        processors = [HttpProcessor(HttpProcessorConfig(handler_url=url)) for _ in range(3)]
        watchers = [Watcher(make_store(), processor,
                            WatcherConfig(**FAST, owner_id=f"w{n}", handler_name=url,
                                          max_retries=0))
                    for n, processor in enumerate(processors)]
        try:
            async with running(*watchers):
                for n in range(4):
                    assert (await client.wait(f"p{n}", timeout=30)).status == "complete"
        finally:
            counting.cancel()
            watching.cancel()
            await asyncio.gather(*(processor.aclose() for processor in processors))
    throttled_at = arrivals[0][0]
    assert published, "the hold was never stored for the fleet to see"
    published_at, published_turn = published[0]
    # Calls already on the wire when the hold was stored may land just after it; once
    # the other processors have read it (a poll: a few turns of the loop, which a
    # stalled process takes longer than their seconds), nothing reaches the handler
    # until it ends. The hold is timed from its storing, not from the 429: on a busy
    # machine the store's write itself can take a second.
    slack, slack_turns = 4 * FAST["poll_interval"] + 0.2, 6
    during = [at for at, turn in arrivals[1:]
              if published_at + slack < at < throttled_at + 1.9
              and turn >= published_turn + slack_turns]
    assert during == []
    controls = await client.flow_controls("handler")
    assert [control.name for control in controls] == [url]


@pytest.mark.parametrize("rate", [0, -1.0, 20_000.0, float("nan"), "5"])
async def test_a_rate_out_of_range_is_refused(client: AsyncClient, rate: object) -> None:
    await client.create_partition("p", [NewItem("i", b"{}")], key="k")
    with pytest.raises(InvalidInputError, match="calls per second"):
        await client.set_key_rate("k", rate)  # type: ignore[arg-type]
    assert await client.flow_controls() == []


def test_a_processor_rate_out_of_range_is_a_config_error() -> None:
    from watcher.errors import ConfigError

    for rate in (0.0, 50_000.0):
        with pytest.raises(ConfigError, match="rate limit"):
            WatcherConfig(rate_limit=rate)
