"""Unpaid retries and their bound (watcher.dispatch.unpaid), and the hold on calls while the
handler's service is down (watcher.flow.handler_hold): pure logic, a fake probe."""

from __future__ import annotations

import asyncio
import logging

import pytest

from watcher.dispatch.unpaid import UnpaidAction, UnpaidRetries, charged_error, decide_unpaid
from watcher.flow.handler_hold import HandlerHold
from watcher.protocol import HandlerUnavailableError, RetryableError, ThrottledError
from watcher.records import ReadyItem
from watcher.rules.buckets import UNLIMITED

DOWN = HandlerUnavailableError("could not connect")
BUSY = ThrottledError("slow down", retry_after=2.0)


@pytest.mark.parametrize(("error", "so_far", "bound", "expected"), [
    (DOWN, 0, 10, UnpaidAction.HOLD),
    (DOWN, 9, 10, UnpaidAction.HOLD),
    (DOWN, 10, 10, UnpaidAction.CHARGE),
    (DOWN, 0, 0, UnpaidAction.CHARGE),
    (BUSY, 0, 3, UnpaidAction.THROTTLE),
    (BUSY, 2, 3, UnpaidAction.THROTTLE),
    (BUSY, 3, 3, UnpaidAction.CHARGE),
])
def test_decide_unpaid(error: RetryableError, so_far: int, bound: int,
                       expected: UnpaidAction) -> None:
    assert decide_unpaid(error, so_far, bound) is expected


def test_a_charged_error_names_the_bound_and_keeps_retry_after() -> None:
    charged = charged_error(BUSY, 3, 3)
    assert type(charged) is RetryableError  # no longer a throttle: it holds no one
    assert charged.retry_after == 2.0
    assert "max_unpaid_retries allows (3)" in charged.message
    assert "slow down" in charged.message


def item(version: int, attempts: int) -> ReadyItem:
    return ReadyItem("i", version, 0, b"{}", attempts)


def test_settle_counts_per_step_and_charges_past_the_bound() -> None:
    holds: list[str] = []
    throttles: list[float] = []
    unpaid = UnpaidRetries("p", 2, on_throttled=throttles.append, on_unavailable=holds.append)
    assert not unpaid
    assert unpaid.settle(item(1, 0), DOWN) is None
    assert unpaid.settle(item(1, 0), BUSY) is None
    assert holds == ["could not connect"] and throttles == [2.0]
    charged = unpaid.settle(item(1, 0), DOWN)
    assert isinstance(charged, RetryableError) and "(2)" in charged.message
    # The charged attempt keeps the step (version and attempts both +1): still charged.
    assert unpaid.settle(item(2, 1), DOWN) is not None
    # Progress (attempts back to 0, a new version) starts a new count.
    assert unpaid.settle(item(3, 0), DOWN) is None
    assert len(holds) == 2


def test_settle_without_a_hold_is_an_ordinary_attempt() -> None:
    unpaid = UnpaidRetries("p", 10)
    assert unpaid.settle(item(1, 0), DOWN) is DOWN
    assert unpaid.settle(item(1, 0), BUSY) is BUSY
    assert not unpaid


async def test_a_hold_lets_no_call_by_until_a_probe_says_up(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="watcher.flow.handler_hold")
    answers = [False, False, True]

    async def probe() -> bool:
        return answers.pop(0)

    hold = HandlerHold(probe, handler="h", first_wait=0.01, max_wait=0.02)
    assert hold.take(5, 0.0) == 5 and hold.free(0.0) == UNLIMITED
    woken = asyncio.Event()
    hold.unavailable("refused")
    hold.unavailable("refused again")  # counted, not logged
    assert hold.held and hold.take(5, 0.0) == 0 and hold.free(0.0) == 0
    hold.notify_when_free(woken)
    async with asyncio.timeout(10):
        await woken.wait()
    assert not hold.held and hold.probes == 3 and answers == []
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2
    assert "action=handler_hold_started handler=h error=refused" in lines[0]
    assert "action=handler_hold_ended handler=h" in lines[1] and "failed_calls=2" in lines[1]
    await hold.stop()


async def test_a_probe_that_raises_says_down_and_stop_ends_the_probing() -> None:
    asked = 0
    twice = asyncio.Event()

    async def probe() -> bool:
        nonlocal asked
        asked += 1
        if asked == 2:
            twice.set()
        raise OSError("boom")

    hold = HandlerHold(probe, first_wait=0.01, max_wait=0.01)
    hold.unavailable("refused")
    async with asyncio.timeout(10):
        await twice.wait()
    assert hold.held
    await hold.stop()
    await hold.stop()  # twice is safe


async def test_without_a_probe_the_hold_ends_after_the_first_wait() -> None:
    hold = HandlerHold(None, first_wait=0.01)
    woken = asyncio.Event()
    hold.unavailable("refused")
    hold.notify_when_free(woken)
    async with asyncio.timeout(10):
        await woken.wait()
    assert not hold.held and hold.holds == 1


def test_status_names_a_handler_held_now_or_lately() -> None:
    from datetime import UTC, datetime, timedelta

    from processor.client.flow_reads import handler_hold_lines
    from watcher.reports import FlowControlInfo

    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)

    def row(scope: str, name: str, seconds: float | None) -> FlowControlInfo:
        until = None if seconds is None else now + timedelta(seconds=seconds)
        return FlowControlInfo(scope, name, None, None, None, until)

    lines = handler_hold_lines([
        row("handler", "http://a", 2.5), row("handler", "http://b\x1b]0;x", -30),
        row("handler", "http://c", -3600), row("handler", "http://d", None),
        row("key", "k", 5)], now)
    assert lines == [
        "handler http://a: held by a Retry-After, 2.5 s left (no processor calls it "
        "meanwhile)",
        "handler http://b?]0;x: last held by a Retry-After 30 s ago"]
