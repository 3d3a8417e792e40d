"""Parked items seen and answered, on every live database: the per-gate counts, the
oldest wait and the deadlines the CLI, the API and the console show; the parked-item
gauges' read; the console's Complete and Fail forms, which complete by item exactly
once against the token path."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

from processor import AsyncClient, NewItem
from processor.api.views import item_view, partition_view
from processor.console.app import create_app, settings_for
from processor.views import item_row, waiting_row
from tests.integration.test_waits import Parker, config
from tests.support.engine import running, wait_until
from watcher import Result, Watcher
from watcher.errors import AlreadyCompletedError, WaitNotFoundError
from watcher.store.db.urls import parse_database_url

ORIGIN = "http://127.0.0.1:8090"


async def _parked(client: AsyncClient, partition_id: str, count: int) -> None:
    async def parked() -> bool:
        return len(await client.items(partition_id, status="waiting")) == count
    await wait_until(parked, message=f"{count} items waiting")


async def test_parked_items_are_counted_per_gate_with_age_and_deadline(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    parker = Parker(timeout=600.0)
    await client.create_partition("p", [NewItem("a", b"1"), NewItem("b", b"2"),
                                        NewItem("c", b"3", gate=1)])
    store = make_store()
    async with running(Watcher(make_store(), parker, config())):
        await _parked(client, "p", 2)
        summary = (await client.waits_summary(["p", "none"]))
        assert set(summary) == {"p"}, "a partition without parked items is left out"
        assert summary["p"].by_gate == {0: 2}
        assert 0.0 <= summary["p"].oldest_seconds < 300
        now = await client.now()
        deadline = summary["p"].next_deadline
        assert deadline is not None and 590 <= (deadline - now).total_seconds() <= 601
        row = waiting_row(summary["p"])
        assert row is not None and row["by_gate"] == {"0": 2}
        info = await client.partition("p")
        assert info.counts["waiting"] == 2
        assert partition_view(info, summary["p"])["waiting"] == row
        backlog = await store.backlog_read(1000)
        assert backlog.items_parked == 2 and 0.0 <= backlog.oldest_parked < 300
        item = await client.item("p", "a")
        assert item_row(item)["deadline"] is not None
        assert item_view(item, with_data=False)["deadline"].startswith(
            item.retry_at.isoformat()[:19])
        other = await client.item("p", "c")
        assert item_row(other)["deadline"] is None
        assert await client.items("p", status="skipped") == []
        await store.wait_complete(parker.token("a"), Result(gate=1))
        left = await client.waits_summary(["p"])
        assert left["p"].by_gate == {0: 1}
        assert (await store.backlog_read(1000)).items_parked == 1
    await client.close()


async def test_a_console_completion_and_a_token_completion_apply_exactly_once(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    parker = Parker()
    ids = [f"i{n}" for n in range(4)]
    await client.create_partition("p", [NewItem(item_id, b"1") for item_id in ids])
    operator, holder = AsyncClient(db_url, table_prefix), make_store()
    async with running(Watcher(make_store(), parker, config())):
        await _parked(client, "p", len(ids))
        for item_id in ids:
            outcomes = await asyncio.gather(
                operator.complete_item("p", item_id, done=True, data={"by": "operator"}),
                holder.wait_complete(parker.token(item_id), Result(gate=1)),
                return_exceptions=True)
            won = [outcome for outcome in outcomes if not isinstance(outcome, BaseException)]
            lost = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
            assert len(won) == 1 and len(lost) == 1, outcomes
            assert isinstance(lost[0], AlreadyCompletedError), lost
        with pytest.raises(AlreadyCompletedError):
            await operator.complete_item("p", "i0")
        with pytest.raises(WaitNotFoundError):
            await operator.complete_item("p", "nothing")
    await operator.close()
    await client.close()


def _csrf(page: str) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert match, "no CSRF token in the page"
    return match.group(1)


async def test_the_console_item_page_completes_and_fails_a_waiting_item(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    parker = Parker()
    await client.create_partition("p", [NewItem("a", b"1"), NewItem("b", b"2")])
    url = parse_database_url(db_url)
    async with running(Watcher(make_store(), parker, config())), \
            AsyncClient(url, table_prefix) as console_client:
        await _parked(client, "p", 2)
        app = create_app(settings_for(url, table_prefix, host="127.0.0.1", port=8090,
                                      token=None, read_only=False), console_client)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url=ORIGIN) as web:
            page = (await web.get("/item?partition=p&id=a")).text
            assert 'id="complete"' in page and 'id="fail"' in page
            assert 'id="item-deadline"' in page
            for token in parker.tokens["a"] + parker.tokens["b"]:
                assert token not in page, "the completion token is never shown"
            csrf = _csrf(page)
            refused = await web.post("/item/complete", data={
                "partition": "p", "id": "a", "csrf": "0" * 32}, headers={"origin": ORIGIN})
            assert refused.status_code == 403
            cross = await web.post("/item/complete", data={
                "partition": "p", "id": "a", "csrf": csrf},
                headers={"origin": "http://evil.example"})
            assert cross.status_code == 403
            assert (await client.item("p", "a")).status == "waiting", "nothing written"
            bad = await web.post("/item/complete", data={
                "partition": "p", "id": "a", "csrf": csrf, "data": "{not json"},
                headers={"origin": ORIGIN})
            assert bad.status_code == 400 and "not JSON" in bad.text
            done = await web.post("/item/complete", data={
                "partition": "p", "id": "a", "csrf": csrf, "done": "true",
                "data": '{"ok": true}'},
                headers={"origin": ORIGIN})
            assert done.status_code == 303
            shown = (await web.get(done.headers["location"])).text
            assert "Completed: the wait is over" in shown and 'id="complete"' not in shown
            item = await client.item("p", "a")
            assert item.data == b'{"ok":true}' and item.status != "waiting"
            with pytest.raises(AlreadyCompletedError):
                await client.complete(parker.tokens["a"][0])
            both = await web.post("/item/complete", data={
                "partition": "p", "id": "b", "csrf": csrf, "done": "true",
                "answer": '{"gate": 1}'}, headers={"origin": ORIGIN})
            assert both.status_code == 400 and "not both" in both.text
            listed = await web.post("/item/complete", data={
                "partition": "p", "id": "b", "csrf": csrf, "answer": "[1]"},
                headers={"origin": ORIGIN})
            assert listed.status_code == 400 and "JSON object" in listed.text
            again = await web.post("/item/complete", data={
                "partition": "p", "id": "b", "csrf": csrf,
                "answer": '{"wait": {"timeout": 600}, "data": {"asked": 2}}'},
                headers={"origin": ORIGIN})
            assert "notice=waits-again" in again.headers["location"]
            assert "parked the item again" in (await web.get(again.headers["location"])).text
            item = await client.item("p", "b")
            assert item.status == "waiting" and item.data == b'{"asked":2}'
            failed = await web.post("/item/fail", data={
                "partition": "p", "id": "b", "csrf": csrf, "message": "rejected by ops",
                "no_retry": "yes"}, headers={"origin": ORIGIN})
            assert failed.status_code == 303
            item = await client.item("p", "b")
            assert item.status == "failed" and "rejected by ops" in (item.last_error or "")
            again = await web.post("/item/fail", data={
                "partition": "p", "id": "b", "csrf": csrf}, headers={"origin": ORIGIN})
            assert "notice=already-completed" in again.headers["location"]
    await client.close()
