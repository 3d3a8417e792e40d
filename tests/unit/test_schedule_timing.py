"""The pure timing of schedules: cron and interval ticks, daylight-saving changes,
catch-up policies, names and the refusal of bad timing."""

from __future__ import annotations

from datetime import datetime

import pytest

from watcher.errors import InvalidInputError
from watcher.schedules.timing import (
    MAX_CATCH_UP,
    CatchUp,
    check_timing,
    next_tick,
    plan_ticks,
    schedule_name_problem,
    tick_partition_id,
    ticks_back,
)

T0 = datetime(2026, 1, 1)


def _forward(timing, start: datetime, count: int) -> list[datetime]:
    ticks, at = [], start
    for _ in range(count):
        at = next_tick(timing, T0, at)
        ticks.append(at)
    return ticks


# Europe/Berlin: spring forward 2026-03-29 02:00 CET -> 03:00 CEST (01:00 UTC);
# fall back 2026-10-25 03:00 CEST -> 02:00 CET (01:00 UTC).
@pytest.mark.parametrize(("cron", "start", "expected"), [
    # A fixed-time job in the skipped hour runs once, at the jump (03:00 CEST).
    ("30 2 * * *", datetime(2026, 3, 28, 12), [datetime(2026, 3, 29, 1, 0),
                                               datetime(2026, 3, 30, 0, 30)]),
    # A fixed-time job in the repeated hour runs once, at its first occurrence (CEST).
    ("30 2 * * *", datetime(2026, 10, 24, 12), [datetime(2026, 10, 25, 0, 30),
                                                datetime(2026, 10, 26, 1, 30)]),
    # A wildcard-hour job runs by elapsed time: both 02:00s of the repeated hour.
    ("0 * * * *", datetime(2026, 10, 24, 23, 30), [datetime(2026, 10, 25, 0, 0),
                                                   datetime(2026, 10, 25, 1, 0),
                                                   datetime(2026, 10, 25, 2, 0)]),
    # ...and skips the hour that does not exist in spring.
    ("0 * * * *", datetime(2026, 3, 28, 23, 30), [datetime(2026, 3, 29, 0, 0),
                                                  datetime(2026, 3, 29, 1, 0),
                                                  datetime(2026, 3, 29, 2, 0)]),
])
def test_cron_ticks_across_daylight_saving_changes_in_berlin(cron, start, expected) -> None:
    timing = check_timing(cron, "Europe/Berlin", None)
    assert _forward(timing, start, len(expected)) == expected
    # Read backwards (the catch-up's way), the same ticks.
    back = ticks_back(timing, T0, start, expected[-1], 10)
    assert back == list(reversed(expected))


def test_new_york_fixed_time_job_runs_once_in_the_repeated_hour() -> None:
    # 2026-11-01 02:00 EDT -> 01:00 EST: 01:30 local occurs twice.
    timing = check_timing("30 1 * * *", "America/New_York", None)
    assert _forward(timing, datetime(2026, 10, 31, 12), 2) == [
        datetime(2026, 11, 1, 5, 30), datetime(2026, 11, 2, 6, 30)]


def test_interval_ticks_count_from_the_anchor() -> None:
    timing = check_timing(None, None, 1.5)
    assert next_tick(timing, T0, T0) == datetime(2026, 1, 1, 0, 0, 1, 500000)
    assert next_tick(timing, T0, datetime(2026, 1, 1, 0, 0, 3)) == datetime(2026, 1, 1, 0, 0, 4,
                                                                            500000)
    assert ticks_back(timing, T0, T0, datetime(2026, 1, 1, 0, 0, 4), 10) == [
        datetime(2026, 1, 1, 0, 0, 3), datetime(2026, 1, 1, 0, 0, 1, 500000)]


MINUTE = check_timing("* * * * *", None, None)


@pytest.mark.parametrize(("policy", "now", "fire", "passed"), [
    # Down 10 minutes: skip creates the latest, all every one, none nothing.
    (CatchUp.SKIP, datetime(2026, 1, 1, 0, 10, 5), [datetime(2026, 1, 1, 0, 10)], 9),
    (CatchUp.ALL, datetime(2026, 1, 1, 0, 10, 5),
     [datetime(2026, 1, 1, 0, minute) for minute in range(1, 11)], 0),
    (CatchUp.NONE, datetime(2026, 1, 1, 0, 10, 5), [datetime(2026, 1, 1, 0, 10)], 9),
    (CatchUp.NONE, datetime(2026, 1, 1, 0, 10, 59, 999999), [datetime(2026, 1, 1, 0, 10)], 9),
    # A tick seen on time is created under every policy.
    (CatchUp.NONE, datetime(2026, 1, 1, 0, 1, 2), [datetime(2026, 1, 1, 0, 1)], 0),
    (CatchUp.SKIP, datetime(2026, 1, 1, 0, 1, 2), [datetime(2026, 1, 1, 0, 1)], 0),
    # Nothing due.
    (CatchUp.ALL, datetime(2026, 1, 1, 0, 0, 30), [], 0),
])
def test_catch_up_policies(policy, now, fire, passed) -> None:
    plan = plan_ticks(MINUTE, T0, T0, now, policy)
    assert list(plan.fire) == fire
    assert plan.passed == passed
    assert plan.next_at == next_tick(MINUTE, T0, now)
    assert plan.next_at > now


def test_none_passes_a_late_tick_over() -> None:
    daily = check_timing("0 3 * * *", None, None)
    plan = plan_ticks(daily, T0, T0, datetime(2026, 1, 1, 8), CatchUp.NONE)
    assert plan.fire == ()
    assert plan.latest == datetime(2026, 1, 1, 3)
    assert plan.next_at == datetime(2026, 1, 2, 3)


def test_all_is_bounded_to_the_latest_ticks() -> None:
    every = check_timing(None, None, 1)
    now = datetime(2026, 1, 1, 1)  # 3,600 missed ticks
    plan = plan_ticks(every, T0, T0, now, CatchUp.ALL)
    assert len(plan.fire) == MAX_CATCH_UP
    assert plan.fire[-1] == now
    assert plan.fire[0] == datetime(2026, 1, 1, 0, 43, 21)
    assert plan.passed == 1  # "more than the bound": counted as one past it


@pytest.mark.parametrize(("cron", "zone", "every", "says"), [
    ("61 * * * *", None, None, "not a cron expression"),
    ("* * * *", None, None, "five fields"),
    ("0 3 * * *", "Mars/Olympus", None, "unknown time zone"),
    (None, None, 0.5, "from 1 s"),
    (None, None, None, "exactly one"),
    ("0 3 * * *", None, 60, "exactly one"),
    (None, "Europe/Berlin", 60, "--timezone goes with --cron"),
])
def test_bad_timing_is_refused_with_one_line(cron, zone, every, says) -> None:
    with pytest.raises(InvalidInputError, match=says) as raised:
        check_timing(cron, zone, every)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(("name", "ok"), [
    ("nightly", True), ("team.a:report-1_x", True), ("a/b", False), ("", False),
    ("-x", False), (" x", False), ("x" * 224, False), ("x" * 223, True), ("é", False),
])
def test_schedule_names(name, ok) -> None:
    assert (schedule_name_problem(name) is None) == ok


def test_tick_partition_ids() -> None:
    assert tick_partition_id("nightly", datetime(2026, 11, 28, 3)) == "nightly/2026-11-28T03:00:00Z"
    assert tick_partition_id("n", datetime(2026, 1, 1, 0, 0, 1, 250000)) == (
        "n/2026-01-01T00:00:01.25Z")
