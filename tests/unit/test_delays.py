"""The delay checks (watcher/rules/delays.py) and the wire and SDK shapes of not_before and
snooze: pure functions, tables of cases."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from handlers import Result as HandlerResult
from handlers.wire.contract import encode_result
from processor.wire.contract import parse_answer, parse_new_item
from processor.wire.errors import MalformedResponseError
from watcher.protocol import Result
from watcher.records import NewItem, ReadyItem
from watcher.rules.decisions import result_problem, write_for_result
from watcher.rules.delays import (
    MAX_SNOOZE_SECONDS,
    DelayError,
    checked_time,
    parse_time,
    snooze_problem,
    stored_time,
)
from watcher.rules.spawn import DEFAULT_SPAWN_LIMITS, spawn_problem

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def test_an_aware_time_in_any_zone_is_the_same_instant_in_utc() -> None:
    plus_two = datetime(2026, 11, 26, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    assert checked_time(plus_two, "not_before", now=NOW) == NOW
    assert stored_time(checked_time(plus_two, "not_before", now=NOW)) == datetime(2026, 11, 26,
                                                                                 12, 0)


@pytest.mark.parametrize(("value", "words"), [
    (datetime(2026, 11, 26, 12, 0), "no time zone"),
    (NOW + timedelta(days=400), "366 days ahead"),
    ("2026-11-26T12:00:00Z", "must be a datetime"),
    (1_700_000_000, "must be a datetime"),
])
def test_a_bad_time_names_the_value_and_the_fix(value: object, words: str) -> None:
    with pytest.raises(DelayError, match=words) as caught:
        checked_time(value, "not_before", now=NOW)
    assert "not_before" in str(caught.value)


@pytest.mark.parametrize(("text", "expected"), [
    ("2026-11-26T12:00:00Z", NOW),
    ("2026-11-26T13:00:00+01:00", NOW),
    ("2026-11-26T12:00:00.250000z", NOW + timedelta(milliseconds=250)),
])
def test_rfc3339_times_parse_to_utc(text: str, expected: datetime) -> None:
    assert parse_time(text, "not_before", now=NOW) == expected


@pytest.mark.parametrize(("text", "words"), [
    ("2026-11-26T12:00:00", "no offset"),
    ("tomorrow", "not an RFC 3339 time"),
    (12, "must be an RFC 3339 time"),
])
def test_bad_rfc3339_times_are_refused(text: object, words: str) -> None:
    with pytest.raises(DelayError, match=words):
        parse_time(text, "not_before", now=NOW)


@pytest.mark.parametrize(("seconds", "problem"), [
    (0.5, None), (MAX_SNOOZE_SECONDS, None), (0, "above 0"), (-3, "above 0"),
    (float("nan"), "above 0"), (float("inf"), "above 0"), (True, "number of seconds"),
    ("5", "number of seconds"), (MAX_SNOOZE_SECONDS + 1, "longer than"),
])
def test_snooze_bounds(seconds: object, problem: str | None) -> None:
    found = snooze_problem(seconds)
    assert (found is None) if problem is None else (problem in (found or ""))


def test_a_snooze_longer_than_the_processors_cap_is_a_problem() -> None:
    assert "longer than" in (result_problem(Result(snooze=120.0), max_snooze=60.0) or "")
    assert result_problem(Result(snooze=60.0), max_snooze=60.0) is None


def test_a_snooze_write_keeps_the_gate_resets_attempts_and_waits() -> None:
    from watcher.rules.decisions import RetryPolicy

    item = ReadyItem("a", 3, 2, b"{}", 2)
    write = write_for_result("p", item, Result(snooze=30.0, data=b"{}"), 2, RetryPolicy())
    assert (write.status, write.gate, write.attempts, write.retry_delay) == (
        "available", 2, 0, 30.0)
    assert write.last_error is None


def test_the_wire_reads_snooze_and_refuses_what_is_not_a_number() -> None:
    assert parse_answer({"snooze": 2.5, "data": {"cursor": 3}}) == Result(
        snooze=2.5, data=b'{"cursor":3}')
    for bad in ("5", True, [1], {"s": 1}):
        with pytest.raises(MalformedResponseError, match="snooze"):
            parse_answer({"snooze": bad})


def test_a_new_item_on_the_wire_carries_not_before() -> None:
    item = parse_new_item({"id": "a", "data": 1, "not_before": "2026-11-26T13:00:00+01:00"},
                          "line 1: ")
    assert item.not_before == NOW
    with pytest.raises(MalformedResponseError, match=r"line 1: 'not_before'.*no offset"):
        parse_new_item({"id": "a", "data": 1, "not_before": "2026-11-26T13:00:00"}, "line 1: ")


def test_a_spawned_item_with_a_naive_not_before_is_a_problem() -> None:
    naive = NewItem("c", b"{}", not_before=datetime(2026, 11, 26, 12, 0))
    assert "no time zone" in (spawn_problem([naive], floor=0, limits=DEFAULT_SPAWN_LIMITS) or "")
    aware = NewItem("c", b"{}", not_before=datetime.now(UTC))
    assert spawn_problem([aware], floor=0, limits=DEFAULT_SPAWN_LIMITS) is None


def test_the_sdk_sends_snooze_and_refuses_it_with_done_or_gate() -> None:
    assert json.loads(encode_result(HandlerResult(snooze=3))) == {"snooze": 3}
    with pytest.raises(ValueError, match="cannot come with"):
        HandlerResult(snooze=3, gate=2)
    with pytest.raises(ValueError, match="above 0"):
        HandlerResult(snooze=0)
    with pytest.raises(TypeError, match="number of seconds"):
        HandlerResult(snooze="3")  # type: ignore[arg-type]


def test_a_processor_caps_snoozes_at_its_shortest_retention_period() -> None:
    from types import SimpleNamespace

    from watcher.retention import snooze_cap

    assert snooze_cap(None) == MAX_SNOOZE_SECONDS
    assert snooze_cap(SimpleNamespace(older_than=3600.0, items_older_than=None)) == 3600.0
    assert snooze_cap(SimpleNamespace(older_than=None, items_older_than=60.0)) == 60.0
    assert snooze_cap(SimpleNamespace(older_than=30 * 86400.0,
                                      items_older_than=None)) == MAX_SNOOZE_SECONDS
