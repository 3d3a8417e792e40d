"""The live feed (``GET /v1/partitions/{id}/events``) on a real uvicorn server, on every
database, following partitions a real watcher runs through a real HTTP handler: gate
moves and the end in order, an exact resume with ``Last-Event-ID``, one shared poller
for a hundred clients with bounded memory while they are slow, and the API's token
rules."""

from __future__ import annotations

import asyncio
import contextlib
import tracemalloc
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx

from processor import AsyncClient, NewItem
from processor.feed.events import EventId, Received, parse_stream
from processor.feed.hub import FeedHub, FeedSettings
from tests.support.engine import count_calls, wait_until
from tests.support.feed import LAST_GATE, system

TOKEN = "a-token-of-32-characters-at-least"
FAST = FeedSettings(poll_interval=0.05, heartbeat=0.3, linger=30.0)


class Follower:
    """One SSE connection, read event by event."""

    def __init__(self, http: httpx.AsyncClient, partition: str, **headers: str) -> None:
        self.http, self.partition, self.headers = http, partition, headers
        self.received: list[Received] = []
        self._stack = contextlib.AsyncExitStack()
        self.response: httpx.Response | None = None
        self._events: Any = None

    async def __aenter__(self) -> Follower:
        self.response = await self._stack.enter_async_context(self.http.stream(
            "GET", f"v1/partitions/{self.partition}/events", params={"interval": "100"},
            headers=self.headers))
        self._events = self._iterate()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def _iterate(self) -> AsyncIterator[Received]:
        assert self.response is not None
        buffered: list[str] = []
        async for line in self.response.aiter_lines():
            if line.startswith(":"):
                yield Received("comment", None, line)
                continue
            buffered.append(line)
            if line == "":
                for event in parse_stream(buffered):
                    yield event
                buffered.clear()

    async def next(self, *kinds: str, timeout: float = 20) -> Received:  # noqa: ASYNC109
        """The next event of one of ``kinds`` (others are kept in ``received`` too)."""
        async with asyncio.timeout(timeout):
            async for event in self._events:
                self.received.append(event)
                if event.kind in kinds:
                    return event
        raise AssertionError(f"the stream ended before a {kinds} event: {self.received}")

    async def rest(self, timeout: float = 20) -> list[Received]:  # noqa: ASYNC109
        """Every event until the stream closes."""
        async with asyncio.timeout(timeout):
            async for event in self._events:
                self.received.append(event)
        return self.received

    def moves(self) -> list[tuple[int, int]]:
        return [(event.json()["from"], event.json()["to"]) for event in self.received
                if event.kind == "gate"]


def http_client(url: str, **headers: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=30, headers=headers)


async def test_the_feed_delivers_gate_moves_and_the_end_in_order(db_url, table_prefix) -> None:
    hub = FeedHub(FAST)
    async with system(db_url, table_prefix, hub) as (url, handler, client), \
            http_client(url) as http:
        await client.create_partition("job", [NewItem(f"i{n}", b"{}") for n in range(5)],
                                      reduce_gates=())
        async with Follower(http, "job") as feed:
            assert feed.response is not None and feed.response.status_code == 200
            assert feed.response.headers["content-type"].startswith("text/event-stream")
            state = (await feed.next("state")).json()
            assert (state["status"], state["gate"], state["counts"]) == (
                "available", 0, {"available": 5})
            for gate in range(LAST_GATE):
                handler.open(gate)
                move = (await feed.next("gate")).json()
                assert (move["from"], move["to"], move["gap"]) == (gate, gate + 1, False)
            handler.open(LAST_GATE)
            events = await feed.rest()
        kinds = [event.kind for event in events]
        assert kinds[0] == "state" and kinds[-1] == "end" and kinds.count("end") == 1
        assert feed.moves() == [(0, 1), (1, 2)]
        counts = [event.json() for event in events if event.kind == "counts"]
        assert counts and all(sum(seen["counts"].values()) == 5 for seen in counts)
        assert any(row["gate"] > 0 for seen in counts for row in seen["gates"]), \
            "the counts follow the items from gate to gate"
        end = events[-1].json()
        assert (end["status"], end["counts"]) == ("complete", {"complete": 5})
        ids = [EventId.parse(event.id) for event in events if event.id]
        assert ids == sorted(ids, key=lambda one: one.version), "ids never go back"
        assert ids[-1].ended
        # A heartbeat was never needed to end it, but a quiet stream gets them: a new
        # follower of the finished partition gets its state and end at once.
        async with Follower(http, "job") as after:
            assert [event.kind for event in await after.rest()] == ["state", "end"]


async def test_a_failed_partition_ends_with_its_status_and_a_result_is_sent(
        db_url, table_prefix) -> None:
    hub = FeedHub(FAST)
    async with system(db_url, table_prefix, hub) as (url, handler, client), \
            http_client(url) as http:
        await client.create_partition("bad", [NewItem("bad", b"{}"), NewItem("ok", b"{}")])
        for gate in range(LAST_GATE + 1):
            handler.open(gate)
        async with Follower(http, "bad") as feed:
            events = await feed.rest()
        assert events[-1].kind == "end" and events[-1].json()["status"] == "failed"
        unknown = await http.get("v1/partitions/nothing-here/events")
        assert unknown.status_code == 404
        assert unknown.json()["error"]["code"] == "partition_not_found"
        for query, field in (({"interval": "5"}, "interval"), ({"when": "1"}, "when"),
                             ({"timeout": "-1"}, "timeout")):
            refused = await http.get("v1/partitions/bad/events", params=query)
            assert refused.status_code == 400 and refused.json()["error"]["field"] == field
        bad_id = await http.get("v1/partitions/bad/events", headers={"last-event-id": "x"})
        assert bad_id.status_code == 400
        assert bad_id.json()["error"]["field"] == "Last-Event-ID"
        # A client that had the end is told there is nothing more (an EventSource stops).
        done = await http.get("v1/partitions/bad/events",
                              headers={"last-event-id": events[-1].id or ""})
        assert done.status_code == 204


async def test_a_resume_with_last_event_id_repeats_and_loses_no_gate_move(
        db_url, table_prefix) -> None:
    hub = FeedHub(FAST)
    async with system(db_url, table_prefix, hub) as (url, handler, client), \
            http_client(url) as http:
        await client.create_partition("job", [NewItem(f"i{n}", b"{}") for n in range(3)])
        async with Follower(http, "job") as first:
            await first.next("state")
            handler.open(0)
            moved = await first.next("gate")
        assert first.moves() == [(0, 1)]
        # Disconnected: gate 1 passes meanwhile, and the hub (still watching) sees it.
        handler.open(1)
        await wait_until(lambda: "job" in hub.watches
                         and hub.watches["job"].snapshot.gate == LAST_GATE,
                         message="the hub saw gate 2")
        assert moved.id is not None
        async with Follower(http, "job", **{"last-event-id": moved.id}) as second:
            resumed = await second.next("counts")
            assert second.moves() == [(1, 2)], "the missed move, once; not the seen one"
            assert resumed.json()["gate"] == LAST_GATE
            handler.open(LAST_GATE)
            events = await second.rest()
        assert second.moves() == [(1, 2)]
        assert [event.kind for event in events][-1] == "end"
        # A hub that began watching after the client's id (an API restarted) sends one
        # move standing for what it never saw, marked as a gap.
        fresh = FeedHub(FAST)
        _subscriber, replayed = await fresh.subscribe(client, "job", EventId.parse(moved.id))
        assert [(event.kind, event.data.get("from"), event.data.get("to"),
                 event.data.get("gap")) for event in replayed][:1] == [("gate", 1, 2, True)]
        assert replayed[-1].kind == "end"
        await fresh.close()


async def test_a_hundred_clients_share_one_poller(db_url, table_prefix) -> None:
    """A hundred clients follow one partition through one poller, and what the feed holds
    for them stays bounded while they are slow: the HTTP clients read nothing between
    their state and the end, and a hundred stalled subscribers (streams no one pulls, as
    a client whose connection stopped taking bytes) never read at all. After every poll,
    no queue is over its bound and none holds a counts event (counts are the latest
    only); the stalled ones end with the two gate moves and the end queued, none cut off;
    and the feed's own allocations (tracemalloc) stay under a few KiB a client."""
    hub = FeedHub(FeedSettings(poll_interval=0.05, heartbeat=5.0, queue_size=8))
    async with system(db_url, table_prefix, hub) as (url, handler, client), \
            http_client(url) as http:
        await client.create_partition("busy", [NewItem(f"i{n}", b"{}") for n in range(20)])
        reads = count_calls(client.store, "partition_states", "items_gate_counts")
        followers = [Follower(http, "busy") for _ in range(100)]
        sampled = HubSamples(hub)
        tracemalloc.start()
        try:
            async with contextlib.AsyncExitStack() as stack:
                for follower in followers:
                    await stack.enter_async_context(follower)
                    await follower.next("state")
                assert hub.subscribers == 100 and list(hub.watches) == ["busy"]
                # The first client's subscribe read the partition; the 99 others read
                # nothing.
                assert reads["partition_states"] == 1 + hub.ticks
                stalled = [(await hub.subscribe(client, "busy", None))[0]
                           for _ in range(100)]
                subscribed = feed_bytes()
                assert reads["partition_states"] == 1 + hub.ticks  # nor do these
                for gate in range(LAST_GATE):  # one gate at a time: the poller sees each
                    handler.open(gate)
                    await wait_until(lambda gate=gate: hub.watches["busy"].snapshot.gate
                                     > gate, message=f"the hub saw gate {gate + 1}")
                await wait_until(lambda: sampled.counted, message="counts offered")
                held = feed_bytes()
                handler.open(LAST_GATE)
                ended = await asyncio.gather(*(follower.rest() for follower in followers))
        finally:
            tracemalloc.stop()
        assert all(events[-1].kind == "end" for events in ended)
        assert all([(e.json()["from"], e.json()["to"]) for e in events if e.kind == "gate"]
                   == [(0, 1), (1, 2)] for events in ended)
        # One poller ran, and each of its ticks read every watch once, whatever the clients.
        assert hub.poller_starts == 1
        assert reads["partition_states"] == 1 + hub.ticks
        assert reads["items_gate_counts"] <= 1 + hub.ticks
        assert hub.watches == {} and hub.subscribers == 0
    # What the feed held for them stayed bounded.
    assert sampled.polls >= 3 and sampled.largest <= hub.settings.queue_size
    assert sampled.counts_queued == 0, "counts are kept as the latest only, never queued"
    assert [[event.kind for event in one.queue] for one in stalled] == \
        [["gate", "gate", "end"]] * 100
    assert not any(one.cut_off for one in stalled)
    assert all(one.counts is None or one.counts.kind == "counts" for one in stalled)
    assert held < 200 * 4096, f"the feed holds {held} bytes for 200 clients"
    assert held - subscribed < 200 * 512, \
        f"two gate moves and the counts grew the feed by {held - subscribed} bytes"


class HubSamples:
    """After each of ``hub``'s observations (one per watch a poll): how many polls, the
    longest queue, and how many queued events were counts, over every subscriber."""

    def __init__(self, hub: FeedHub) -> None:
        self.polls = self.largest = self.counts_queued = 0
        self.counted = False
        observe = hub._observe

        def sampled(partition_id: str, watch: Any, seen: Any) -> None:
            subscribers = list(watch.subscribers)
            observe(partition_id, watch, seen)
            self.polls += 1
            for subscriber in subscribers:
                self.largest = max(self.largest, len(subscriber.queue))
                self.counts_queued += sum(1 for event in subscriber.queue
                                          if event.kind == "counts")
                self.counted = self.counted or subscriber.counts is not None

        hub._observe = sampled  # type: ignore[method-assign]


def feed_bytes() -> int:
    """What the feed's server side (the hub, its deliveries and the SSE streams) has
    allocated and still holds (tracemalloc; the clients' parsing is left out)."""
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(True, f"*/processor/feed/{name}.py")
         for name in ("hub", "delivery", "stream")])
    return sum(stat.size for stat in snapshot.statistics("filename"))


async def test_slow_clients_hold_bounded_queues(db_url, table_prefix) -> None:
    """Subscribers that never read: counts are kept as the latest only, and a full queue
    cuts its subscriber off (it resumes with Last-Event-ID) instead of growing."""
    hub = FeedHub(FeedSettings(poll_interval=0.05, queue_size=4))
    async with AsyncClient(db_url, table_prefix) as client:
        await client.create_partition("slow", [NewItem("a", b"{}")])
        subscribers = [(await hub.subscribe(client, "slow", None))[0] for _ in range(100)]
        watch = hub.watches["slow"]
        for gate in range(1, 8):  # seven gate moves, as the poller would see them
            seen = replace(watch.snapshot, gate=gate, version=watch.snapshot.version + 1,
                           gates={gate: {"available": 1}})
            hub._observe("slow", watch, seen)
        assert all(len(subscriber.queue) <= 4 for subscriber in subscribers)
        assert all(subscriber.cut_off for subscriber in subscribers)
        assert all(subscriber.counts is not None for subscriber in subscribers)
        assert watch.subscribers == set(), "cut-off subscribers are let go"
        assert len(watch.journal) == 7, "the journal keeps every move for the resumes"
        await hub.close()


async def test_the_feed_follows_the_token_rules(db_url, table_prefix) -> None:
    hub = FeedHub(FAST)
    async with system(db_url, table_prefix, hub, token=TOKEN) as (url, _handler, client), \
            http_client(url) as http:
        await client.create_partition("p", [NewItem("a", b"{}")])
        refused = await http.get("v1/partitions/p/events")
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Bearer")
        wrong = await http.get("v1/partitions/p/events",
                               headers={"authorization": "Bearer not-the-token-at-all"})
        assert wrong.status_code == 401
        assert hub.subscribers == 0 and hub.watches == {}
        async with http_client(url, authorization=f"Bearer {TOKEN}") as allowed, \
                Follower(allowed, "p") as feed:
            assert (await feed.next("state")).json()["gate"] == 0
            # Nothing happens: the stream keeps itself alive with heartbeat comments.
            assert (await feed.next("comment")).data == ": keep-alive"
