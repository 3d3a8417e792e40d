"""What the console's pages show, computed from plain records: progress per gate, ages,
leases, the throughput chart, result previews, error summaries and notices."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

import pytest

from processor.console.views import leases_view, pages, texts
from processor.views import error_after_context
from watcher.records import ItemInfo, PartitionInfo, ReduceProgress
from watcher.reports import RetryReport, Throughput, WaitSummary

NOW = datetime(2026, 5, 1, 12, 0, 0)


def _info(status: str = "available", gate: int = 0, *, owner: str = "", until: datetime = NOW,
          reduce_gates: tuple[int, ...] = (), reduce: ReduceProgress | None = None
          ) -> PartitionInfo:
    return PartitionInfo(id="p", status=status, gate=gate, owner=owner, until=until, version=1,
                         created_at=NOW - timedelta(minutes=5), updated_at=NOW - timedelta(
                             seconds=3), reduce_gates=reduce_gates, reduce=reduce)


def _by_gate(progress: list[pages.GateProgress]) -> dict[int, tuple[int, int, int, int, str]]:
    return {row.gate: (row.done, row.waiting, row.failed, row.not_reached, row.state)
            for row in progress}


def test_progress_of_a_fan_in_with_skipped_failures() -> None:
    # The demo's end: 34 complete at the reduce gate 1, 2 failed at gate 0, "continue".
    counts = {0: {"failed": 2}, 1: {"complete": 34}}
    progress = pages.gate_progress(_info("complete", 1, reduce_gates=(1,)), counts)
    assert _by_gate(progress) == {0: (34, 0, 2, 0, "passed"), 1: (34, 0, 2, 0, "complete")}
    assert [row.reduce for row in progress] == [False, True]
    assert all(row.total == 36 for row in progress)
    assert progress[0].summary == "34/36 done, 2 failed"


def test_progress_while_the_first_gate_drains() -> None:
    counts = {0: {"available": 6, "failed": 1}, 1: {"available": 3}, 2: {"complete": 2}}
    progress = pages.gate_progress(_info("available", 0), counts)
    assert _by_gate(progress) == {
        0: (5, 6, 1, 0, "current"),   # 3 at gate 1 and 2 complete have passed it
        1: (2, 3, 1, 6, "ahead"),     # the failed one failed before gate 1
        2: (2, 0, 1, 9, "ahead"),
    }
    first = progress[0]
    assert first.segments == [("done", 0.0, 41.67), ("failed", 41.67, 8.33),
                              ("waiting", 50.0, 50.0), ("parked", 100.0, 0.0)]
    assert first.summary == "5/12 done, 6 waiting, 1 failed"


@pytest.mark.parametrize(("status", "state"), [
    ("failed", "failed"), ("cancelled", "cancelled"), ("available", "current"),
    ("deleting", "current"), ("complete", "complete")])
def test_the_partitions_own_gate_says_how_it_stands(status: str, state: str) -> None:
    [row] = pages.gate_progress(_info(status, 0), {0: {"available": 1}})
    assert row.state == state


def test_gates_are_dense_while_few_and_sparse_beyond() -> None:
    assert pages.shown_gates(1, (), {1: {"complete": 3}}) == [0, 1]
    assert pages.shown_gates(0, (3,), {}) == [0, 1, 2, 3]
    assert pages.shown_gates(100, (5,), {0: {}, 100: {}}) == [0, 5, 100]


def test_a_partition_without_items_shows_empty_bars() -> None:
    [row] = pages.gate_progress(_info(), {})
    assert (row.total, row.percent("done"), row.summary) == (0, 0.0, "0/0 done")


def test_list_rows_keep_the_gates_around_the_current_one() -> None:
    progress = pages.gate_progress(_info("available", 12), {gate: {"available": 1}
                                                           for gate in range(15)})
    shown, more = pages.list_gates(progress, 12)
    assert [row.gate for row in shown] == list(range(7, 15)) and more == 7
    shown, more = pages.list_gates(progress[:5], 3)
    assert len(shown) == 5 and more == 0
    shown, _ = pages.list_gates(progress, 0)
    assert [row.gate for row in shown] == list(range(8))


def test_partition_row_adds_up_the_items() -> None:
    row = pages.partition_row(_info(owner="w1", until=NOW + timedelta(seconds=9)),
                              {0: {"available": 2, "failed": 1}, 1: {"complete": 4}}, NOW)
    assert row.counts == {"available": 2, "failed": 1, "complete": 4} and row.total == 7
    assert (row.age, row.updated, row.step) == ("5 min", "3 s", "items")
    assert row.lease == leases_view.Lease("held", "w1", 9)


def _naive_progress(info: PartitionInfo, counts: dict[int, dict[str, int]]
                    ) -> list[tuple[int, int, int, int, int, int]]:
    # The definition, gate by gate over every count (quadratic): what the fast pass must
    # agree with.
    complete = sum(s.get("complete", 0) for s in counts.values())
    rows = []
    for gate in pages.shown_gates(info.gate, info.reduce_gates, counts):
        later = sum(s.get("available", 0) + s.get("waiting", 0) + s.get("failed", 0)
                    for at, s in counts.items() if at > gate)
        failed = sum(s.get("failed", 0) for at, s in counts.items() if at <= gate)
        not_reached = sum(s.get("available", 0) + s.get("waiting", 0)
                          for at, s in counts.items() if at < gate)
        rows.append((gate, complete + later, counts.get(gate, {}).get("available", 0),
                     counts.get(gate, {}).get("waiting", 0), failed, not_reached))
    return rows


@pytest.mark.parametrize("seed", range(40))
def test_progress_agrees_with_its_definition_on_random_partitions(seed: int) -> None:
    rng = random.Random(seed)
    spread = rng.choice([3, 15, 40, 500])
    counts: dict[int, dict[str, int]] = {}
    for _ in range(rng.randint(0, 60)):
        by_status = counts.setdefault(rng.randrange(spread), {})
        status = rng.choice(["available", "complete", "failed", "waiting"])
        by_status[status] = by_status.get(status, 0) + rng.randint(1, 5)
    gate = rng.randrange(spread)
    info = _info(rng.choice(["available", "failed", "complete"]), gate,
                 reduce_gates=tuple(rng.sample(range(spread), rng.randint(0, 2))))
    expected = _naive_progress(info, counts)
    got = [(r.gate, r.done, r.waiting, r.parked, r.failed, r.not_reached)
           for r in pages.gate_progress(info, counts)]
    assert got == expected
    assert all(r.total == sum(map(sum, (s.values() for s in counts.values())))
               for r in pages.gate_progress(info, counts))
    # A list row shows a window of the same rows, around the partition's gate.
    row = pages.partition_row(info, counts, NOW)
    window, more = pages.list_gates(pages.gate_progress(info, counts), info.gate)
    assert [(r.gate, r.done, r.failed) for r in row.gates] == [
        (r.gate, r.done, r.failed) for r in window]
    assert row.more_gates == more == max(0, len(expected) - pages.LIST_GATES)
    full = pages.partition_row(info, counts, NOW, all_gates=True)
    assert [(r.gate, r.done, r.waiting, r.parked, r.failed, r.not_reached)
            for r in full.gates] == expected


class _CountedReads(dict):
    """A gate's counts by status that count every read of a status: the work done."""

    reads = 0

    def get(self, key, default=None):
        _CountedReads.reads += 1
        return super().get(key, default)

    def __getitem__(self, key):
        _CountedReads.reads += 1
        return super().__getitem__(key)


@pytest.mark.parametrize("all_gates", [False, True], ids=["list row", "partition page"])
def test_a_page_costs_a_pass_over_the_gates_not_their_square(all_gates: bool) -> None:
    gates = 4000
    counts = {gate: _CountedReads(available=1, failed=gate % 2, complete=1)
              for gate in range(gates)}
    info = _info("available", 2000)
    _CountedReads.reads = 0
    row = pages.partition_row(info, counts, NOW, all_gates=all_gates)
    # A few reads per gate; the quadratic way made about 3 x 4000 x 4000.
    assert _CountedReads.reads <= 10 * gates, _CountedReads.reads
    assert len(row.gates) == (gates if all_gates else pages.LIST_GATES)
    middle = next(r for r in row.gates if r.gate == 2000)
    assert (middle.waiting, middle.failed, middle.not_reached) == (1, 1000, 2000)
    assert middle.done == gates + 1999 + 1000  # complete + open items beyond gate 2000


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0 s"), (59, "59 s"), (60, "1 min"), (3599, "59 min"), (7200, "2 h"),
    (3 * 86400 + 5, "3 d"), (-30, "0 s")])
def test_age_text(seconds: int, text: str) -> None:
    assert texts.age_text(NOW - timedelta(seconds=seconds), NOW) == text
    assert texts.age_text(None, NOW) == "-"


def test_leases() -> None:
    assert leases_view.lease_of(_info(owner="w", until=NOW + timedelta(seconds=5)), NOW) == \
        leases_view.Lease("held", "w", 5)
    assert leases_view.lease_of(_info(owner="w", until=NOW - timedelta(seconds=5)), NOW).state == \
        "expired"
    assert leases_view.lease_of(_info(), NOW).state == "none"
    assert leases_view.lease_of(_info("complete", owner="w"), NOW).state == "stopped"


# -- parked partitions: items waiting for a completion -------------------------------

IN_2H = NOW + timedelta(hours=2, minutes=5)


def _waits(deadline: datetime | None, **by_gate: int) -> WaitSummary:
    return WaitSummary({int(gate[1:]): count for gate, count in by_gate.items()}, 30.0,
                       deadline)


@pytest.mark.parametrize(("status", "counts", "deadline", "expected"), [
    # Every unfinished item parked: the whole partition is, its next deadline in 2 h.
    ("available", {0: {"waiting": 3}}, IN_2H,
     (3, {0: 3}, True, "parked: 3 items waiting for completion, next deadline in 2 h")),
    ("available", {0: {"complete": 5}, 1: {"waiting": 1, "failed": 1}}, IN_2H,
     (1, {1: 1}, True, "parked: 1 item waiting for completion, next deadline in 2 h")),
    # A deadline that has come: a processor takes it up now.
    ("available", {0: {"waiting": 2}}, NOW - timedelta(seconds=1),
     (2, {0: 2}, True, "parked: 2 items waiting for completion, next deadline now: a "
                       "processor takes it up")),
    ("available", {0: {"waiting": 2}}, None,
     (2, {0: 2}, True, "parked: 2 items waiting for completion, no deadline")),
    # Some parked beside items ready to run: the partition is not parked as a whole.
    ("available", {0: {"waiting": 2, "available": 1}, 2: {"waiting": 1}}, IN_2H,
     (3, {0: 2, 2: 1}, False, "3 items waiting for completion, next deadline in 2 h")),
])
def test_parked_items_of_a_partition(status: str, counts: dict[int, dict[str, int]],
                                     deadline: datetime | None,
                                     expected: tuple[int, dict[int, int], bool, str]) -> None:
    parked = leases_view.parked_of(_info(status), counts, _waits(deadline, g0=1), NOW)
    assert parked is not None
    assert (parked.items, parked.by_gate, parked.whole, parked.text) == expected


@pytest.mark.parametrize(("status", "counts"), [
    ("available", {0: {"available": 3}}), ("available", {}),
    ("cancelled", {0: {"waiting": 3}}),  # a cancel ends the waits: nothing is parked
    ("complete", {0: {"complete": 3}})])
def test_nothing_is_parked(status: str, counts: dict[int, dict[str, int]]) -> None:
    assert leases_view.parked_of(_info(status), counts, None, NOW) is None


def test_a_parked_partition_is_parked_not_waiting_for_a_processor() -> None:
    counts = {0: {"waiting": 3}}
    row = pages.partition_row(_info(), counts, NOW, waits=_waits(IN_2H, g0=3))
    assert row.lease == leases_view.Lease(
        "parked", "", 0, "parked: 3 items waiting for completion, next deadline in 2 h")
    assert row.step == "parked"
    assert row.parked is not None and row.parked.sentence.startswith("Parked: 3 items")
    # Its progress counts the parked items: not an empty (or full) bar of 0/0.
    [gate] = row.gates
    assert (gate.done, gate.parked, gate.total, gate.summary) == (0, 3, 3,
                                                                  "0/3 done, 3 parked")
    assert ("parked", 0.0, 100.0) in gate.segments
    # A live lease, or items ready beside the parked ones, keep the lease as it is.
    held = _info(owner="w1", until=NOW + timedelta(seconds=9))
    assert pages.partition_row(held, counts, NOW).lease == leases_view.Lease("held", "w1", 9)
    assert pages.partition_row(_info(), {0: {"waiting": 3, "available": 1}}, NOW
                               ).lease.state == "none"
    expired = _info(owner="w1", until=NOW - timedelta(seconds=1))
    assert pages.partition_row(expired, counts, NOW).lease.state == "parked"


@pytest.mark.parametrize(("open_partitions", "ready", "parked", "kind"), [
    (0, 0, 0, "idle"), (2, 0, 3, "parked"), (2, 5, 3, "unserved"), (1, 4, 0, "unserved"),
    # Open, nothing ready and nothing parked (a reduce to run): a processor is needed.
    (1, 0, 0, "unserved")])
def test_the_overview_says_why_no_processor_holds_a_lease(
        open_partitions: int, ready: int, parked: int, kind: str) -> None:
    note = leases_view.lease_note(open_partitions, ready, parked)
    assert note.kind == kind
    assert ("Start one" in note.text) == (kind == "unserved")
    if kind == "parked":
        assert "3 items waiting for completion" in note.text


def test_a_waiting_items_row_says_its_deadline() -> None:
    item = ItemInfo("p", "invoice-7", "waiting", 1, b"", 0, None, 2, retry_at=IN_2H)
    assert leases_view.waiting_row(item, NOW) == leases_view.WaitingRow(
        "invoice-7", 1, "2026-05-01 14:05:00 UTC", "in 2 h")
    unbounded = ItemInfo("p", "invoice-8", "waiting", 1, b"", 0, None, 2)
    assert leases_view.waiting_row(unbounded, NOW).deadline == "none"


def test_steps() -> None:
    assert pages.step_of(_info()) == "items"
    assert pages.step_of(_info(reduce=ReduceProgress("fold", 3, 1))) == \
        "reduce fold page 3 (1 failed)"
    assert pages.step_of(_info("failed")) == "failed"


def test_counts_say_when_they_reached_their_cap() -> None:
    assert texts.count_text(1234, 100_000) == "1,234"
    assert texts.count_text(100_000, 100_000) == "100,000+"


def test_throughput_bars_scale_to_the_busiest_minute() -> None:
    bars = pages.throughput_bars(Throughput(3, {"complete": (0, 4, 1), "failed": (0, 4, 0),
                                               "cancelled": (0, 0, 1)}))
    assert [bar.label for bar in bars] == ["-2 min", "-1 min", "now"]
    assert [bar.total for bar in bars] == [0, 8, 2]
    assert bars[1].heights == {"complete": 50.0, "failed": 50.0, "cancelled": 0.0}
    # Stacked from the bottom (y grows downwards): complete lowest.
    assert bars[1].stack == [("complete", 50.0, 50.0), ("failed", 0.0, 50.0),
                             ("cancelled", 0.0, 0.0)]
    empty = pages.throughput_bars(Throughput(2, {}))
    assert [bar.total for bar in empty] == [0, 0] and empty[0].heights["complete"] == 0.0


def test_result_previews() -> None:
    preview = pages.result_preview(b'{"top": ["a", "b"]}')
    assert preview.is_json and preview.text == '{\n  "top": [\n    "a",\n    "b"\n  ]\n}'
    assert (preview.size, preview.truncated) == (19, False)
    raw = pages.result_preview(b"\xff\xfe plain", limit=4)
    assert not raw.is_json and raw.truncated and raw.text == "\ufffd\ufffd p"


def test_error_summaries() -> None:
    assert pages.error_summary(None) == ("", False)
    assert pages.error_summary("boom") == ("boom", False)
    assert pages.error_summary("boom\n  at line 2") == ("boom", True)
    assert pages.error_summary("x" * 200, limit=10) == ("x" * 10, True)


def test_notices_come_only_from_their_own_words() -> None:
    assert pages.notice_text("deleted", id="<b>x</b>", count=2) == \
        "Deleted partition <b>x</b> and its 2 item(s)."  # the template escapes it
    assert pages.notice_text("made-up") is None and pages.notice_text(None) is None
    assert pages.notice_text("cancelled", count=1) is not None
    assert pages.notice_text("deleted") is None  # a value missing: nothing shown


def test_the_retry_notice_says_what_the_retry_did() -> None:
    report = RetryReport("job", "complete", 2, "available", 0, items_reset=2, items_rerun=34,
                         reduce_rearmed=False)
    params = {name: str(value) for name, value in pages.retry_notice_params(report).items()}
    assert pages.retry_notice("job", params) == (
        "Retried: re-opened partition 'job' (complete at gate 2) at gate 0; 2 failed item(s) "
        "reset, 34 item(s) back at their reduce gate to be reduced again.")
    nothing = RetryReport("job", "complete", 1, "complete", 1)
    params = {name: str(value) for name, value in pages.retry_notice_params(nothing).items()}
    assert pages.retry_notice("job", params) == (
        "Retried: partition 'job' is complete at gate 1; nothing to retry: no item of it "
        "failed.")
    running = RetryReport("job", "available", 3, "available", 3, items_left_failed=2)
    params = {name: str(value) for name, value in pages.retry_notice_params(running).items()}
    assert pages.retry_notice("job", params) == (
        "Retried: partition 'job' is available at gate 3; nothing to retry at or after its "
        "gate, 2 failed item(s) below gate 3 left failed while it runs (retry again once it "
        "has stopped).")
    rearmed = RetryReport("job", "failed", 1, "available", 1, reduce_rearmed=True)
    assert rearmed and pages.retry_notice("job", {
        name: str(value) for name, value in pages.retry_notice_params(rearmed).items()}) == (
        "Retried: re-opened partition 'job' (failed at gate 1) at gate 1; 0 failed item(s) "
        "reset, its failed reduce re-armed.")
    # A hand-edited address shows nothing rather than made-up words.
    assert pages.retry_notice("job", {**params, "was": "<b>"}) is None
    assert pages.retry_notice("job", {**params, "count": "many"}) is None
    assert pages.retry_notice("job", {}) is None


def test_an_item_error_shows_without_the_context_its_row_shows() -> None:
    def item(error: str | None, attempts: int = 2) -> ItemInfo:
        return ItemInfo(partition_id="p", id="i'7", status="failed", gate=3, data=b"",
                        attempts=attempts, last_error=error, version=5)

    stored = "partition 'p' item \"i'7\" gate 3 (attempt 2): the handler answered HTTP 422: scan"
    assert error_after_context(item(stored)) == "the handler answered HTTP 422: scan"
    assert pages.item_error_summary(item(stored)) == ("the handler answered HTTP 422: scan",
                                                       True)  # the whole one can be opened
    # Another item's, another attempt's or a library processor's error shows whole.
    for other in (item(stored, attempts=0), item("cannot parse"), item(None)):
        assert error_after_context(other) == other.last_error
    assert pages.item_error_summary(item("cannot parse")) == ("cannot parse", False)
