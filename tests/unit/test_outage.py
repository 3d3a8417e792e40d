"""The handler outage rule (processor/http/outage.py) as a table of call outcomes, on a
clock the test moves: no I/O, no sleeping."""

from __future__ import annotations

import json

import pytest

from processor.http.outage import (
    MIN_FAILED_CALLS,
    MIN_OUTAGE_SECONDS,
    OutageEnded,
    OutageStarted,
    OutageTracker,
    answered_by_handler,
)
from processor.wire.values import Reply
from watcher.errors import ConfigError

URL = "http://handler:8000/"

# One call per step: ("x", started, ended) unanswered, ("ok", started, ended) answered;
# the events logged, in order.
Steps = list[tuple[str, float, float]]


def run(steps: Steps, tracker: OutageTracker | None = None
        ) -> list[OutageStarted | OutageEnded]:
    tracker = tracker or OutageTracker()
    events: list[OutageStarted | OutageEnded] = []
    for kind, started, ended in steps:
        event = (tracker.unanswered(URL, "refused", started=started, ended=ended)
                 if kind == "x" else tracker.answered(ended=ended))
        if event is not None:
            events.append(event)
    return events


def test_the_defaults_are_the_documented_rule() -> None:
    assert (MIN_FAILED_CALLS, MIN_OUTAGE_SECONDS) == (3, 2.0)


def test_an_outage_starts_once_and_ends_at_the_first_answer() -> None:
    steps: Steps = [("x", 0.0, 0.0), ("x", 0.5, 0.5), ("x", 1.0, 1.0), ("x", 2.0, 2.0),
                    ("x", 3.0, 3.0), ("x", 4.0, 4.0), ("ok", 5.0, 5.5), ("ok", 6.0, 6.0)]
    assert run(steps) == [OutageStarted(URL, "refused", failed_calls=4, seconds=2.0),
                          OutageEnded(URL, failed_calls=6, seconds=5.5)]


def test_a_burst_in_one_instant_is_no_outage_yet() -> None:
    # Fifty calls refused at once (a restart, a concurrency of 50), then answers.
    steps: Steps = [("x", 0.0, 0.01)] * 50 + [("ok", 0.5, 0.6)]
    assert run(steps) == []


def test_a_slow_failure_counts_from_the_start_of_its_call() -> None:
    # Three calls time out together after 30 s: no answer for 30 s, an outage at once.
    steps: Steps = [("x", 0.0, 30.0), ("x", 0.1, 30.1), ("x", 0.2, 30.2)]
    [started] = run(steps)
    assert isinstance(started, OutageStarted)
    assert (started.failed_calls, started.seconds) == (3, pytest.approx(30.2))


def test_two_failures_in_a_row_are_too_few_however_long() -> None:
    assert run([("x", 0.0, 0.0), ("x", 60.0, 60.0), ("ok", 61.0, 61.0)]) == []


def test_one_replica_of_three_down_never_makes_an_outage() -> None:
    # Every third call refused, a call every 10 ms: never 2 s without an answer.
    steps: Steps = [("x" if n % 3 == 0 else "ok", n / 100, n / 100) for n in range(1000)]
    assert run(steps) == []


def test_an_answer_resets_the_count_before_an_outage() -> None:
    steps: Steps = [("x", 0.0, 0.0), ("x", 1.0, 1.0), ("ok", 1.5, 1.5), ("x", 2.5, 2.5),
                    ("x", 3.5, 3.5), ("x", 4.0, 4.0), ("x", 4.6, 4.6)]
    [started] = run(steps)
    assert started == OutageStarted(URL, "refused", failed_calls=4, seconds=pytest.approx(2.1))


def test_a_second_outage_is_logged_again() -> None:
    down: Steps = [("x", 0.0, 0.0), ("x", 1.0, 1.0), ("x", 2.0, 2.0)]
    later: Steps = [("x", t, t) for t in (10.0, 11.0, 12.0)]
    events = run([*down, ("ok", 3.0, 3.0), *later, ("ok", 13.0, 13.0)])
    assert [type(event) for event in events] == [OutageStarted, OutageEnded] * 2
    assert events[3] == OutageEnded(URL, failed_calls=3, seconds=3.0)


def test_the_tracker_says_whether_it_is_down() -> None:
    tracker = OutageTracker(min_failed_calls=1, min_seconds=0)
    assert not tracker.down
    assert tracker.unanswered(URL, "refused", started=0, ended=0) is not None
    assert tracker.down and tracker.failed_calls == 1
    assert tracker.unanswered(URL, "refused", started=1, ended=1) is None  # counted only
    assert tracker.answered(ended=2) == OutageEnded(URL, failed_calls=2, seconds=2.0)
    assert not tracker.down and tracker.failed_calls == 0


@pytest.mark.parametrize(("failed_calls", "seconds"), [(0, 1.0), (1.5, 1.0), (True, 1.0),
                                                       (3, -1.0), (3, float("nan"))])
def test_a_bad_rule_is_refused(failed_calls: object, seconds: object) -> None:
    with pytest.raises(ConfigError):
        OutageTracker(min_failed_calls=failed_calls, min_seconds=seconds)  # type: ignore[arg-type]


def _error(status: int) -> Reply:
    return Reply(status, None, json.dumps({"error": {"message": "x", "no_retry": False}})
                 .encode())


@pytest.mark.parametrize(("reply", "answered"), [
    (Reply(200, None, b'{"done": true}'), True),
    (Reply(200, None, b""), True),
    (Reply(404, None, b"<html>not found</html>"), True),
    (Reply(422, None, b'{"error": "no"}'), True),
    (_error(500), True),  # the handler's own bug answer: it is up
    (_error(503), True),  # the handler's Retry
    (Reply(502, None, b"<html>bad gateway</html>"), False),  # a proxy's page
    (Reply(503, "5", b""), False),
    (Reply(504, None, None), False),  # over the size limit: no error object read
    (Reply(500, None, b"Internal Server Error"), False),
    (Reply(500, None, b'{"detail": "x"}'), False),
    (Reply(500, None, b'{"error": null}'), False),
])
def test_answered_by_handler(reply: Reply, answered: bool) -> None:
    assert answered_by_handler(reply) is answered
