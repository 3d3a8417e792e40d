"""The clients' ``follow`` on every database: a real partition driven through two gates
and a reduce by a watcher in library mode, followed from Python with the live feed's
events (in order, the gate moves it made, the end with its status and result), the
same events the API's Server-Sent Events carry, and resumed with ``after=`` without
repeats."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import replace

import httpx
import pytest

from processor import AsyncClient, Client, InvalidInputError, NewItem, PartitionNotFoundError
from processor.api.server import ApiOptions, api_running
from processor.feed.events import Event, EventId, parse_stream
from processor.feed.hub import FeedBusyError, FeedHub, FeedSettings
from tests.support.engine import wait_until
from tests.support.feed import LAST_GATE, library_watcher
from watcher.store.db.urls import parse_database_url

FAST = FeedSettings(poll_interval=0.05)
WAIT = 30.0


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix, feed=FAST) as opened:
        yield opened


async def next_of(events: AsyncIterator[Event], kind: str, seen: list[Event]) -> Event:
    """The next event of ``kind`` (every event read is kept in ``seen``)."""
    async with asyncio.timeout(WAIT):
        async for event in events:
            seen.append(event)
            if event.kind == kind:
                return event
    raise AssertionError(f"the feed ended before a {kind} event: {seen}")


async def rest(events: AsyncIterator[Event], seen: list[Event]) -> list[Event]:
    async with asyncio.timeout(WAIT):
        seen.extend([event async for event in events])
    return seen


def moves(events: list[Event]) -> list[tuple[int, int, bool]]:
    return [(event.data["from"], event.data["to"], event.data["gap"]) for event in events
            if event.kind == "gate"]


def hub_gate(client: AsyncClient, partition_id: str) -> int | None:
    """The gate the client's hub last saw ``partition_id`` at (``None``: not watched)."""
    watch = client._feed.watches.get(partition_id) if client._feed else None
    return None if watch is None else watch.snapshot.gate


async def test_follow_sends_the_state_each_gate_move_and_the_end_with_the_result(
        db_url, table_prefix, client) -> None:
    async with library_watcher(db_url, table_prefix) as gates:
        await client.create_partition("job", [NewItem(f"i{n}", b"{}") for n in range(5)],
                                      reduce_gates=(LAST_GATE,))
        seen: list[Event] = []
        async with contextlib.aclosing(client.watch("job", interval=0.1)) as events:
            state = await next_of(events, "state", seen)
            assert (state.data["status"], state.data["gate"], state.data["counts"]) == (
                "available", 0, {"available": 5})
            assert state.data["gates"] == [
                {"gate": 0, "items": {"available": 5}, "total": 5, "passed": 0}]
            for gate in range(LAST_GATE):
                gates.open(gate)
                move = await next_of(events, "gate", seen)
                assert (move.data["from"], move.data["to"]) == (gate, gate + 1)
            gates.open(LAST_GATE)
            await rest(events, seen)
    kinds = [event.kind for event in seen]
    assert kinds[0] == "state" and kinds[-2:] == ["result", "end"]
    assert kinds.count("end") == 1 and kinds.count("state") == 1
    assert moves(seen) == [(0, 1, False), (1, 2, False)]
    counts = [event.data for event in seen if event.kind == "counts"]
    assert counts and all(sum(data["counts"].values()) == 5 for data in counts)
    assert any(row["gate"] > 0 for data in counts for row in data["gates"]), \
        "the counts follow the items from gate to gate"
    result, end = seen[-2].data, seen[-1].data
    assert result == {"size": len(b'{"items":5}'), "truncated": False,
                      "result": {"items": 5}}
    assert (end["status"], end["gate"], end["counts"], end["last_error"]) == (
        "complete", LAST_GATE, {"complete": 5}, None)
    ids = [event.id for event in seen]
    assert ids == sorted(ids, key=lambda one: one.version), "ids never go back"
    assert ids[-1].ended and str(ids[-1]).endswith(":e")
    assert all(json.loads(json.dumps(event.data)) == event.data for event in seen)
    # The poller stops once no partition is followed.
    await wait_until(lambda: client._feed is not None and not client._feed.watches,
                     message="the finished partition's watch let go")


async def test_after_resumes_without_repeats(db_url, table_prefix, client) -> None:
    async with library_watcher(db_url, table_prefix) as gates:
        await client.create_partition("job", [NewItem(f"i{n}", b"{}") for n in range(3)],
                                      reduce_gates=(LAST_GATE,))
        first: list[Event] = []
        async with contextlib.aclosing(client.watch("job", interval=0.1)) as events:
            await next_of(events, "state", first)
            gates.open(0)
            moved = await next_of(events, "gate", first)
        assert client._feed is not None and client._feed.subscribers == 0
        # Not followed now: gate 1 passes, and the lingering watch sees it.
        gates.open(1)
        await wait_until(lambda: hub_gate(client, "job") == LAST_GATE, timeout=WAIT,
                         message="the client's hub saw gate 2")
        second: list[Event] = []
        async with contextlib.aclosing(client.watch("job", after=moved.id)) as events:
            resumed = await next_of(events, "counts", second)
            assert resumed.data["gate"] == LAST_GATE
            assert moves(second) == [(1, 2, False)], "the missed move, once; not the seen one"
            gates.open(LAST_GATE)
            await rest(events, second)
        assert moves(second) == [(1, 2, False)]
        assert "state" not in [event.kind for event in second]
        assert [event.kind for event in second][-2:] == ["result", "end"]
        assert all(event.id.version > moved.id.version for event in second)
        end = second[-1]
        # After the end: nothing more (as the API's 204), as text or as an id.
        assert [event async for event in client.watch("job", after=str(end.id))] == []
        # A client that never followed it resumes with one move standing for those it
        # did not see.
        async with AsyncClient(db_url, table_prefix, feed=FAST) as other:
            replayed = [event async for event in other.watch("job", after=str(moved.id))]
        assert moves(replayed) == [(1, LAST_GATE, True)]
        assert [event.kind for event in replayed] == ["gate", "counts", "result", "end"]
        assert replayed[-1].data == end.data


async def test_the_events_are_the_apis_server_sent_events(db_url, table_prefix,
                                                           client) -> None:
    """A finished partition, followed from the client and from the API: the same events,
    ids and payloads."""
    async with library_watcher(db_url, table_prefix) as gates:
        await client.create_partition("done", [NewItem(f"i{n}", b"{}") for n in range(4)],
                                      reduce_gates=(LAST_GATE,))
        for gate in range(LAST_GATE + 1):
            gates.open(gate)
        finished = await client.wait("done", timeout=WAIT)
        assert finished.status == "complete"
    followed = [(event.kind, str(event.id), dict(event.data))
                async for event in client.watch("done")]
    options = ApiOptions(parse_database_url(db_url), table_prefix, port=0)
    async with api_running(options, client, FeedHub(FAST)) as url, \
            httpx.AsyncClient(base_url=url, timeout=WAIT) as http:
        answer = await http.get("v1/partitions/done/events")
    sent = [(event.kind, event.id, event.json())
            for event in parse_stream(answer.text.split("\n"))]
    assert [kind for kind, _, _ in followed] == ["state", "result", "end"]
    assert followed == sent


async def test_a_follower_cut_off_for_being_slow_resumes_by_itself(
        table_prefix, db_url) -> None:
    """Seven gate moves while the follower reads nothing: its queue of four overflows,
    and it goes on from the hub's journal, every move once and in order."""
    settings = FeedSettings(poll_interval=60.0, queue_size=4)  # the test plays the poller
    async with AsyncClient(db_url, table_prefix, feed=settings) as client:
        await client.create_partition("slow", [NewItem("a", b"{}")])
        events = client.watch("slow", interval=0.1)
        seen = [await anext(events)]
        hub = client._feed
        assert hub is not None and seen[0].kind == "state"
        watch = hub.watches["slow"]
        for gate in range(1, 8):
            hub._observe("slow", watch, replace(
                watch.snapshot, gate=gate, version=watch.snapshot.version + 1,
                gates={gate: {"available": 1}}))
        assert watch.subscribers == set(), "the follower was cut off"
        await next_of(events, "counts", seen)  # four from its queue, three replayed
        assert len(watch.subscribers) == 1, "it followed again"
        hub._observe("slow", watch, replace(watch.snapshot, status="cancelled",
                                            version=watch.snapshot.version + 1))
        await rest(events, seen)
    assert [to for _, to, _ in moves(seen)] == list(range(1, 8))
    assert not any(gap for *_, gap in moves(seen))
    assert seen[-1].kind == "end"


async def test_the_sync_client_follows_as_a_plain_iterator(db_url, table_prefix) -> None:
    with Client(db_url, table_prefix, feed=FAST) as sync:
        async with library_watcher(db_url, table_prefix) as gates:
            sync.create_partition("job", [NewItem(f"i{n}", b"{}") for n in range(3)],
                                  reduce_gates=(LAST_GATE,))

            def follow() -> list[Event]:
                return list(sync.watch("job", interval=0.1))

            following = asyncio.create_task(asyncio.to_thread(follow))
            # The gates open one at a time, each once the follower's hub saw the last.
            for gate in range(LAST_GATE + 1):
                await wait_until(lambda gate=gate: hub_gate(sync._async, "job") == gate,
                                 timeout=WAIT, message=f"the hub saw gate {gate}")
                gates.open(gate)
            events = await asyncio.wait_for(following, WAIT)
        assert events[0].kind == "state" and events[-1].kind == "end"
        assert moves(events) == [(0, 1, False), (1, 2, False)]
        assert events[-1].data["status"] == "complete"
        assert events[-2].data["result"] == {"items": 3}
        # Leaving the loop early stops following at once.
        sync.create_partition("open", [NewItem("a", b"{}")])
        for event in sync.watch("open"):
            assert event.kind == "state"
            break
        hub = sync._async._feed
        assert hub is not None and hub.subscribers == 0
        sync.close()
        with pytest.raises(RuntimeError, match="closed"):
            next(iter(sync.watch("open")))


async def test_bad_input_and_unknown_partitions_are_refused(client) -> None:
    await client.create_partition("p", [NewItem("a", b"{}")])
    for interval in (0, 0.05, 61, float("nan"), True, "1"):
        with pytest.raises(InvalidInputError, match="interval must be a number of seconds"):
            await anext(client.watch("p", interval=interval))  # type: ignore[arg-type]
    for after in ("x", "1:2:z", "", 12):
        with pytest.raises(InvalidInputError, match="not an id of the live feed"):
            await anext(client.watch("p", after=after))  # type: ignore[arg-type]
    with pytest.raises(PartitionNotFoundError):
        await anext(client.watch("nothing-here"))
    with pytest.raises(PartitionNotFoundError):
        await anext(client.watch("nothing-here", after=EventId(3, 0, "e")))
    with pytest.raises(InvalidInputError, match="partition"):
        await anext(client.watch(""))
    # A follow in progress ends with the client: it says why.
    events = client.watch("p")
    assert (await anext(events)).kind == "state"
    await client.close()
    with pytest.raises(FeedBusyError, match="closed"):
        await anext(events)
