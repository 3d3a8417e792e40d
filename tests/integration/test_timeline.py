"""A partition's timeline, filled by real watchers calling a real handler over HTTP on
loopback: its gate stays and items per minute, and what a new holder does with it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import unquote

from sqlalchemy import delete

from processor import AsyncClient, NewItem
from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from tests.support.engine import crash, running, wait_until
from tests.support.servers import answered_probe, read_body, send_json, serve_app
from watcher import Watcher, WatcherConfig
from watcher.rules.timeline import Timeline, items_per_second
from watcher.store import Store

ITEMS = 30
HELD_FROM = 20  # gate 1's calls of items from this number on wait for the release


class TwoGates:
    """Gate 0 moves each item to gate 1; gate 1 completes it, but the calls of items
    numbered ``HELD_FROM`` or more wait until ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await answered_probe(scope, send):
            return
        await read_body(receive)
        headers = dict(scope["headers"])
        item = unquote(headers.get(b"x-item-id", b"").decode())
        if headers.get(b"x-gate") == b"0":
            await send_json(send, 200, {"gate": 1})
            return
        if int(item.rsplit("-", 1)[1]) >= HELD_FROM:
            await self.release.wait()
        await send_json(send, 200, {"done": True})


@contextlib.asynccontextmanager
async def http_watcher(store: Store, url: str, owner: str) -> AsyncIterator[Watcher]:
    http = HttpProcessor(HttpProcessorConfig(handler_url=f"{url}/"))
    try:
        yield Watcher(store, http, WatcherConfig(
            owner_id=owner, concurrency=8, poll_interval=0.05, lease_duration=1.5))
    finally:
        await http.aclose()


def done_in_minutes(timeline: Timeline) -> int:
    return sum(items for _, items in timeline.minutes)


async def test_the_timeline_fills_as_gates_pass_and_survives_a_new_holder(
        db_url, table_prefix, make_store) -> None:
    handler = TwoGates()
    async with serve_app(handler) as url, AsyncClient(db_url, table_prefix) as client:
        await client.create_partition("job", [NewItem(f"item-{n:02}", b"{}")
                                              for n in range(ITEMS)])
        assert await client.partition_timeline("job") == Timeline()
        async with http_watcher(make_store(), url, "first") as first:
            task = asyncio.create_task(first.run())
            # Gate 0's move wrote its stay; gate 1's first 20 items reach the timeline by
            # the renewals (the move to gate 1 happened before any of them was done).
            timeline = await wait_until(lambda: _with(client, gate_one_items=HELD_FROM),
                                        timeout=20, message="20 items done at gate 1")
            gate0, gate1 = timeline.gates
            assert (gate0.gate, gate0.items, gate1.gate) == (0, ITEMS, 1)
            assert gate0.began is not None and gate0.ended == gate1.began
            assert gate1.ended is None
            assert done_in_minutes(timeline) == ITEMS + HELD_FROM
            now = await client.now()
            assert gate0.began <= gate0.ended <= now  # by the database clock
            assert items_per_second(timeline, now) is not None
            await crash(task)  # no release: the next holder takes over after the lease

        handler.release.set()
        async with http_watcher(make_store(), url, "second") as second, running(second):
            assert (await client.wait("job", timeout=30)).status == "complete"
        final = await client.partition_timeline("job")
    # The second holder carried on from the stored timeline: gate 0's stay and gate 1's
    # start are the first holder's, the items at gate 1 add up.
    assert final.gates[0] == gate0
    assert [(span.gate, span.began, span.items) for span in final.gates] == [
        (0, gate0.began, ITEMS), (1, gate1.began, ITEMS)]
    assert final.gates[1].ended is not None and final.gates[1].ended >= gate1.began
    assert done_in_minutes(final) == 2 * ITEMS


async def _with(client: AsyncClient, *, gate_one_items: int) -> Timeline | None:
    timeline = await client.partition_timeline("job")
    gates = timeline.gates
    if len(gates) == 2 and gates[1].items >= gate_one_items:
        return timeline
    return None


async def test_a_partition_that_drains_within_its_first_seconds_still_has_its_stays(
        db_url, table_prefix, make_store) -> None:
    """Gates that pass before the first renewal: the move reads the stored timeline once,
    and the close writes the last stay."""
    handler = TwoGates()
    handler.release.set()
    async with serve_app(handler) as url, AsyncClient(db_url, table_prefix) as client:
        await client.create_partition("quick", [NewItem(f"item-{n:02}", b"{}")
                                                for n in range(5)])
        async with http_watcher(make_store(), url, "only") as watcher, running(watcher):
            assert (await client.wait("quick", timeout=20)).status == "complete"
        timeline = await client.partition_timeline("quick")
    assert [(span.gate, span.items) for span in timeline.gates] == [(0, 5), (1, 5)]
    assert all(span.began is not None and span.ended is not None for span in timeline.gates)
    assert timeline.gates[0].ended == timeline.gates[1].began
    assert done_in_minutes(timeline) == 10


async def test_items_a_victim_did_before_a_steal_reach_the_timeline_at_its_next_renewal(
        db_url, table_prefix, make_store) -> None:
    """A steal ends the victim's lease before its renewal writes what its items did:
    the victim hands that count over when it finds the lease lost, so the partition's
    rate and ETA do not forget the items it did."""
    handler = TwoGates()
    async with serve_app(handler) as url, AsyncClient(db_url, table_prefix) as client:
        await client.create_partition("job", [NewItem(f"item-{n:02}", b"{}")
                                              for n in range(ITEMS)])
        http = HttpProcessor(HttpProcessorConfig(handler_url=f"{url}/"))
        # Renewals every 100 s: none comes by itself while the test runs.
        victim = Watcher(make_store(), http, WatcherConfig(
            owner_id="victim", concurrency=8, poll_interval=0.05, lease_duration=300))
        thief = make_store()
        try:
            async with running(victim):
                await wait_until(lambda: _complete(client, HELD_FROM), timeout=20,
                                 message=f"{HELD_FROM} items complete")
                stored = await client.partition_timeline("job")
                assert [(span.gate, span.items) for span in stored.gates] == [(0, ITEMS),
                                                                              (1, 0)]
                [row] = await thief.leases_of_owner("victim", 10)
                assert [won.id for won in await thief.leases_take([row], "thief", 60)] == [
                    "job"]
                # The renewal finds the lease lost (unless the victim's own reads found
                # it first) and hands the count over.
                await victim.keeper.renew()
                assert "job" not in victim.keeper.leases
                handed = await client.partition_timeline("job")
                handler.release.set()
        finally:
            await http.aclose()
            await thief.close()
    assert [(span.gate, span.items) for span in handed.gates] == [(0, ITEMS), (1, HELD_FROM)]
    assert done_in_minutes(handed) == ITEMS + HELD_FROM
    assert handed.gates[1].ended is None  # the thief's stay at gate 1 goes on


async def _complete(client: AsyncClient, items: int) -> bool:
    info = await client.partition("job")
    return info.counts.get("complete", 0) >= items


async def test_a_partition_without_a_timeline_row_gets_one_at_its_first_move(
        db_url, table_prefix, make_store) -> None:
    """A partition an older processor created during the upgrade has no row in
    ``partition_timelines``: its lease reads no timeline, and the holder's first move
    writes the row, with the move."""
    store = make_store()
    await store.partition_create("old", [NewItem("a", b"")])
    t = store.tables.timelines
    async with store.engine.begin() as conn:
        await conn.execute(delete(t).where(t.c.partition_id == "old"))
    [row] = await store.leases_read_free(10)
    assert (row.id, row.timeline, row.timeline_read) == ("old", None, True)
    [won] = await store.leases_take([row], "w", 30)
    assert await store.partition_timeline("old") == (True, None)
    text = '{"v":1,"gates":[],"minutes":[]}'
    assert await store.partition_transition("old", won.version, "w", gate=1,
                                            timeline=text) == won.version + 1
    assert await store.partition_timeline("old") == (True, text)
