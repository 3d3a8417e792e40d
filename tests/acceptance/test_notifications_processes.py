"""Notifications from the outside, on every database: ``processor create --notify`` and
``processor run`` subprocesses, a handler and a webhook receiver on loopback. A
processor killed with SIGKILL while its POST is in flight leaves the event to the next
processor, which sends it again under the same id: delivered at least once, signed,
and no process ever writes the secret; a partition's successive ends (a rewind reopens
it) arrive in the order they were written, through the kill. The metric, the listing
and the status line show what is pending."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import pytest

from tests.acceptance.harness.processes import FAST, Processor, run_cli, spawn
from tests.support.engine import wait_until
from tests.support.handler_apps import TwoGateHandler
from tests.support.receiver import Receiver
from tests.support.servers import free_port, serve_app

pytestmark = pytest.mark.timeout(300)

T = TypeVar("T")
SECRET = "whsec-acceptance-5f1e2d3c4b5a69788796a5b4"
ENV = {"PROCESSOR_NOTIFY_SECRET": SECRET}


async def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``processor *args`` off the event loop: the receiver and the handler run on it."""
    return await asyncio.to_thread(run_cli, *args)


async def logged(processor: Processor, waiting: Awaitable[T]) -> T:
    """``waiting``; on a timeout, the processor's log is in the failure."""
    try:
        return await waiting
    except AssertionError as error:
        raise AssertionError(f"{error}; {processor.owner}'s log:\n"
                             f"{processor.stderr()[-4000:]}") from None


def where(db_url: str, table_prefix: str) -> list[str]:
    return ["--db-url", db_url, "--table-prefix", table_prefix]


async def start(owner: str, handler: str, db: list[str], tmp_path: Path, *,
                notify_timeout: str, extra: tuple[str, ...] = ()) -> Processor:
    port = free_port()
    return await spawn(owner, ["run", "--handler-url", handler, *db, *FAST, "--owner-id", owner,
                               "--notify-allow-private", "--notify-timeout", notify_timeout,
                               "--notify-backoff", "0.2s", "--health-host", "127.0.0.1",
                               "--health-port", str(port), *extra],
                       tmp_path, health_port=port, env=ENV)


def test_a_bad_notify_url_is_one_line_and_nothing_is_written(db_url: str,
                                                            table_prefix: str) -> None:
    db = where(db_url, table_prefix)
    refused = run_cli("create", "p", "--notify", "ftp://example.com/x", *db)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().splitlines() == [
        "processor: error: notify of partition 'p' must be an http:// or https:// URL, got "
        "scheme 'ftp'"]
    assert "Traceback" not in refused.stderr
    assert run_cli("status", "--json", *db).stdout.strip() == "[]"


async def test_kill_9_mid_delivery_is_delivered_after_restart(
        db_url: str, table_prefix: str, tmp_path: Path) -> None:
    db = where(db_url, table_prefix)
    receiver = Receiver(SECRET.encode(), hold=True)
    async with serve_app(TwoGateHandler()) as handler, serve_app(receiver) as hooks:
        items = tmp_path / "items.ndjson"
        items.write_text('{"id": "a", "data": 1}\n{"id": "b", "data": 2}\n')
        made = await cli("create", "job", "--items", str(items), "--notify",
                       f"{hooks}/hook?token=t0ps3cret", "--json", *db)
        assert made.returncode == 0, made.stderr
        assert json.loads(made.stdout)["notify"] == f"{hooks}/hook?token=t0ps3cret"
        # The first claims with a short lease (its timeout's), so the second takes over
        # soon after the kill; the second has room for a loaded machine.
        first = await start("first", handler + "/", db, tmp_path, notify_timeout="1")
        try:
            await logged(first, wait_until(lambda: receiver.received, timeout=90,
                                           message="the first POST in flight"))
            status = await cli("status", *db)
            # Claimed, so not due until its lease ends (a loaded machine may get there).
            assert "notifications: 1 pending (" in status.stdout, status
            metrics = await first.metrics()
            assert metrics.get('statefeed_notifications{state="pending"}') in (0.0, 1.0)
            first.kill()
            await first.wait(20)
        finally:
            if first.running:
                first.kill()
        receiver.hold = False
        receiver.released.set()
        second = await start("second", handler + "/", db, tmp_path, notify_timeout="10")
        try:
            listing = await logged(second, wait_until(
                lambda: _delivered(db), timeout=90, message="the event delivered"))
            await second.terminate()
        finally:
            if second.running:
                second.kill()
    (event,) = listing["events"]
    assert event["state"] == "delivered" and event["status"] == "complete"
    assert event["attempts"] >= 2 and event["target"].endswith("/hook?token=***")
    ids = receiver.event_ids()
    assert len(ids) >= 2 and set(ids) == {event["id"]}
    assert all(one.signed for one in receiver.received)
    body = receiver.received[-1].event
    assert body["counts"] == {"complete": 2} and body["status"] == "complete"
    for process in (first, second):
        log = process.stderr() + process.output()
        assert SECRET not in log and "t0ps3cret" not in log
    assert "action=notify_delivered" in second.stderr()


async def test_a_partitions_ends_arrive_in_order_through_kill_9(
        db_url: str, table_prefix: str, tmp_path: Path) -> None:
    """One partition ends three times: complete, complete again after a rewind to gate 1,
    and cancelled while a rewind to gate 0 is in flight. The receiver holds its answers,
    so the first event is in flight (again and again, each attempt timing out) and the
    later two wait behind it; then the processor is killed with SIGKILL. The next
    processor sends the three in the order they were written: every POST of an event
    comes after the last POST of the one before, each signed."""
    db = where(db_url, table_prefix)
    receiver = Receiver(SECRET.encode(), hold=True)
    handler_app = TwoGateHandler()
    async with serve_app(handler_app) as handler, serve_app(receiver) as hooks:
        items = tmp_path / "items.ndjson"
        items.write_text('{"id": "a", "data": 1}\n{"id": "b", "data": 2}\n')
        made = await cli("create", "job", "--items", str(items), "--notify",
                         f"{hooks}/hook", *db)
        assert made.returncode == 0, made.stderr
        first = await start("first", handler + "/", db, tmp_path, notify_timeout="1",
                            extra=("--notify-attempts", "1000"))
        try:
            await logged(first, wait_until(lambda: receiver.received, timeout=90,
                                           message="the first POST in flight"))
            rewound = await cli("rewind", "job", "--gate", "1", *db)
            assert rewound.returncode == 0, rewound.stderr
            await logged(first, wait_until(lambda: _events(db, 2), timeout=90,
                                           message="the second end's event written"))
            handler_app.hold = asyncio.Event()  # the next calls stay in flight
            calls = len(handler_app.calls)
            rewound = await cli("rewind", "job", "--gate", "0", *db)
            assert rewound.returncode == 0, rewound.stderr
            await logged(first, wait_until(lambda: len(handler_app.calls) > calls,
                                           timeout=90, message="the re-run in flight"))
            cancelled = await cli("cancel", "job", *db)
            assert cancelled.returncode == 0, cancelled
            assert cancelled.stdout.startswith("cancelled partition 'job'"), cancelled
            written = await logged(first, wait_until(lambda: _events(db, 3), timeout=90,
                                                     message="the third end's event"))
            handler_app.hold.set()
            order = [event["id"] for event in written]
            # Only the first event was ever sent: the later ones wait behind it.
            assert set(receiver.event_ids()) == {order[0]}
            first.kill()
            await first.wait(20)
        finally:
            if first.running:
                first.kill()
        receiver.hold = False
        receiver.released.set()
        second = await start("second", handler + "/", db, tmp_path, notify_timeout="10")
        try:
            await logged(second, wait_until(lambda: _events(db, 3, state="delivered"),
                                            timeout=90, message="the three delivered"))
            await second.terminate()
        finally:
            if second.running:
                second.kill()
    ids = receiver.event_ids()
    assert set(ids) == set(order) and all(one.signed for one in receiver.received)
    for earlier, later in itertools.pairwise(order):
        last_of_earlier = max(n for n, one in enumerate(ids) if one == earlier)
        assert ids.index(later) > last_of_earlier, (order, ids)
    bodies = {one.event["id"]: one.event for one in receiver.received}
    assert [bodies[event_id]["status"] for event_id in order] == [
        "complete", "complete", "cancelled"]
    ended = [bodies[event_id]["ended_at"] for event_id in order]
    assert ended == sorted(ended)


async def _events(db: list[str], count: int, state: str | None = None) -> list[dict] | None:
    """The outbox's events in the order they were written, once there are ``count`` (all
    in ``state``, when given)."""
    listing = await cli("notifications", "list", "--json", *db)
    assert listing.returncode == 0, listing.stderr
    events = sorted(json.loads(listing.stdout)["events"], key=lambda event: event["seq"])
    if len(events) < count or (state and any(e["state"] != state for e in events)):
        return None
    return events


async def _delivered(db: list[str]) -> dict | None:
    listing = await cli("notifications", "list", "--json", *db)
    assert listing.returncode == 0, listing.stderr
    found = json.loads(listing.stdout)
    return found if [e["state"] for e in found["events"]] == ["delivered"] else None


async def test_the_cli_lists_and_redelivers_dead_events(db_url: str, table_prefix: str,
                                                        tmp_path: Path) -> None:
    db = where(db_url, table_prefix)
    receiver = Receiver(SECRET.encode(), status=410)
    async with serve_app(TwoGateHandler()) as handler, serve_app(receiver) as hooks:
        assert (await cli("create", "gone", "--notify", f"{hooks}/h", *db)).returncode == 0
        assert (await cli("cancel", "gone", *db)).returncode == 0
        port = free_port()
        processor = await spawn("p1", ["run", "--handler-url", handler + "/", *db, *FAST,
                                       "--notify-allow-private", "--notify-attempts", "2",
                                       "--notify-backoff", "0.1s", "--health-host",
                                       "127.0.0.1", "--health-port", str(port)],
                                tmp_path, health_port=port, env=ENV)
        try:
            async def dead() -> dict | None:
                found = json.loads((await cli("notifications", "list", "--state", "dead",
                                              "--json", *db)).stdout)
                return found if found["events"] else None

            listing = await logged(processor, wait_until(dead, timeout=90,
                                                         message="the event dead"))
            metrics = await wait_until(
                lambda: _dead_metric(processor), timeout=30, message="the dead gauge")
            assert metrics == 1.0
        finally:
            await processor.terminate()
    (event,) = listing["events"]
    assert event["attempts"] == 2 and event["last_error"].startswith("HTTP 410")
    assert listing["counts"] == {"pending": 0, "dead": 1, "due": 0}
    text = await cli("notifications", "list", *db)
    assert "HTTP 410" in text.stdout and "0 pending (0 due now), 1 dead" in text.stdout
    again = await cli("notifications", "redeliver", str(event["seq"]), *db)
    assert again.stdout.strip() == "1 of 1 dead event will be sent again", again
    assert "notifications: 1 pending" in (await cli("status", *db)).stdout


async def _dead_metric(processor: Processor) -> float | None:
    value = (await processor.metrics()).get('statefeed_notifications{state="dead"}')
    return value if value else None



def test_a_bad_default_notify_url_stops_run_with_one_line(tmp_path: Path) -> None:
    db = ["--db-url", f"sqlite:///{tmp_path / 'never.db'}", "--handler-url",
          "http://127.0.0.1:9/"]
    for url, line in (
            ("ftp://example.com/x", "--notify-url (PROCESSOR_NOTIFY_URL) must be an "
             "http:// or https:// URL, got scheme 'ftp'"),
            ("http://user:pw5ecret@127.0.0.1:9/h",
             "--notify-url (PROCESSOR_NOTIFY_URL): host '127.0.0.1' resolves to an internal "
             "address (127.0.0.1); the processor sends there only with "
             "--notify-allow-private")):
        refused = run_cli("run", *db, "--notify-url", url)
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.strip().splitlines() == [f"processor: error: {line}"]
        assert "pw5ecret" not in refused.stderr + refused.stdout
    assert not (tmp_path / "never.db").exists()


async def test_run_sends_ends_without_a_url_to_its_default(
        db_url: str, table_prefix: str, tmp_path: Path) -> None:
    db = where(db_url, table_prefix)
    default, own = Receiver(SECRET.encode()), Receiver(SECRET.encode())
    async with serve_app(TwoGateHandler()) as handler, serve_app(default) as default_base, \
            serve_app(own) as own_base:
        default_url = f"{default_base}/all?token=d3fault"
        items = tmp_path / "items.ndjson"
        items.write_text('{"id": "a", "data": 1}\n')
        for pid, extra in (("plain2", []), ("mine", ["--notify", f"{own_base}/own"])):
            made = await cli("create", pid, "--items", str(items), *extra, *db)
            assert made.returncode == 0, made.stderr
        port = free_port()
        processor = await spawn("p1", ["run", "--handler-url", handler + "/", *db, *FAST,
                                       "--notify-allow-private", "--notify-url", default_url,
                                       "--health-host", "127.0.0.1",
                                       "--health-port", str(port)],
                                tmp_path, health_port=port, env=ENV)
        try:
            await logged(processor, wait_until(
                lambda: len(default.received) >= 1 and len(own.received) >= 1, timeout=90,
                message="both events delivered"))
            await processor.terminate()
        finally:
            if processor.running:
                processor.kill()
    assert [one.event["partition_id"] for one in default.received] == ["plain2"]
    assert [one.event["partition_id"] for one in own.received] == ["mine"]
    assert all(one.signed for one in default.received + own.received)
    log = processor.stderr() + processor.output()
    assert "notify_default=" in log and "d3fault" not in log and SECRET not in log


def test_a_cancel_sends_to_the_default_it_is_given(db_url: str, table_prefix: str) -> None:
    db = where(db_url, table_prefix)
    for pid in ("given", "not-given"):
        assert run_cli("create", pid, *db).returncode == 0
    default = {"PROCESSOR_NOTIFY_URL": "https://hooks.example.com/all?token=d3fault"}
    assert run_cli("cancel", "given", *db, env=default).returncode == 0
    assert run_cli("cancel", "not-given", *db).returncode == 0
    listing = json.loads(run_cli("notifications", "list", "--json", *db).stdout)
    assert [(event["partition_id"], event["status"], event["target"])
            for event in listing["events"]] == [
        ("given", "cancelled", "https://hooks.example.com/all?token=***")]
    refused = run_cli("cancel", "not-given", *db, "--notify-url", "file:///etc/passwd")
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "processor: error: --notify-url (PROCESSOR_NOTIFY_URL) must be an http:// or "
        "https:// URL, got scheme 'file'"]
