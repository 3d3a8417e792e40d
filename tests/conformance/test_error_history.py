"""Each item's error history, written by the hot path's result writes on every live
database: appended by the same write that stores ``last_error``, stamped by the store's
clock (a fixed one here, the database's own in the last test), bounded, and kept by a
success and by ``retry_failed``."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from watcher.protocol import NonRetryableError, Result, RetryableError
from watcher.records import ItemWrite, LeaseRow, NewItem, ReadyItem
from watcher.rules.decisions import RetryPolicy, write_for_error, write_for_result
from watcher.rules.error_history import HISTORY_LENGTH, PENDING_TIME
from watcher.store import Store
from watcher.store.db.clock import FixedClock

MOMENT = datetime(2030, 1, 1, 12, 0, 0)
OWNER = "me"
# No backoff: a failed item is ready again at once (by the fixed clock).
POLICY = RetryPolicy(max_retries=100, backoff=0.0, backoff_max=0.0, jitter=0.0)


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(MOMENT)


@pytest.fixture
def fixed_store(make_store, clock: FixedClock) -> Store:
    return make_store(clock=clock)


async def _leased(store: Store, partition_id: str, items: list[NewItem]) -> None:
    await store.partition_create(partition_id, items)
    await store.leases_take([LeaseRow(partition_id, 1, 0, "")], OWNER, 3600.0)


async def _ready(store: Store, partition_id: str, gate: int = 0) -> dict[str, ReadyItem]:
    return {item.id: item for item in await store.items_ready(partition_id, gate, 100)}


async def _fail(store: Store, partition_id: str, errors: dict[str, BaseException],
                gate: int = 0) -> list[ItemWrite]:
    """One batch: each item named in ``errors`` fails its attempt with its error."""
    ready = await _ready(store, partition_id, gate)
    writes = [write_for_error(partition_id, ready[item_id], error, POLICY)
              for item_id, error in errors.items()]
    assert await store.items_apply(writes, OWNER) == [True] * len(writes)
    return writes


async def test_each_failed_attempt_joins_the_history_stamped_by_the_clock(
        fixed_store: Store, clock: FixedClock) -> None:
    store = fixed_store
    await _leased(store, "p", [NewItem("a", b"x"), NewItem("b", b"x"), NewItem("c", b"x")])
    await _fail(store, "p", {"a": RetryableError("HTTP 503: down"), "b": ValueError("bad")})
    clock.advance(2.5)
    # One batch mixes a failed attempt, a success and an item that never failed.
    ready = await _ready(store, "p")
    writes = [write_for_error("p", ready["a"], RetryableError("HTTP 500: boom"), POLICY),
              write_for_result("p", ready["b"], Result(data=b"y"), 0, POLICY),
              write_for_result("p", ready["c"], Result(), 0, POLICY)]
    assert await store.items_apply(writes, OWNER) == [True, True, True]
    a = await store.item_get("p", "a")
    assert a is not None
    assert [(entry.at, entry.attempt, entry.gate, entry.error) for entry in a.error_history] == [
        (MOMENT, 1, 0, "HTTP 503: down"),
        (MOMENT + timedelta(seconds=2.5), 2, 0, "HTTP 500: boom")]
    b = await store.item_get("p", "b")
    assert b is not None and b.last_error is None and b.attempts == 0
    assert [(entry.at, entry.error) for entry in b.error_history] == [
        (MOMENT, "ValueError: bad")], "a success keeps the history"
    c = await store.item_get("p", "c")
    assert c is not None and c.error_history == ()


async def test_the_history_keeps_the_newest_entries_and_survives_a_retry(
        fixed_store: Store, clock: FixedClock) -> None:
    store = fixed_store
    await _leased(store, "p", [NewItem("a", b"x")])
    for attempt in range(1, HISTORY_LENGTH + 3):
        await _fail(store, "p", {"a": RetryableError(f"error {attempt}")})
        clock.advance(1.0)
    ready = await _ready(store, "p")
    final = write_for_error("p", ready["a"], NonRetryableError("gave up"), POLICY)
    assert final.status == "failed"
    assert await store.items_apply([final], OWNER) == [True]
    item = await store.item_get("p", "a")
    assert item is not None and item.status == "failed"
    assert [entry.error for entry in item.error_history] == [
        *(f"error {n}" for n in range(HISTORY_LENGTH + 3 - HISTORY_LENGTH + 1,
                                      HISTORY_LENGTH + 3)), "gave up"]
    assert [entry.attempt for entry in item.error_history] == list(
        range(HISTORY_LENGTH + 3 - HISTORY_LENGTH + 1, HISTORY_LENGTH + 4))
    assert item.error_history[-1].at == MOMENT + timedelta(seconds=HISTORY_LENGTH + 2)
    await store.items_retry_failed("p")
    retried = await store.item_get("p", "a")
    assert retried is not None and (retried.status, retried.attempts) == ("available", 0)
    assert retried.error_history == item.error_history


async def test_an_error_quoting_the_marker_is_stored_as_it_is(fixed_store: Store) -> None:
    store = fixed_store
    await _leased(store, "p", [NewItem("a", b"x")])
    text = f'handler said {PENDING_TIME} and "quotes", \\ and \u00e9\u4e2d\U0001f600\n2nd'
    await _fail(store, "p", {"a": RetryableError(text)})
    item = await store.item_get("p", "a")
    assert item is not None
    assert [(entry.at, entry.error) for entry in item.error_history] == [(MOMENT, text)]


async def test_the_history_of_an_item_at_a_later_gate_names_that_gate(
        fixed_store: Store) -> None:
    store = fixed_store
    await _leased(store, "p", [NewItem("a", b"x", gate=3)])
    await _fail(store, "p", {"a": RetryableError("late")}, gate=3)
    item = await store.item_get("p", "a")
    assert item is not None
    assert [(entry.gate, entry.attempt) for entry in item.error_history] == [(3, 1)]


async def test_the_database_clock_stamps_the_history(store: Store) -> None:
    await _leased(store, "p", [NewItem("a", b"x")])
    before = await store.now()
    await _fail(store, "p", {"a": RetryableError("HTTP 500: boom")})
    after = await store.now()
    item = await store.item_get("p", "a")
    assert item is not None
    (entry,) = item.error_history
    assert before - timedelta(seconds=1) <= entry.at <= after + timedelta(seconds=1)
    assert entry.at.tzinfo is None
