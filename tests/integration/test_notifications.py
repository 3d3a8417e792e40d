"""Notifications on real databases and a real receiver (uvicorn on loopback): the end of
a partition that names a URL is written to the outbox in the transaction that ends it,
once, whoever races; the delivery loop sends it signed, retries through an outage,
gives up after its bound, leaves an internal address to a processor allowed it, keeps a
partition's events in order, and never logs its secret."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from processor import AsyncClient, NewItem
from processor.notify import deliverer as deliverer_module
from processor.notify.deliverer import Deliverer
from processor.notify.policy import NotifyConfig
from tests.support.engine import running, wait_until
from tests.support.receiver import Receiver
from tests.support.servers import free_port, serve_app
from watcher import Result, Watcher, WatcherConfig, WorkItem
from watcher.errors import InvalidInputError, PartitionNotFoundError
from watcher.protocol import NonRetryableError
from watcher.store import Store

SECRET = b"whsec-test-0123456789abcdef-secret"
FAST = {"poll_interval": 0.05, "lease_duration": 3.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2}
QUICK = {"secret": SECRET, "allow_private": True, "timeout": 2.0, "backoff": 0.01,
         "backoff_cap": 0.05, "interval": 0.05}


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    app = Receiver(SECRET)
    async with serve_app(app) as base:
        yield app, base + "/hooks"


async def outbox(store: Store, **filters: Any) -> list[Any]:
    return await store.notifications_list(limit=1000, **filters)


async def deliver_until(deliverer: Deliverer, store: Store, state: str,
                        count: int) -> list[Any]:
    """Run passes of ``deliverer`` until ``count`` events are in ``state``."""
    async def settled() -> list[Any] | None:
        await deliverer.run_once()
        found = await outbox(store, state=state)
        return found if len(found) >= count else None

    return await wait_until(settled, timeout=20, interval=0.02,
                            message=f"{count} events {state}")


async def test_each_end_is_one_signed_event(client: AsyncClient, store: Store,
                                            receiver: tuple[Receiver, str]) -> None:
    app, url = receiver

    async def process(item: WorkItem) -> Result:
        if item.id == "bad":
            raise NonRetryableError("cannot read it")
        return Result(done=True)

    await client.create_partition("done", [NewItem("a", b"1"), NewItem("b", b"2")], notify=url)
    await client.create_partition("broken", [NewItem("bad", b"")], notify=url)
    await client.create_partition("stopped", [NewItem("x", b"", gate=5)], notify=url,
                                  start_at=None)
    await client.create_partition("quiet", [NewItem("q", b"")])
    assert await client.cancel("stopped") is True
    async with running(Watcher(store, process, WatcherConfig(owner_id="w", **FAST))):
        await client.wait("done", timeout=20)
        await client.wait("broken", timeout=20)
        await client.wait("quiet", timeout=20)
    rows = await outbox(store)
    assert sorted((row.partition_id, row.status) for row in rows) == [
        ("broken", "failed"), ("done", "complete"), ("stopped", "cancelled")]
    deliverer = Deliverer(store, "d1", NotifyConfig(**QUICK))
    try:
        await deliver_until(deliverer, store, "delivered", 3)
    finally:
        await deliverer.close()
    assert len(app.received) == 3 and all(one.signed for one in app.received)
    events = {one.event["partition_id"]: one for one in app.received}
    done = events["done"].event
    assert done["status"] == "complete" and done["type"] == "partition.complete"
    assert done["counts"] == {"complete": 2} and done["partition_found"] is True
    assert events["done"].headers["statefeed-event-id"] == done["id"]
    assert events["done"].headers["statefeed-attempt"] == "1"
    broken = events["broken"].event
    assert broken["status"] == "failed" and "cannot read it" in broken["last_error"]
    assert events["stopped"].event["status"] == "cancelled"
    assert {row.event_id for row in await outbox(store)} == set(app.event_ids())
    assert await store.notifications_counts() == {"pending": 0, "dead": 0, "due": 0}


async def test_racing_ends_write_one_event(store: Store, client: AsyncClient) -> None:
    """Two closes of one lease and a cancel race: exactly one ends the partition (a
    complete partition is not cancelled, a cancelled one not closed), and exactly one
    event is written, with the status it ended with."""
    for round_ in range(5):
        pid = f"race{round_}"
        await client.create_partition(pid, [NewItem("a", b"")], notify="https://example.com/h")
        rows = await store.leases_read_free(10)
        row = next(row for row in rows if row.id == pid)
        (lease,) = await store.leases_take([row], "w1", 30.0)
        assert lease.settings.notify == "https://example.com/h"
        outcomes = await asyncio.gather(
            store.partition_transition(pid, lease.version, "w1", status="complete",
                                       notify=True),
            store.partition_transition(pid, lease.version, "w1", status="complete",
                                       notify=True),
            client.cancel(pid))
        ended = (await client.partition(pid)).status
        events = await outbox(store, partition_id=pid)
        assert [event.status for event in events] == [ended], (outcomes, ended)


async def test_a_partition_without_a_url_writes_nothing(store: Store,
                                                        client: AsyncClient) -> None:
    await client.create_partition("plain", [NewItem("a", b"")])
    (row,) = await store.leases_read_free(10)
    (lease,) = await store.leases_take([row], "w1", 30.0)
    assert await store.partition_transition("plain", lease.version, "w1",
                                            status="complete") is not None
    await client.create_partition("plain2", [NewItem("a", b"")])
    await client.cancel("plain2")
    assert await outbox(store) == []


async def test_receiver_down_then_up_is_delivered_after_retries(
        client: AsyncClient, store: Store) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/hooks"
    await client.create_partition("p", [NewItem("a", b"")], notify=url)
    await client.cancel("p")
    deliverer = Deliverer(store, "d1", NotifyConfig(**QUICK))
    try:
        await deliverer.run_once()
        (event,) = await outbox(store)
        assert event.state == "pending" and event.attempts == 1
        assert event.last_error and "Connect" in event.last_error
        assert str(port) not in event.last_error  # the error names no URL
        app = Receiver(SECRET)
        async with serve_app(app, port=port):
            (event,) = await deliver_until(deliverer, store, "delivered", 1)
        assert event.attempts >= 2 and event.last_error is None
        assert len(app.received) == 1 and app.received[0].signed
        assert app.received[0].headers["statefeed-attempt"] == str(event.attempts)
    finally:
        await deliverer.close()


@pytest.mark.parametrize("failure", ["4xx", "timeout"])
async def test_a_receiver_that_keeps_failing_is_dead_after_the_bound(
        client: AsyncClient, store: Store, failure: str) -> None:
    app = Receiver(SECRET, status=400, hold=failure == "timeout")
    config = NotifyConfig(**{**QUICK, "timeout": 0.3, "max_attempts": 3})
    async with serve_app(app) as base:
        await client.create_partition("p", [NewItem("a", b"")], notify=base + "/hooks")
        await client.cancel("p")
        deliverer = Deliverer(store, "d1", config)
        try:
            (event,) = await deliver_until(deliverer, store, "dead", 1)
        finally:
            app.released.set()
            await deliverer.close()
    assert event.attempts == 3 and len(app.received) == 3
    assert event.last_error == ("HTTP 400: {\"ok\": false}" if failure == "4xx"
                                else "no answer within 0.3 s")
    assert await store.notifications_counts() == {"pending": 0, "dead": 1, "due": 0}
    # Sent again on request: pending, attempts from zero.
    assert await client.redeliver_notifications([event.seq]) == 1
    (again,) = await outbox(store)
    assert again.state == "pending" and again.attempts == 0


async def test_an_event_too_old_is_dead_at_its_next_failure(client: AsyncClient,
                                                            store: Store) -> None:
    port = free_port()  # nothing listens
    await client.create_partition("p", [NewItem("a", b"")],
                                  notify=f"http://127.0.0.1:{port}/")
    await client.cancel("p")
    deliverer = Deliverer(store, "d1", NotifyConfig(**{**QUICK, "max_age": 0.001}))
    try:
        (event,) = await deliver_until(deliverer, store, "dead", 1)
    finally:
        await deliverer.close()
    assert event.attempts == 1


async def test_a_processor_without_the_flag_leaves_internal_events_to_one_with_it(
        client: AsyncClient, store: Store, receiver: tuple[Receiver, str],
        caplog: pytest.LogCaptureFixture) -> None:
    # Two processors disagree on --notify-allow-private: the one without it must not
    # decide the fate of the events the other may send.
    app, url = receiver
    for n in range(9):
        await client.create_partition(f"p{n}", [NewItem("a", b"")],
                                      notify=url.replace("127.0.0.1", "localhost"))
        await client.cancel(f"p{n}")
    strict = Deliverer(store, "strict", NotifyConfig(**{**QUICK, "allow_private": False}))
    allowing = Deliverer(store, "allowing", NotifyConfig(**QUICK))
    caplog.set_level(logging.WARNING, logger="processor.notify.deliverer")
    try:
        # The strict one alone first: it claims every event and leaves each unspent.
        refused = 0
        while outcomes := await strict.run_once():  # a pass claims up to 8
            assert set(outcomes) == {"refused"}, outcomes
            refused += outcomes["refused"]
        assert refused == 9  # each once: it passes them by now
        events = await outbox(store)
        assert {event.state for event in events} == {"pending"}
        assert {event.attempts for event in events} == {0}
        for event in events:
            assert "resolves to an internal address" in (event.last_error or "")
            assert "--notify-allow-private" in (event.last_error or "")
        assert app.received == []
        # Then both, as two processors of one fleet: the allowing one sends them all.
        loops = [asyncio.create_task(strict.run()), asyncio.create_task(allowing.run())]
        try:
            delivered = await wait_until(
                lambda: _in_state(store, "delivered", 9), timeout=30,
                message="every event delivered by the processor allowed to")
        finally:
            strict.stop()
            allowing.stop()
            await asyncio.gather(*loops)
    finally:
        await strict.close()
        await allowing.close()
    assert await outbox(store, state="dead") == []
    assert {event.attempts for event in delivered} == {1}  # the strict one spent none
    assert sorted(set(app.event_ids())) == sorted(event.event_id for event in delivered)
    left = [record for record in caplog.records if "action=notify_left" in record.getMessage()]
    assert len(left) == 9, [record.getMessage() for record in left]


async def _in_state(store: Store, state: str, count: int) -> list[Any] | None:
    found = await outbox(store, state=state)
    return found if len(found) >= count else None


async def test_an_internal_event_no_processor_may_send_waits_visibly_then_dies_old(
        client: AsyncClient, store: Store, receiver: tuple[Receiver, str],
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    app, url = receiver
    await client.create_partition("p", [NewItem("a", b"")],
                                  notify=url.replace("127.0.0.1", "localhost"))
    await client.cancel("p")
    monkeypatch.setattr(deliverer_module, "LEAVE_FOR", 0.0)  # looks again at every pass
    caplog.set_level(logging.WARNING, logger="processor.notify.deliverer")
    strict = Deliverer(store, "strict", NotifyConfig(**{**QUICK, "allow_private": False}))
    try:
        for _ in range(3):
            assert (await strict.run_once())["refused"] == 1
    finally:
        await strict.close()
    (event,) = await outbox(store)
    assert (event.state, event.attempts) == ("pending", 0)
    assert "this processor (strict) leaves it to one that has it" in (event.last_error or "")
    assert (await store.notifications_counts())["pending"] == 1
    left = [record for record in caplog.records if "action=notify_left" in record.getMessage()]
    assert len(left) == 1  # one line per event, not one per look
    # Past --notify-max-age, it is dead with the reason, as a failing event is.
    old = Deliverer(store, "old", NotifyConfig(**{**QUICK, "allow_private": False,
                                                  "max_age": 0.001}))
    try:
        (dead,) = await deliver_until(old, store, "dead", 1)
    finally:
        await old.close()
    assert app.received == []
    assert "resolves to an internal address" in (dead.last_error or "")
    assert "--notify-allow-private" in (dead.last_error or "")


async def test_a_partitions_events_go_in_order(client: AsyncClient, store: Store) -> None:
    """A partition cancelled, resumed by a retry and cancelled again has two events; the
    second waits while the first is failing, and they arrive in order."""
    app = Receiver(SECRET, status=503)
    async with serve_app(app) as base:
        await client.create_partition("p", [NewItem("a", b"")], notify=base + "/h")
        await client.cancel("p")
        await client.retry_failed("p")
        await client.cancel("p")
        first, second = await outbox(store)
        deliverer = Deliverer(store, "d1", NotifyConfig(**QUICK))
        try:
            for _ in range(3):
                await deliverer.run_once()
            assert set(app.event_ids()) == {first.event_id}
            app.status = 200
            await deliver_until(deliverer, store, "delivered", 2)
        finally:
            await deliverer.close()
    ids = app.event_ids()
    assert ids[-2:] == [first.event_id, second.event_id] and second.event_id not in ids[:-1]


async def test_without_a_secret_nothing_is_sent(client: AsyncClient, store: Store,
                                                receiver: tuple[Receiver, str]) -> None:
    app, url = receiver
    await client.create_partition("p", [NewItem("a", b"")], notify=url)
    await client.cancel("p")
    deliverer = Deliverer(store, "d1", NotifyConfig(**{**QUICK, "secret": None}))
    try:
        assert not await deliverer.run_once()
    finally:
        await deliverer.close()
    assert app.received == [] and (await outbox(store))[0].state == "pending"


async def test_the_loop_never_logs_its_secret(client: AsyncClient, store: Store,
                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    app = Receiver(SECRET, status=500)
    async with serve_app(app) as base:
        await client.create_partition("p", [NewItem("a", b"")], notify=base + "/h?token=abc123")
        await client.cancel("p")
        deliverer = Deliverer(store, "d1", NotifyConfig(**{**QUICK, "max_attempts": 2}))
        task = asyncio.create_task(deliverer.run())
        try:
            await wait_until(lambda: outbox(store, state="dead"), timeout=20,
                             message="the event dead")
        finally:
            deliverer.stop()
            await task
    ours = [record.getMessage() for record in caplog.records
            if record.name.startswith(("processor", "watcher"))]
    text = "\n".join(ours)
    assert "action=notify_retry" in text and "action=notify_dead" in text
    assert SECRET.decode() not in caplog.text  # nor in any library's line
    assert "abc123" not in text
    assert SECRET.decode() not in repr(NotifyConfig(**QUICK))


async def test_a_hanging_receiver_never_slows_the_engine(client: AsyncClient,
                                                         store: Store) -> None:
    """The engine and the delivery loop share one event loop, as in a processor. With
    the receiver holding every answer (its slots full, each attempt's timeout far
    away), partitions that name it still run to their end at the engine's pace: each
    end writes its event and moves on. A delivery that blocked the end would need the
    attempt's timeout (60 s) per partition; these all finish within one such timeout,
    and the events are all sent once the receiver answers."""
    app = Receiver(SECRET, hold=True)
    config = NotifyConfig(**{**QUICK, "timeout": 60.0, "concurrency": 2})
    count = 12
    async with serve_app(app) as base:
        url = base + "/hooks"
        deliverer = Deliverer(store, "d1", config)
        delivering = asyncio.create_task(deliverer.run())

        async def process(item: WorkItem) -> Result:
            return Result(done=True)

        watcher = Watcher(store, process, WatcherConfig(owner_id="w", **FAST))
        try:
            async with running(watcher):
                await client.create_partition("first", [NewItem("a", b"")], notify=url)
                await client.wait("first", timeout=config.timeout)
                await wait_until(lambda: app.received, timeout=20,
                                 message="the first event held by the receiver")
                started = time.monotonic()
                for n in range(count):
                    await client.create_partition(
                        f"p{n}", [NewItem(f"i{k}", b"", gate=k % 2) for k in range(4)],
                        notify=url)
                for n in range(count):
                    assert (await client.wait(f"p{n}", timeout=config.timeout)
                            ).status == "complete"
                took = time.monotonic() - started
            # One end held by its delivery would take the attempt's whole timeout.
            assert took < config.timeout, f"{count} partitions took {took:.1f} s"
            # Every end wrote its event; the receiver holds as many as the loop's slots,
            # answered none, and the rest wait their turn.
            assert len(app.received) == config.concurrency
            counts = await store.notifications_counts(delivered=True)
            assert counts["delivered"] == 0 and counts["pending"] == count + 1
            app.hold = False
            app.released.set()

            async def all_delivered() -> bool:
                return len(await outbox(store, state="delivered")) == count + 1

            await wait_until(all_delivered, timeout=30, interval=0.05,
                             message="every event delivered once the receiver answers")
        finally:
            app.hold = False
            app.released.set()
            deliverer.stop()
            await delivering
    rows = await outbox(store, state="delivered")
    assert sorted(row.partition_id for row in rows) == sorted(
        ["first", *(f"p{n}" for n in range(count))])
    assert all(one.signed for one in app.received)
    assert {one.event["partition_id"] for one in app.received} == {
        row.partition_id for row in rows}


@pytest.mark.parametrize("bad", ["ftp://example.com/x", "example.com/hook", "http://",
                                 "https://exa mple.com/", 42])
async def test_a_bad_url_is_refused_and_nothing_written(client: AsyncClient, store: Store,
                                                        bad: Any) -> None:
    with pytest.raises(InvalidInputError, match="notify of partition 'p'"):
        await client.create_partition("p", [NewItem("a", b"")], notify=bad)
    with pytest.raises(PartitionNotFoundError):
        await client.partition("p")
