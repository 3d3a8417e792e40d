"""The retry loops off the hot path, with stand-in stores that fail on cue: one line
when an outage begins and one when it ends, lock conflicts at debug level, and a
stop that never waits out a backoff.

The real outages (dropped sessions, a database that is down at start-up) are in
tests/acceptance/test_guarantees.py.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time

import pytest
from sqlalchemy.exc import OperationalError

from processor import service as service_module
from processor.http.config import HttpProcessorConfig
from processor.service import ProcessorService, ServiceConfig
from tests.support.engine import wait_until
from tests.support.fake_store import FakeStore
from watcher import watcher as watcher_module
from watcher.config import WatcherConfig
from watcher.dispatch import writer as writer_module
from watcher.dispatch.writer import ResultWriter, WriterClosedError
from watcher.errors import DatabaseError
from watcher.leasing import listener as listener_module
from watcher.leasing.keeper import LeaseCycle
from watcher.leasing.listener import NotificationListener
from watcher.records import ItemWrite
from watcher.store.db.urls import parse_database_url
from watcher.watcher import Watcher


class _Orig(Exception):
    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


# A backoff long enough that waiting it out cannot pass for cutting it short: a stop or
# close must end within a quarter of it (a margin a loaded machine meets many times over;
# the wait, not the speed of the stop, is what is tested).
LONG_BACKOFF = 60.0
CUT_SHORT = LONG_BACKOFF / 4

def outage() -> OperationalError:
    return OperationalError("SELECT 1", {}, _Orig("connection refused\nDETAIL: more",
                                                  sqlstate="08001"))


def deadlock() -> OperationalError:
    return OperationalError("UPDATE items", {}, _Orig("deadlock detected", sqlstate="40P01"))


def lines(caplog: pytest.LogCaptureFixture, action: str, level: int | None = None) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if f"action={action}" in record.getMessage()
            and (level is None or record.levelno == level)]


# -- the result writer -------------------------------------------------------


def _write(n: int) -> ItemWrite:
    return ItemWrite("p", f"i{n}", 1, "complete", 0, attempts=0)


def _enqueue(writer: ResultWriter, count: int) -> list[asyncio.Future]:
    futures = []
    for n in range(count):
        future = asyncio.get_running_loop().create_future()
        writer.enqueue(_write(n), future.set_result)
        futures.append(future)
    return futures


async def test_the_writer_rides_out_an_outage_with_one_line_each_way(caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="watcher.dispatch.writer")
    store = FakeStore(failures=[outage(), outage(), outage()])
    writer = ResultWriter(store, "me", batch_size=10)
    try:
        futures = _enqueue(writer, 3)
        assert await asyncio.wait_for(asyncio.gather(*futures), 10) == [True] * 3
    finally:
        await writer.close(1.0)
    assert store.asked.apply_calls == 4 and sorted(store.written) == ["i0", "i1", "i2"]
    assert len(lines(caplog, "result_write_failed", logging.WARNING)) == 1
    assert len(lines(caplog, "result_write_recovered", logging.WARNING)) == 1


async def test_the_writer_retries_a_deadlock_quietly(caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="watcher.dispatch.writer")
    store = FakeStore(failures=[deadlock(), deadlock()])
    writer = ResultWriter(store, "me", batch_size=10)
    try:
        assert await asyncio.wait_for(asyncio.gather(*_enqueue(writer, 2)), 10) == [True] * 2
    finally:
        await writer.close(1.0)
    assert len(lines(caplog, "result_write_conflict", logging.DEBUG)) == 2
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_closing_during_an_outage_fails_what_is_queued_at_once(monkeypatch,
                                                                     caplog) -> None:
    """A long backoff under way does not hold up close(): the write is tried once
    more, and when that fails too every queued write fails."""
    monkeypatch.setattr(writer_module, "OUTAGE_RETRY_FIRST", LONG_BACKOFF)
    monkeypatch.setattr(writer_module, "OUTAGE_RETRY_MAX", LONG_BACKOFF)
    store = FakeStore(forever=True, outage=outage)
    writer = ResultWriter(store, "me", batch_size=2)
    futures = _enqueue(writer, 5)
    # Logged as the writer begins to wait (nothing runs between the two).
    await wait_until(lambda: lines(caplog, "result_write_failed"), message="the outage")
    started = time.monotonic()
    await writer.close(30.0)
    assert time.monotonic() - started < CUT_SHORT, "close() waited out the backoff"
    outcomes = await asyncio.gather(*futures)
    assert all(isinstance(outcome, WriterClosedError) for outcome in outcomes)
    assert store.asked.apply_calls == 2, "tried once more when closing"
    assert len(lines(caplog, "result_write_failed", logging.WARNING)) == 1
    with pytest.raises(WriterClosedError):
        writer.enqueue(_write(9), lambda outcome: None)


async def test_closing_before_an_outage_is_noticed_still_logs_it_once(caplog) -> None:
    store = FakeStore(forever=True, outage=outage)
    writer = ResultWriter(store, "me", batch_size=2)
    futures = _enqueue(writer, 2)
    await writer.close(5.0)
    assert all(isinstance(outcome, WriterClosedError)
               for outcome in await asyncio.gather(*futures))
    assert len(lines(caplog, "result_write_failed", logging.WARNING)) == 1


# -- the lease loop and the listener -------------------------------------------


def _watcher(poll_interval: float = 0.01, store: object | None = None,
             lease_duration: float = 60.0) -> Watcher:
    config = WatcherConfig(owner_id="me", poll_interval=poll_interval,
                           lease_duration=lease_duration)
    return Watcher(store or FakeStore(), lambda item: None, config)


def _scripted_cycles(watcher: Watcher, *errors: Exception) -> list[float]:
    """Make each lease cycle raise the next of ``errors``, then succeed; returns the
    times the cycles began."""
    began: list[float] = []
    pending = list(errors)

    async def run_once() -> LeaseCycle:
        began.append(time.monotonic())
        if pending:
            raise pending.pop(0)
        return LeaseCycle()

    watcher.run_once = run_once  # type: ignore[method-assign]
    return began


async def test_the_lease_loop_backs_off_with_one_line_per_outage(caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="watcher.watcher")
    watcher = _watcher(poll_interval=0.01)
    began = _scripted_cycles(watcher, outage(), outage(), outage(), deadlock())
    task = asyncio.create_task(watcher.run())
    try:
        await wait_until(lambda: len(began) >= 6, message="the cycles after the outage")
    finally:
        await watcher.stop()
        await task
    gaps = [later - earlier for earlier, later in itertools.pairwise(began[:4])]
    assert gaps[0] >= 0.015 and gaps[2] >= 0.06, f"doubling waits expected, got {gaps}"
    unavailable = lines(caplog, "database_unavailable", logging.WARNING)
    assert len(unavailable) == 1 and "detail=connection refused" in unavailable[0]
    assert "DETAIL" not in unavailable[0], "only the first line of the error"
    assert len(lines(caplog, "database_recovered", logging.WARNING)) == 1
    assert len(lines(caplog, "lease_cycle_conflict", logging.DEBUG)) == 1


async def test_stop_does_not_wait_out_the_lease_loop_backoff(caplog, monkeypatch) -> None:
    # The first wait after an outage is two poll intervals, up to DB_BACKOFF_MAX.
    monkeypatch.setattr(watcher_module, "DB_BACKOFF_MAX", LONG_BACKOFF)
    watcher = _watcher(poll_interval=LONG_BACKOFF / 2, lease_duration=LONG_BACKOFF * 2)
    began = _scripted_cycles(watcher, *(outage() for _ in range(100)))
    task = asyncio.create_task(watcher.run())
    # Logged as the loop begins its wait of LONG_BACKOFF (nothing runs between the two).
    await wait_until(lambda: lines(caplog, "database_unavailable"), message="the outage")
    started = time.monotonic()
    await watcher.stop()
    await asyncio.wait_for(task, CUT_SHORT)
    assert time.monotonic() - started < CUT_SHORT, "stop() waited out the backoff"
    assert len(began) == 1, "no lease cycle after stop"


def _listener(store: FakeStore, on_notification) -> NotificationListener:
    return NotificationListener(store, on_notification, owner="w1",  # type: ignore[arg-type]
                                poll_interval=0.05, stopping=lambda: False)


async def test_the_listener_reconnects_with_backoff_and_at_once_after_working(
        monkeypatch, caplog) -> None:
    monkeypatch.setattr(listener_module, "LISTEN_BACKOFF_FIRST", 0.02)
    caplog.set_level(logging.DEBUG, logger="watcher.leasing.listener")
    store = FakeStore(notifies=True, notification_scripts=[
        [OSError("refused")], [OSError("refused")],
        ["p1", ConnectionResetError("dropped")], ["p2", None]])
    seen: list[str] = []
    listener = asyncio.create_task(_listener(store, seen.append).run())
    try:
        await wait_until(lambda: seen == ["p1", "p2"], message="both notifications")
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
    connects = store.connects
    assert connects[1] - connects[0] >= 0.015 and connects[2] - connects[1] >= 0.035
    assert connects[3] - connects[2] < 0.015, "a connection that worked is opened again at once"
    assert len(lines(caplog, "listen_failed", logging.WARNING)) == 1
    assert len(lines(caplog, "listen_recovered", logging.INFO)) == 1
    assert len(lines(caplog, "listen_dropped", logging.DEBUG)) == 1


async def test_a_listener_stream_that_ends_at_once_is_backed_off(monkeypatch) -> None:
    monkeypatch.setattr(listener_module, "LISTEN_BACKOFF_FIRST", 0.02)
    store = FakeStore(notifies=True, notification_scripts=[[], [], ["p1", None]])
    seen: list[str] = []
    listener = asyncio.create_task(_listener(store, seen.append).run())
    try:
        await wait_until(lambda: seen == ["p1"], message="the notification")
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
    assert store.connects[2] - store.connects[0] >= 0.05, "no reconnect spin"


# -- start-up: waiting for the database ----------------------------------------

SECRET = "s3cret-pw"


def _service(tmp_path, db_url: str | None = None, **overrides) -> ProcessorService:
    # An existing file: a missing one is refused before any try (never created).
    (tmp_path / "x.db").touch()
    config = ServiceConfig(
        db_url=parse_database_url(db_url or f"sqlite:///{tmp_path / 'x.db'}"),
        watcher=WatcherConfig(owner_id="me"),
        http=HttpProcessorConfig(handler_url="http://127.0.0.1:9/"),
        batch_size=0, health_port=0, health_host="127.0.0.1", **overrides)
    return ProcessorService(config)


def _scripted_tables(monkeypatch, *errors: Exception) -> list[float]:
    tries: list[float] = []
    pending = list(errors)

    async def missing_tables(store) -> list[str]:
        tries.append(time.monotonic())
        if pending:
            raise pending.pop(0)
        return []

    monkeypatch.setattr(service_module, "missing_tables", missing_tables)
    return tries


async def test_start_up_waits_for_the_database_with_one_line_each_way(
        tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setattr(service_module, "DB_WAIT_FIRST", 0.01)
    caplog.set_level(logging.INFO, logger="processor.service")
    tries = _scripted_tables(monkeypatch, outage(), OSError("no route"), outage())
    service = _service(tmp_path)
    try:
        assert await asyncio.wait_for(service._wait_for_database(), 10) is True
    finally:
        await service.store.close()
    assert len(tries) == 4
    waits = lines(caplog, "database_wait", logging.WARNING)
    assert len(waits) == 1 and "retrying with backoff" in waits[0]
    assert len(lines(caplog, "database_available", logging.INFO)) == 1


async def test_a_stop_ends_the_wait_for_the_database_at_once(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(service_module, "DB_WAIT_FIRST", LONG_BACKOFF)
    tries = _scripted_tables(monkeypatch, *(outage() for _ in range(10)))
    service = _service(tmp_path)
    try:
        waiting = asyncio.create_task(service._wait_for_database())
        await wait_until(lambda: tries, message="the first try")
        started = time.monotonic()
        service.request_stop()
        assert await asyncio.wait_for(waiting, CUT_SHORT) is False
        assert time.monotonic() - started < CUT_SHORT and len(tries) == 1
    finally:
        await service.store.close()


async def test_exit_on_db_error_raises_one_scrubbed_line(tmp_path, monkeypatch) -> None:
    error = OperationalError("SELECT 1", {}, _Orig(f"password {SECRET} refused\nmore"))
    tries = _scripted_tables(monkeypatch, error)
    service = _service(tmp_path, f"postgresql://app:{SECRET}@127.0.0.1:1/db",
                       exit_on_db_error=True)
    try:
        with pytest.raises(DatabaseError, match="unavailable") as caught:
            await service._wait_for_database()
    finally:
        await service.store.close()
    assert len(tries) == 1
    message = str(caught.value)
    assert SECRET not in message and "password *** refused" in message
    assert "more" not in message, "only the first line of the error"


def test_a_database_error_line_never_keeps_part_of_the_password() -> None:
    url = parse_database_url(f"postgresql://app:{SECRET}@db.example:5432/app")
    # The password straddles the point where the line is cut.
    text = "x" * (service_module.DB_ERROR_DETAIL_CHARS - 4) + SECRET + " tail\nsecond line"
    line = service_module.describe_db_error(OperationalError("SELECT 1", {}, _Orig(text)), url)
    assert SECRET[:4] not in line and "second" not in line
    assert line.startswith("database ") and "is unavailable: xxx" in line
