"""The console's live feed (``/live/partition/events``) on a real uvicorn server, on every
database: a partition a library-mode watcher drives through two gates and a reduce,
streamed with the console's auth (its token as a bearer or its session cookie; 401
without), the same events the ingest API sends, and the console's refusals."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx

from processor import AsyncClient, NewItem
from processor.console.server import ConsoleOptions, console_running
from processor.feed.events import Received, parse_stream
from processor.feed.hub import FeedHub, FeedSettings
from tests.support.feed import LAST_GATE, library_watcher
from watcher.store.db.urls import parse_database_url

TOKEN = "console-feed-token-0123456789"
FAST = FeedSettings(poll_interval=0.05)
WAIT = 30.0


def options(db_url: str, table_prefix: str, **overrides: object) -> ConsoleOptions:
    return ConsoleOptions(db_url=parse_database_url(db_url), table_prefix=table_prefix,
                          port=0, **overrides)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def events(http: httpx.AsyncClient, partition_id: str, **headers: str
                 ) -> AsyncIterator[tuple[httpx.Response, AsyncIterator[Received]]]:
    """The console's feed of ``partition_id``: the answer and its events, as they come."""
    async with http.stream("GET", "live/partition/events",
                           params={"id": partition_id, "interval": "100"},
                           headers=headers) as response:
        async def read() -> AsyncIterator[Received]:
            lines: list[str] = []
            async for line in response.aiter_lines():
                lines.append(line)
                if line == "":
                    for event in parse_stream(lines):
                        yield event
                    lines.clear()
        yield response, read()


async def until(stream: AsyncIterator[Received], kind: str, seen: list[Received]) -> Received:
    async with asyncio.timeout(WAIT):
        async for event in stream:
            seen.append(event)
            if event.kind == kind:
                return event
    raise AssertionError(f"the stream ended before a {kind} event: {seen}")


async def test_the_console_streams_a_partition_with_its_token(db_url, table_prefix) -> None:
    hub = FeedHub(FAST)
    async with AsyncClient(db_url, table_prefix) as client, \
            library_watcher(db_url, table_prefix) as gates, \
            console_running(options(db_url, table_prefix, token=TOKEN), client, hub) as url, \
            httpx.AsyncClient(base_url=url, timeout=WAIT) as http:
        await client.create_partition("job", [NewItem(f"i{n}", b"{}") for n in range(4)],
                                      reduce_gates=(LAST_GATE,))
        # Without the token: 401 before anything is read, as every page of the console.
        refused = await http.get("live/partition/events", params={"id": "job"})
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Bearer")
        assert "text/event-stream" not in refused.headers["content-type"]
        wrong = await http.get("live/partition/events", params={"id": "job"},
                               headers={"authorization": "Bearer not-the-token-at-all"})
        assert wrong.status_code == 401
        assert hub.subscribers == 0 and hub.watches == {}
        # With it, as a script sends it: the partition's state, each gate move, the end.
        seen: list[Received] = []
        async with events(http, "job", authorization=f"Bearer {TOKEN}") as (answer, stream):
            assert answer.status_code == 200
            assert answer.headers["content-type"].startswith("text/event-stream")
            assert answer.headers["cache-control"] == "no-store"
            assert "default-src 'none'" in answer.headers["content-security-policy"]
            state = (await until(stream, "state", seen)).json()
            assert (state["status"], state["gate"], state["counts"]) == (
                "available", 0, {"available": 4})
            for gate in range(LAST_GATE):
                gates.open(gate)
                move = (await until(stream, "gate", seen)).json()
                assert (move["from"], move["to"]) == (gate, gate + 1)
            gates.open(LAST_GATE)
            end = (await until(stream, "end", seen)).json()
            async with asyncio.timeout(WAIT):
                assert [event async for event in stream] == [], "it closes after the end"
        assert (end["status"], end["counts"]) == ("complete", {"complete": 4})
        assert [event.json()["result"] for event in seen if event.kind == "result"] == [
            {"items": 4}]
        # A browser's session: the token once in the address, then the cookie.
        signed_in = await http.get("partitions", params={"token": TOKEN})
        assert signed_in.status_code == 303 and "set-cookie" in signed_in.headers
        async with events(http, "job") as (answer, stream):
            assert answer.status_code == 200
            assert [event.kind async for event in stream] == ["state", "result", "end"]
        # An EventSource that had the end is told there is nothing more.
        done = await http.get("live/partition/events", params={"id": "job"},
                              headers={"last-event-id": seen[-1].id or ""})
        assert done.status_code == 204
        # The same events as the ingest API's, from the client's watch.
        async with events(http, "job", authorization=f"Bearer {TOKEN}") as (_, stream):
            streamed = [(event.kind, event.id, event.json()) async for event in stream]
        followed = [(event.kind, str(event.id), dict(event.data))
                    async for event in client.watch("job")]
        assert streamed == followed


async def test_the_console_refuses_what_it_cannot_follow(db_url, table_prefix) -> None:
    async with AsyncClient(db_url, table_prefix) as client, \
            console_running(options(db_url, table_prefix, read_only=True), client,
                            FeedHub(FAST)) as url, \
            httpx.AsyncClient(base_url=url, timeout=WAIT) as http:
        await client.create_partition("p", [NewItem("a", b"{}")])
        # On loopback without a token, and read-only: the feed is a read, so it streams.
        async with events(http, "p") as (answer, stream):
            assert answer.status_code == 200
            assert (await until(stream, "state", [])).json()["gate"] == 0
        unknown = await http.get("live/partition/events", params={"id": "nothing-here"})
        assert unknown.status_code == 404 and "nothing-here" in unknown.text
        assert (await http.get("live/partition/events")).status_code == 404
        for query, fragment in (({"id": "p", "interval": "5"}, "interval"),
                                ({"id": "p", "interval": "x"}, "interval")):
            bad = await http.get("live/partition/events", params=query)
            assert bad.status_code == 400 and fragment in bad.text
        bad_id = await http.get("live/partition/events", params={"id": "p"},
                                headers={"last-event-id": "x"})
        assert bad_id.status_code == 400 and "Last-Event-ID" in bad_id.text
        # A page of another name for this machine (DNS rebinding) is refused first.
        rebound = await http.get("live/partition/events", params={"id": "p"},
                                 headers={"host": "evil.example"})
        assert rebound.status_code == 421
