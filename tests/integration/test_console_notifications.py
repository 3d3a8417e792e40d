"""The console's Notifications page on every database, over HTTP in process: the
outbox's pending, delivered and dead counts, the latest dead events with partition,
masked URL, attempts and last error, the navigation link, and the resend, which follows
the cross-site and session-token rules of every action and is refused on a read-only
console. Neither the signing secret nor a URL's password or query value is shown."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from processor import AsyncClient, NewItem
from processor.notify.deliverer import Deliverer
from processor.notify.policy import NotifyConfig
from tests.integration.test_console import ORIGIN, _csrf, _web
from tests.support.engine import wait_until
from tests.support.receiver import Receiver
from tests.support.servers import serve_app
from watcher.store import Store

SECRET = b"whsec-console-0123456789abcdef"


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


async def one_dead_one_delivered(client: AsyncClient, store: Store) -> int:
    """Partition "gone" cancelled, its event dead (the receiver answers 410); "fine"
    cancelled, its event delivered. Returns the dead event's number."""
    gone, fine = Receiver(SECRET, status=410), Receiver(SECRET)
    async with serve_app(gone) as gone_base, serve_app(fine) as fine_base:
        host = gone_base.removeprefix("http://")
        await client.create_partition(
            "gone", [NewItem("a", b"")], notify=f"http://ops:pw5ecret@{host}/h?token=t0ps3cret")
        await client.create_partition("fine", [NewItem("a", b"")], notify=fine_base + "/h")
        await client.cancel("gone")
        await client.cancel("fine")
        deliverer = Deliverer(store, "d1", NotifyConfig(secret=SECRET, allow_private=True,
                                                        max_attempts=1, interval=0.05))

        async def settled() -> bool:
            await deliverer.run_once()
            counts = await store.notifications_counts(delivered=True)
            return counts["dead"] == 1 and counts["delivered"] == 1

        try:
            await wait_until(settled, timeout=20, interval=0.02, message="one dead, one sent")
        finally:
            await deliverer.close()
    (dead,) = await client.notifications(state="dead")
    return dead.seq


async def test_the_page_counts_and_lists_dead_events_masked(
        db_url: str, table_prefix: str, client: AsyncClient, store: Store) -> None:
    seq = await one_dead_one_delivered(client, store)
    async with _web(db_url, table_prefix, read_only=False) as web:
        assert 'href="/notifications"' in (await web.get("/")).text
        page = await web.get("/notifications")
    assert page.status_code == 200
    text = page.text
    assert 'id="count-pending">0<' in text and 'id="count-delivered">1<' in text
    assert 'id="count-dead">1<' in text and 'aria-current="page">Notifications' in text
    assert f'data-key="event-{seq}"' in text and 'href="/partition?id=gone"' in text
    assert "/h?token=***" in text and "ops:***@" in text
    assert "HTTP 410" in text and 'value="' + str(seq) + '"' in text
    assert ">Redeliver</button>" in text and "Send again" not in text  # the CLI's verb
    for secret in ("pw5ecret", "t0ps3cret", SECRET.decode()):
        assert secret not in text
    assert "fine" not in text.split("Dead events")[1]  # delivered: counted, not listed


async def test_the_resend_follows_the_action_rules(
        db_url: str, table_prefix: str, client: AsyncClient, store: Store) -> None:
    seq = await one_dead_one_delivered(client, store)
    async with _web(db_url, table_prefix, read_only=False) as web:
        csrf = _csrf((await web.get("/notifications")).text)
        form = {"seq": str(seq), "csrf": csrf}
        refused = {
            "cross-site": await web.post("/notifications/redeliver", data=form,
                                         headers={"origin": "http://evil.example"}),
            "no token": await web.post("/notifications/redeliver",
                                       data={**form, "csrf": "0" * 32},
                                       headers={"origin": ORIGIN}),
            "not a number": await web.post("/notifications/redeliver",
                                           data={**form, "seq": "1 or 1=1"},
                                           headers={"origin": ORIGIN}),
        }
        assert {name: answer.status_code for name, answer in refused.items()} == {
            "cross-site": 403, "no token": 403, "not a number": 400}
        assert [event.seq for event in await client.notifications(state="dead")] == [seq]
        sent = await web.post("/notifications/redeliver", data=form,
                              headers={"origin": ORIGIN})
        assert sent.status_code == 303
        assert sent.headers["location"] == f"/notifications?notice=redelivered&seq={seq}"
        (event,) = await client.notifications(state="pending")
        assert event.seq == seq and event.attempts == 0
        after = (await web.get(sent.headers["location"])).text
        assert f"Event #{seq} will be sent again" in after and 'id="count-dead">0<' in after
        again = await web.post("/notifications/redeliver", data=form,
                               headers={"origin": ORIGIN})
        assert again.headers["location"] == f"/notifications?notice=not-redelivered&seq={seq}"


async def test_a_read_only_console_shows_but_does_not_resend(
        db_url: str, table_prefix: str, client: AsyncClient, store: Store) -> None:
    seq = await one_dead_one_delivered(client, store)
    async with _web(db_url, table_prefix, read_only=True) as web:
        page = (await web.get("/notifications")).text
        assert f'data-key="event-{seq}"' in page and "Redeliver" not in page \
            and "/notifications/redeliver" not in page
        refused = await web.post("/notifications/redeliver",
                                 data={"seq": str(seq), "csrf": "0" * 32},
                                 headers={"origin": ORIGIN})
        assert refused.status_code == 403 and "read-only" in refused.text
    assert [event.seq for event in await client.notifications(state="dead")] == [seq]


async def test_an_empty_outbox_says_so(db_url: str, table_prefix: str) -> None:
    async with _web(db_url, table_prefix, read_only=False) as web:
        page = await web.get("/notifications")
    assert page.status_code == 200 and "No dead events" in page.text
    assert 'id="count-delivered">0<' in page.text


async def test_the_page_shows_an_event_left_for_want_of_the_flag_with_why(
        db_url: str, table_prefix: str, client: AsyncClient, store: Store) -> None:
    await client.create_partition("inside", [NewItem("a", b"")],
                                  notify="http://localhost:9/h?token=t0ps3cret")
    await client.cancel("inside")
    strict = Deliverer(store, "strict", NotifyConfig(secret=SECRET, allow_private=False))
    try:
        assert (await strict.run_once())["refused"] == 1
    finally:
        await strict.close()
    async with _web(db_url, table_prefix, read_only=False) as web:
        text = (await web.get("/notifications")).text
    assert 'id="count-pending">1<' in text and 'id="count-dead">0<' in text
    waiting = text.split("Pending with an error")[1].split("Dead events")[0]
    assert 'data-key="waiting-' in waiting and 'href="/partition?id=inside"' in waiting
    assert "resolves to an internal address" in waiting and "--notify-allow-private" in waiting
    assert "this processor (strict) leaves it to one that has it" in waiting
    assert "t0ps3cret" not in text and "/h?token=***" in waiting
