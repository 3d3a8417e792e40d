"""What the console shows of a partition's timeline and of an item (pure view values)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest

from processor.console.item_page import (
    PREVIEW_BYTES,
    completion_link,
    data_preview,
    history_rows,
)
from processor.console.views.leases_view import parked_of
from processor.console.views.timeline_view import (
    duration_text,
    eta_of,
    gate_times,
    rate_text,
    throughput_chart,
)
from watcher.records import ErrorEntry, PartitionInfo
from watcher.reports import WaitSummary
from watcher.rules.timeline import GateSpan, Timeline

NOW = datetime(2026, 3, 1, 12, 10, 30)


def info(gate: int = 1, status: str = "available", reduce_gates: tuple[int, ...] = ()
         ) -> PartitionInfo:
    return PartitionInfo(id="p", status=status, gate=gate, owner="w", until=NOW, version=3,
                         counts={}, reduce_gates=reduce_gates)


RUNNING = Timeline(gates=(GateSpan(0, NOW - timedelta(minutes=4), NOW - timedelta(minutes=2),
                                   120), GateSpan(1, NOW - timedelta(minutes=2), None, 60)),
                   minutes=tuple((NOW.replace(second=0) - timedelta(minutes=back), 45)
                                 for back in range(3, -1, -1)))


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "—"), (0.42, "0.4 s"), (42, "42 s"), (250, "4 min 10 s"), (240, "4 min"),
    (7500, "2 h 5 min"), (3 * 86400 + 4 * 3600 + 5, "3 d 4 h")])
def test_durations(seconds: float | None, text: str) -> None:
    assert duration_text(seconds) == text


def test_rates() -> None:
    assert [rate_text(rate) for rate in (None, 1234.5, 0.04)] == ["—", "1,234.5/s", "0.04/s"]


def test_the_chart_has_a_column_per_minute_up_to_now() -> None:
    chart = throughput_chart(RUNNING, NOW, minutes=6)
    assert [column.items for column in chart.columns] == [0, 0, 45, 45, 45, 45]
    assert [column.label for column in chart.columns][-2:] == ["-1 min", "now"]
    assert (chart.peak, chart.total, chart.columns[-1].height) == (45, 180, 100.0)
    assert throughput_chart(Timeline(), NOW, minutes=3).columns[0].height == 0.0


def test_time_per_gate_lists_the_latest_first() -> None:
    current, first = gate_times(RUNNING, NOW)
    assert (current.gate, current.took, current.items, current.current) == (
        1, "2 min so far", 60, True)
    assert (first.gate, first.began, first.took, first.rate) == (0, "4 min ago", "2 min",
                                                                 "1.0/s")
    unknown = gate_times(Timeline(gates=(GateSpan(3, None, NOW, 5),)), NOW)[0]
    assert (unknown.began, unknown.took, unknown.rate) == ("—", "—", "—")


def test_the_eta_says_what_it_covers() -> None:
    counts = {1: {"available": 90, "complete": 30}}
    last = eta_of(info(), counts, RUNNING, NOW)
    # 180 items over the 3.5 minutes since 12:07:00 (the window's start)
    assert last.text == "1 min 45 s"
    assert last.covers.startswith("the whole partition: gate 1 is its last gate")
    assert last.rate == "0.86/s over the last 5 min"
    ahead = eta_of(info(), {**counts, 4: {"available": 10}}, RUNNING, NOW)
    assert ahead.covers == "the 90 item(s) waiting at gate 1"
    assert eta_of(info(reduce_gates=(2,)), counts, RUNNING, NOW).covers.startswith("the 90")
    assert eta_of(info(), counts, Timeline(), NOW).text == "—"
    assert eta_of(info(status="complete"), counts, RUNNING, NOW).covers == \
        "nothing: the partition is complete"
    assert eta_of(info(reduce_gates=(1,)), counts, RUNNING, NOW).text == "—"


def test_a_parked_partition_has_no_eta() -> None:
    counts = {1: {"waiting": 3, "complete": 2}}
    deadline = NOW + timedelta(hours=3)
    parked = parked_of(info(), counts, WaitSummary({1: 3}, 5.0, deadline), NOW)
    eta = eta_of(info(), counts, RUNNING, NOW, parked)
    assert eta.text == "none while parked"
    assert eta.covers == ("no ETA: it goes on as completions come; 3 items waiting for "
                          "completion, next deadline in 3 h")
    # Parked beside ready items: the ETA covers the ready ones and says what it leaves out.
    mixed = {1: {"waiting": 3, "available": 90}}
    eta = eta_of(info(), mixed, RUNNING, NOW, parked_of(info(), mixed, None, NOW))
    assert eta.text != "none while parked" and "90" in eta.covers
    assert eta.covers.endswith("left out (no rate foretells a completion): 3 items waiting "
                               "for completion, no deadline")


def test_json_data_is_indented_and_other_data_is_a_hex_dump() -> None:
    shown = data_preview(json.dumps({"a": [1, "<b>"]}).encode())
    assert (shown.kind, shown.truncated) == ("JSON", False)
    assert shown.text == '{\n  "a": [\n    1,\n    "<b>"\n  ]\n}'
    raw = bytes(range(256)) * 8
    cut = data_preview(raw)
    assert (cut.kind, cut.size, cut.truncated) == ("hex", 2048, True)
    assert cut.text.splitlines()[0] == "00000000  " + " ".join(f"{n:02x}" for n in range(16))
    assert len(cut.text.splitlines()) == PREVIEW_BYTES // 16
    whole = data_preview(raw, show_all=True)
    assert not whole.truncated and whole.text.splitlines()[-1].startswith("000007f0  f0")
    assert data_preview(b"\xff\xfe{").kind == "hex"


def test_the_error_history_is_shown_latest_first() -> None:
    entries = (ErrorEntry(NOW - timedelta(minutes=3), 1, 0, "busy"),
               ErrorEntry(NOW - timedelta(seconds=5), 2, 0, "gone"))
    rows = history_rows(entries, NOW)
    assert [(row.attempt, row.error, row.ago) for row in rows] == [(2, "gone", "5 s"),
                                                                  (1, "busy", "3 min")]
    assert rows[0].at == "2026-03-01 12:10:25 UTC"


@pytest.mark.parametrize(("api_url", "value", "label", "whole"), [
    ("https://api.example.com", "https://api.example.com/v1/completions/t%2Fk", "Completion URL",
     True),
    (None, "/v1/completions/t%2Fk", "Completion path (not a whole URL)", False),
    ("", "/v1/completions/t%2Fk", "Completion path (not a whole URL)", False)])
def test_a_completion_link_is_a_url_or_says_it_is_a_path(
        api_url: str | None, value: str, label: str, whole: bool) -> None:
    link = completion_link(api_url, "t/k")
    assert (link.value, link.label, link.is_url) == (value, label, whole)
    if not whole:  # what to set, next to the path
        assert "--api-url" in link.note and "PROCESSOR_CONSOLE_API_URL" in link.note
