"""The live feed's pure parts: event ids, the SSE text both ways, the per-gate bars'
numbers, a watch's replay for a resuming client, and the end line ``processor watch``
prints."""

from __future__ import annotations

import pytest

from processor.feed.events import (
    BadEventIdError,
    EventId,
    Snapshot,
    counts_event,
    end_events,
    gate_event,
    gates_view,
    parse_stream,
    state_event,
)
from processor.feed.hub import FeedSettings, GateMove, Subscriber, Watch
from processor.feed.view import end_line
from watcher.errors import ConfigError


@pytest.mark.parametrize("text", ["12:3", "12:3:c7", "9:0:r", "9:0:e", "0:0"])
def test_event_ids_round_trip(text: str) -> None:
    assert str(EventId.parse(text)) == text


@pytest.mark.parametrize("text", ["", "12", "12:", ":3", "a:b", "1:2:x", "1:2:c", " 1:2",
                                  "1" * 19 + ":0", "1:2:e\n"])
def test_other_ids_are_refused_with_one_line(text: str) -> None:
    with pytest.raises(BadEventIdError, match="Last-Event-ID"):
        EventId.parse(text)


def test_only_the_end_id_says_the_end_was_had() -> None:
    assert EventId.parse("5:2:e").ended
    assert not EventId.parse("5:2:r").ended and not EventId.parse("5:2").ended


def test_frames_read_back_as_they_were_written() -> None:
    snapshot = Snapshot("p", "complete", 2, 9, {2: {"complete": 3}}, b'{"n": 1}', None)
    events = [state_event(snapshot), gate_event(8, 1, 2), counts_event(snapshot, 4),
              *end_events(snapshot)]
    text = b": keep-alive\n\nretry: 2000\n\n" + b"".join(event.frame() for event in events)
    read = list(parse_stream(text.decode().split("\n")))
    assert [(event.kind, event.id) for event in read] == [
        ("state", "9:2"), ("gate", "8:2"), ("counts", "9:2:c4"), ("result", "9:2:r"),
        ("end", "9:2:e")]
    assert [event.json() for event in read] == [dict(event.data) for event in events]
    assert read[3].json() == {"size": 8, "truncated": False, "result": {"n": 1}}


def test_data_lines_join_and_unknown_fields_are_ignored() -> None:
    lines = ["event: x", "data: a", "data: b", "other: 1", "id: 1:1", "", "data: c", ""]
    read = list(parse_stream(lines))
    assert [(event.kind, event.id, event.data) for event in read] == [
        ("x", "1:1", "a\nb"), ("message", None, "c")]


def test_a_big_result_is_announced_by_its_size() -> None:
    snapshot = Snapshot("p", "complete", 0, 1, {}, b"x" * (64 * 1024 + 1))
    result, end = end_events(snapshot)
    assert result.data == {"size": 64 * 1024 + 1, "truncated": True}
    assert end.data["status"] == "complete"
    failed = end_events(Snapshot("p", "failed", 1, 2, {}, None, "boom"))
    assert [event.kind for event in failed] == ["end"]
    assert failed[0].data["last_error"] == "boom"


def test_a_gates_bar_counts_what_passed_it() -> None:
    rows = gates_view({0: {"complete": 1, "available": 2, "failed": 1}, 2: {"available": 3}})
    assert rows == [
        {"gate": 0, "items": {"available": 2, "complete": 1, "failed": 1}, "total": 7,
         "passed": 5},
        {"gate": 2, "items": {"available": 3}, "total": 3, "passed": 0}]
    assert gates_view({}) == []


def watch_at(version: int, gate: int, *moves: GateMove) -> Watch:
    watch = Watch(Snapshot("p", "available", gate, version), EventId(version, gate))
    watch.journal.extend(moves)
    return watch


def test_a_resume_replays_the_moves_after_its_id_and_none_before() -> None:
    watch = watch_at(3, 0, GateMove(5, 0, 1), GateMove(8, 1, 4), GateMove(9, 4, 2))
    assert [(e.data["from"], e.data["to"]) for e in watch.replay(EventId(5, 1))] == [
        (1, 4), (4, 2)]
    assert [str(e.id) for e in watch.replay(EventId(5, 1, "c3"))] == ["8:4", "9:2"]
    assert watch.replay(EventId(9, 2)) == []
    assert len(watch.replay(EventId(3, 0))) == 3


def test_a_resume_from_before_the_watch_marks_the_moves_it_never_saw() -> None:
    watch = watch_at(10, 3, GateMove(12, 3, 4))
    replayed = watch.replay(EventId(4, 1))
    assert [(e.data["from"], e.data["to"], e.data["gap"]) for e in replayed] == [
        (1, 3, True), (3, 4, False)]
    # The same gate as the watch began at: nothing was missed that can be told.
    assert [e.data["gap"] for e in watch.replay(EventId(4, 3))] == [False]


def test_a_subscriber_never_holds_more_than_its_queue_and_one_counts() -> None:
    subscriber = Subscriber(queue_size=4)
    snapshot = Snapshot("p", "available", 0, 1, {0: {"available": 1}})
    for n in range(10):
        subscriber.push(gate_event(n, n, n + 1))
        subscriber.offer_counts(counts_event(snapshot, n))
    assert len(subscriber.queue) == 4 and subscriber.cut_off
    counts = subscriber.take_counts()
    assert counts is not None and str(counts.id) == "1:0:c9"
    assert subscriber.take_counts() is None


@pytest.mark.parametrize("options", [{"poll_interval": 0}, {"heartbeat": 0.01},
                                     {"max_clients": 0}, {"queue_size": 2},
                                     {"linger": -1}, {"max_clients": 1.5}])
def test_feed_settings_out_of_range_are_refused(options: dict) -> None:
    with pytest.raises(ConfigError, match="feed"):
        FeedSettings(**options)


def test_the_end_line_says_how_it_ended() -> None:
    assert end_line("job", {"status": "complete", "gate": 2, "counts": {"complete": 4}},
                    {"size": 7, "result": {"n": 1}}) == (
        "partition 'job' is complete at gate 2 (items: complete 4); result {\"n\":1}")
    assert end_line("job", {"status": "failed", "gate": 1, "counts": {"failed": 1},
                            "last_error": "boom"}, None) == (
        "partition 'job' failed at gate 1 (items: failed 1): boom")
    assert "result of 99999 bytes" in end_line(
        "job", {"status": "complete", "gate": 0, "counts": {}},
        {"size": 99999, "truncated": True})
