"""The partition timeline's JSON, its bounds, and the rate and ETA read from it."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest

from watcher.rules.timeline import (
    MAX_GATES,
    MAX_MINUTES,
    DoneTally,
    GateSpan,
    Progress,
    Timeline,
    decode_timeline,
    encode_timeline,
    eta_seconds,
    items_per_second,
    record_done,
    record_handed_over,
    record_move,
)
from watcher.store.db.clock import ClockReading

T0 = datetime(2026, 3, 1, 12, 0, 0)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_round_trip_keeps_gates_and_minutes() -> None:
    timeline = Timeline(
        gates=(GateSpan(0, at(0), at(90.125), 40), GateSpan(1, at(90.125), None, 3)),
        minutes=((at(0), 25), (at(60), 18)))
    text = encode_timeline(timeline)
    assert decode_timeline(text) == timeline
    assert json.loads(text)["v"] == 1


@pytest.mark.parametrize("text", [None, "", "not json", "[]", '{"gates": [[1, 2]]}',
                                  '{"gates": 7}', '{"minutes": [["x", 1]]}'])
def test_unreadable_text_is_an_empty_timeline(text: str | None) -> None:
    assert decode_timeline(text) == Timeline()


def test_items_done_land_in_their_minute_and_open_the_gate_they_left() -> None:
    timeline = record_done(Timeline(), at(10), Progress(gate=0, items=4, age=6.0))
    timeline = record_done(timeline, at(40), Progress(gate=0, items=5, age=2.0))
    timeline = record_done(timeline, at(70), Progress(gate=0, items=1))
    assert timeline.minutes == ((at(0), 9), (at(60), 1))
    assert timeline.gates == (GateSpan(0, at(4), None, 10),)


def test_a_former_holders_items_join_the_gates_latest_stay_without_moving_the_partition(
) -> None:
    # The new holder moved the partition from gate 0 to 1 before the old one handed over.
    timeline = record_move(record_done(Timeline(), at(10), Progress(0, 3, age=5.0)),
                           at(20), Progress(0, 2), 1)
    handed = record_handed_over(timeline, at(75), Progress(gate=0, items=22, age=40.0))
    assert handed.gates == (GateSpan(0, at(5), at(20), 27), GateSpan(1, at(20), None, 0))
    assert handed.minutes == ((at(0), 5), (at(60), 22))


def test_a_hand_over_at_a_gate_the_timeline_never_saw_counts_only_its_minute() -> None:
    handed = record_handed_over(Timeline(), at(30), Progress(gate=2, items=4, age=9.0))
    assert handed.gates == ()
    assert handed.minutes == ((at(0), 4),)
    assert record_handed_over(handed, at(31), Progress(2, 0)) == handed


def test_an_empty_progress_changes_nothing_but_old_minutes() -> None:
    timeline = record_done(Timeline(), at(0), Progress(0, 3))
    assert record_done(timeline, at(30), Progress(0, 0)) == timeline
    later = record_done(timeline, at(60 * MAX_MINUTES), Progress(0, 0))
    assert later.minutes == ()  # the minute fell out of the last hour
    assert later.gates == timeline.gates


def test_minutes_and_gates_are_bounded() -> None:
    timeline = Timeline()
    for minute in range(3 * MAX_MINUTES):
        timeline = record_done(timeline, at(60 * minute + 5), Progress(minute % 7, 1))
    assert len(timeline.minutes) == MAX_MINUTES
    assert timeline.minutes[-1] == (at(60 * (3 * MAX_MINUTES - 1)), 1)
    for gate in range(3 * MAX_GATES):
        timeline = record_move(timeline, at(20_000 + gate), Progress(gate, 2), gate + 1)
    assert len(timeline.gates) == MAX_GATES
    assert timeline.gates[-1] == GateSpan(3 * MAX_GATES, at(20_000 + 3 * MAX_GATES - 1),
                                          None, 0)
    assert len(encode_timeline(timeline)) < 8_000


def test_a_move_ends_the_stay_and_begins_the_next() -> None:
    timeline = record_done(Timeline(), at(5), Progress(0, 10, age=5))
    moved = record_move(timeline, at(12), Progress(0, 2, age=3), to_gate=2)
    assert moved.gates == (GateSpan(0, at(0), at(12), 12), GateSpan(2, at(12), None, 0))
    closed = record_move(moved, at(30), Progress(2, 12, age=10), to_gate=None)
    assert closed.gates[-1] == GateSpan(2, at(12), at(30), 12)
    assert sum(items for _, items in closed.minutes) == 24


def test_a_move_from_a_gate_it_never_saw_begin_leaves_the_start_unknown() -> None:
    moved = record_move(Timeline(), at(50), Progress(3, 0), to_gate=4)
    assert moved.gates == (GateSpan(3, None, at(50), 0), GateSpan(4, at(50), None, 0))
    assert moved.gates[0].seconds(at(60)) is None
    assert moved.gates[1].seconds(at(60)) == 10.0


def test_a_gate_moved_by_a_client_ends_the_stay_left_open() -> None:
    timeline = record_done(Timeline(), at(10), Progress(0, 1, age=10))
    timeline = record_done(timeline, at(40), Progress(5, 2, age=4))
    assert timeline.gates == (GateSpan(0, at(0), at(36), 1), GateSpan(5, at(36), None, 2))


def test_the_rate_counts_the_recent_minutes_since_work_began() -> None:
    timeline = Timeline(gates=(GateSpan(0, at(30), None, 0),),
                        minutes=((at(0), 60), (at(60), 60)))
    # 120 items from 00:30 to 02:00: 90 s
    assert items_per_second(timeline, at(120)) == pytest.approx(120 / 90)
    old = Timeline(gates=(GateSpan(0, at(0), None, 0),), minutes=((at(0), 600),))
    assert items_per_second(old, at(60 * 10)) is None  # nothing in the last five minutes
    assert items_per_second(Timeline(), at(0)) is None


def test_the_rate_window_ignores_older_minutes() -> None:
    minutes = tuple((at(60 * n), 10 if n < 5 else 100) for n in range(10))
    timeline = Timeline(gates=(GateSpan(0, at(0), None, 0),), minutes=minutes)
    assert items_per_second(timeline, at(600)) == pytest.approx(500 / 300)


@pytest.mark.parametrize(("remaining", "rate", "eta"), [
    (100, 2.0, 50.0), (0, None, 0.0), (5, None, None), (5, 0.0, None), (1, 4.0, 0.25)])
def test_eta(remaining: int, rate: float | None, eta: float | None) -> None:
    assert eta_seconds(remaining, rate) == eta


def test_the_tally_keeps_what_was_counted_after_a_write_began() -> None:
    tally = DoneTally()
    tally.add(3, at=100.0)
    tally.add(0, at=90.0)
    tally.add(2, at=101.0)
    assert (tally.items, tally.age(104.0)) == (5, 4.0)
    tally.written(3)  # a renewal carried 3; 2 more were counted while it ran
    assert tally.items == 2 and tally.first == 100.0
    tally.written(2)
    assert (tally.items, tally.first, tally.age(200.0)) == (0, None, 0.0)


# -- the clock a close records with ------------------------------------------------------

def test_a_clock_reading_carries_the_database_time_on_for_a_while() -> None:
    reading = ClockReading(max_age=10.0)
    assert reading.now(100.0) is None  # never read
    read = datetime(2026, 11, 27, 12, 0, 0)
    reading.observe(read, at=100.0)
    assert reading.now(100.0) == read
    assert reading.now(102.5) == read + timedelta(seconds=2.5)
    assert reading.now(110.0) == read + timedelta(seconds=10)
    assert reading.now(110.5) is None  # too old: read the database again
    assert reading.now(99.0) is None  # before the reading: not an estimate
