"""The round-trip bound without a database: deadlines, and what is remembered for readiness."""

from __future__ import annotations

import asyncio
import logging
import types

import pytest
from sqlalchemy.exc import OperationalError

from watcher.store.db import round_trips
from watcher.store.db.round_trips import DatabaseTimeoutError, Deadline, RoundTrips


def _trips(bound: float | None = 0.05) -> RoundTrips:
    return RoundTrips(timeout=0.05, bound=bound, database="postgresql://u:***@h/db",
                      timed_out=lambda error: "statement timeout" in str(error))


async def test_a_round_trip_past_its_bound_raises_a_database_error() -> None:
    trips = _trips()
    with pytest.raises(DatabaseTimeoutError) as caught:
        await trips.call("items_ready", asyncio.sleep(5))
    assert "items_ready" in str(caught.value)
    assert not caught.value.connection_invalidated, \
        "a timeout must not pass for a dropped connection (the writer would split batches)"


async def test_a_driver_that_holds_on_after_the_first_cancel_is_cancelled_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """psycopg answers the first cancellation by cancelling on the server, for up to 10 s."""
    monkeypatch.setattr(round_trips, "CANCEL_GRACE", 0.05)
    interrupted = 0

    async def stubborn() -> None:
        nonlocal interrupted
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            interrupted += 1
            await asyncio.sleep(5)  # "cancelling on the server": cut short by a second cancel

    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):
        async with Deadline(0.05):
            await stubborn()
    assert interrupted == 1 and loop.time() - started < 4
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_a_pushed_deadline_gives_each_statement_the_whole_time() -> None:
    async with Deadline(0.1) as deadline:
        for _ in range(4):
            await asyncio.sleep(0.06)
            deadline.push("SELECT 1")


async def test_an_outside_cancellation_stays_a_cancellation() -> None:
    async def body() -> None:
        async with Deadline(5):
            await asyncio.sleep(5)

    task = asyncio.create_task(body())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_readiness_remembers_each_kind_until_it_succeeds(
        caplog: pytest.LogCaptureFixture) -> None:
    trips = _trips()
    caplog.set_level(logging.DEBUG, logger="watcher.store.db.round_trips")
    for what in ("items_apply", "leases_renew"):
        with pytest.raises(DatabaseTimeoutError):
            await trips.call(what, asyncio.sleep(5))
    server = OperationalError("UPDATE", None, Exception("canceling statement due to "
                                                         "statement timeout"))

    async def refused() -> None:
        raise server

    with pytest.raises(OperationalError):
        await trips.call("gate_summary", refused())
    problem = trips.problem()
    assert problem is not None
    assert all(kind in problem for kind in ("items_apply", "leases_renew", "gate_summary"))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "what=items_apply" in warnings[0].getMessage()
    assert "u:***@h" in warnings[0].getMessage()

    async def answered() -> int:
        return 1

    assert await trips.call("leases_read_free", answered()) == 1
    assert trips.problem() is not None, "another kind answering says nothing of these"
    for kind in ("items_apply", "leases_renew", "gate_summary"):
        await trips.call(kind, answered())
    assert trips.problem() is None
    assert "action=database_timeouts_ended" in caplog.text


async def test_a_kind_never_tried_again_is_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    trips = _trips()
    with pytest.raises(DatabaseTimeoutError):
        await trips.call("leases_take", asyncio.sleep(5))
    assert trips.problem() is not None
    monkeypatch.setattr(round_trips, "FORGET_AFTER", -1.0)
    assert trips.problem() is None


async def test_without_a_bound_nothing_is_interrupted() -> None:
    trips = _trips(bound=None)

    async def slow() -> str:
        await asyncio.sleep(0.1)
        return "done"

    assert await trips.call("items_ready", slow()) == "done"


class _RollbackFails:
    """A transaction whose clean-up, after an interrupted statement, fails with a
    database error instead of passing the interruption on (as a driver's rollback on
    a connection left mid-statement does)."""

    async def __aenter__(self) -> object:
        return types.SimpleNamespace(info={})  # a connection's info, where a deadline goes

    async def __aexit__(self, kind: object, error: object, traceback: object) -> None:
        if kind is not None:
            raise OperationalError("ROLLBACK", {}, Exception("another command is in progress"))


@pytest.mark.parametrize("bound", [None, 5.0])
async def test_a_cancellation_the_drivers_clean_up_replaced_is_raised_again(
        bound: float | None) -> None:
    trips = _trips(bound)
    entered = asyncio.Event()

    async def transaction() -> None:
        async with trips.transaction(_RollbackFails(), "lease_cycle"):  # type: ignore[arg-type]
            entered.set()
            await asyncio.sleep(5)

    task = asyncio.create_task(transaction())
    await asyncio.wait_for(entered.wait(), timeout=5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task  # not the OperationalError: a retrying loop would carry on


@pytest.mark.parametrize("bound", [None, 5.0])
async def test_a_failure_without_a_cancellation_stays_a_database_error(
        bound: float | None) -> None:
    async def fails() -> None:
        raise OperationalError("SELECT 1", {}, Exception("server closed the connection"))

    with pytest.raises(OperationalError):
        await _trips(bound).call("items_ready", fails())
    with pytest.raises(OperationalError):
        async with _trips(bound).transaction(_RollbackFails(), "lease_cycle"):  # type: ignore[arg-type]
            raise RuntimeError("a bug in the body")
