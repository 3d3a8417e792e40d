"""The pure reduce decisions: page cuts, plans, and what an answer writes."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from watcher.protocol import ReduceResult, Result
from watcher.records import ReduceEntry, ReduceState
from watcher.rules.reduce import (
    MAX_ACCUMULATOR_BYTES,
    PageLimits,
    ReduceAnswerError,
    cut_page,
    item_bytes,
    largest_envelope,
    page_problem,
    plan_reduce,
    reduce_call,
    reduce_key,
    reduce_request_bytes,
    reduce_step,
)
from watcher.rules.reduce import _entry_bound as _entry_bound

GATE = 1


def entry(item_id: str, *, status: str = "available", size: int = 1, gate: int = GATE,
          version: int = 3) -> ReduceEntry:
    return ReduceEntry(item_id, version, gate, status, b"x" * size,
                       "boom" if status == "failed" else None)


def state(pass_: str | None = None, page: int = 0, after: str | None = None,
          accumulator: bytes | None = None) -> ReduceState:
    return ReduceState(7, GATE, pass_, page, after, accumulator, 0)


# What an item of no data costs in a request: ids "i0".."i9" all have one length.
ONE = item_bytes("i0", "available", GATE, None, 0)
# Three items of no data, their two commas, and 300 bytes of data (400 as base64).
LIMITS = PageLimits(items=3, request_bytes=3 * ONE + 2 + 400)


@pytest.mark.parametrize(("sizes", "page_len", "more"), [
    ([], 0, False),
    ([0, 0, 0], 3, False),
    ([0, 0, 0, 0], 3, True),  # the item limit
    ([300, 300], 1, True),  # the second would pass the byte limit
    ([150, 150, 0], 3, False),  # exactly at the byte limit
    ([150, 150, 3], 2, True),  # three bytes (four as base64) over it
    ([3000], 1, False),  # one item over the limit still makes a page
    ([3000, 0], 1, True),
])
def test_cut_page_counts_the_request_as_encoded(sizes: list[int], page_len: int,
                                                more: bool) -> None:
    entries = [entry(f"i{n}", size=size) for n, size in enumerate(sizes)]
    page, has_more = cut_page(entries, LIMITS)
    assert [e.id for e in page] == [e.id for e in entries[:page_len]]
    assert has_more is more


def _cut_exactly(entries: list[ReduceEntry], limits: PageLimits, envelope: int
                 ) -> tuple[list[str], bool]:
    """The page as the request counts it, every entry encoded (the reference)."""
    page: list[str] = []
    size = envelope
    for one in entries:
        cost = item_bytes(one.id, one.status, one.gate, one.last_error, len(one.data)) + (
            1 if page else 0)
        if len(page) >= limits.items or (page and size + cost > limits.request_bytes):
            return page, True
        page.append(one.id)
        size += cost
    return page, False


_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)),
                min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_TEXT, st.sampled_from(["available", "failed"]),
                          st.integers(0, 400), st.none() | _TEXT),
                max_size=8, unique_by=lambda row: row[0]),
       st.integers(1, 6), st.integers(0, 4000), st.integers(0, 300))
def test_cut_page_without_encoding_agrees_with_the_encoded_count(
        rows: list[tuple[str, str, int, str | None]], items: int, request_bytes: int,
        envelope: int) -> None:
    """Strings of any characters (escapes, surrogate pairs), sizes at and around the
    limits: the page cut from bounds is the page the encoded request allows."""
    entries = [ReduceEntry(item_id, 1, GATE, status, b"d" * size, error)
               for item_id, status, size, error in rows]
    for one in entries:  # the bound the cut trusts is never below the encoded size
        assert _entry_bound(one) >= item_bytes(one.id, one.status, one.gate, one.last_error,
                                               len(one.data))
    limits = PageLimits(items=items, request_bytes=request_bytes)
    page, more = cut_page(entries, limits, envelope)
    assert ([one.id for one in page], more) == _cut_exactly(entries, limits, envelope)


@pytest.mark.parametrize("text", ["\U0001F600" * 40, "\x00" * 40, '"\\' * 20,
                                  "é" * 40, "plain-id-" * 5])
def test_an_entry_bound_holds_for_the_longest_escapes(text: str) -> None:
    one = ReduceEntry(text, 1, GATE, "failed", b"d" * 7, text)
    assert _entry_bound(one) >= item_bytes(one.id, one.status, one.gate, one.last_error, 7)


def test_the_envelope_and_accumulator_count_against_the_page() -> None:
    entries = [entry(f"i{n}", size=0) for n in range(3)]
    accumulator = b'"' + b"a" * 98 + b'"'
    plain = plan_reduce(state("fold", accumulator=None), entries,
                        PageLimits(10, 3 * ONE + 2 + largest_envelope("p", None)), "p")
    assert len(plain.entries) == 3
    with_accumulator = plan_reduce(
        state("fold", accumulator=accumulator), entries,
        PageLimits(10, 3 * ONE + 2 + largest_envelope("p", None)), "p")
    assert len(with_accumulator.entries) == 1  # 100 more bytes: two items no longer fit


def test_a_page_never_outgrows_its_request_limit_whatever_the_text() -> None:
    """Ids and errors that JSON escapes (quotes, control characters, non-ASCII) are
    counted as sent."""
    entries = [ReduceEntry(f"\u00e9\"{n:02}\x01", 1, GATE, "failed", b"x" * 100,
                           "boom \u2028\U0001f600 " * 20) for n in range(40)]
    limits = PageLimits(1000, 5000)
    plan = plan_reduce(state("fold", accumulator=b'{"k":"\xc3\xa9"}'), entries, limits, "p\u00e9")
    call = reduce_call("p\u00e9", GATE, plan, attempt=3)
    assert 1 < len(plan.entries) < 40
    assert reduce_request_bytes(call) <= limits.request_bytes
    one_more = replace(plan, entries=tuple(entries[:len(plan.entries) + 1]))
    bigger = reduce_call("p\u00e9", GATE, one_more, attempt=3)
    assert reduce_request_bytes(bigger) > limits.request_bytes


def test_failed_items_over_the_size_limit_go_without_their_data() -> None:
    entries = [entry("a", size=10), entry("f", status="failed", size=11),
               entry("g", status="failed", size=10)]
    plan = plan_reduce(state(), entries, PageLimits(10, 10**6), "p", max_data_bytes=10)
    assert [(e.id, len(e.data)) for e in plan.entries] == [("a", 10), ("f", 0), ("g", 10)]
    assert plan.entries[1].last_error == "boom"


def test_a_single_item_too_large_for_any_request_is_named() -> None:
    plan = plan_reduce(state(), [entry("big", size=3000)], LIMITS, "p")
    call = reduce_call("p", GATE, plan, attempt=1)
    problem = page_problem(call, LIMITS)
    assert problem is not None and "item 'big' (3000 bytes of data, 4000 as base64)" in problem
    assert page_problem(reduce_call("p", GATE, plan_reduce(state(), [entry("a")], LIMITS),
                                    attempt=1), LIMITS) is None


def test_an_accumulator_over_its_limit_is_refused() -> None:
    plan = plan_reduce(state("fold"), [entry("a")], LIMITS)
    big = b"1" * (MAX_ACCUMULATOR_BYTES + 1)
    refused = r"accumulator is \d+ bytes, over the accumulator limit"
    with pytest.raises(ReduceAnswerError, match=refused):
        reduce_step("p", GATE, plan, ReduceResult(accumulator=big), 8 * 1024 * 1024)
    step = reduce_step("p", GATE, plan, ReduceResult(accumulator=big[:-1]), 8 * 1024 * 1024)
    assert step.accumulator == big[:-1]


def test_small_gate_is_one_call_and_big_gate_starts_the_fold() -> None:
    small = plan_reduce(state(), [entry("a"), entry("b")], LIMITS)
    assert (small.pass_, small.page, small.last, len(small.entries)) == ("all", 0, True, 2)
    big = plan_reduce(state(), [entry(f"i{n}") for n in range(4)], LIMITS)
    assert (big.pass_, big.page, big.last, len(big.entries)) == ("fold", 0, False, 3)
    assert big.accumulator is None


def test_stored_pass_resumes_with_its_page_and_accumulator() -> None:
    plan = plan_reduce(state("fold", page=2, after="i5", accumulator=b"[1]"),
                       [entry("i6"), entry("i7")], LIMITS)
    assert (plan.pass_, plan.page, plan.last, plan.accumulator) == ("fold", 2, True, b"[1]")


def test_fold_steps_store_progress_then_switch_to_apply() -> None:
    page = [entry("a"), entry("b"), entry("c")]
    middle = plan_reduce(state("fold", page=1, after="0"), [*page, entry("d")], LIMITS)
    step = reduce_step("p", GATE, middle, ReduceResult(accumulator=b'{"n":3}'))
    assert (step.pass_, step.page, step.after, step.accumulator) == ("fold", 2, "c", b'{"n":3}')
    assert step.writes == ()
    last = plan_reduce(state("fold", page=2, after="c"), [entry("d")], LIMITS)
    step = reduce_step("p", GATE, last, ReduceResult(accumulator=b"9", result=b'"top"'))
    assert (step.pass_, step.page, step.after, step.accumulator) == ("apply", 0, None, b"9")
    assert step.result == b'"top"'


def test_fold_answer_with_item_answers_is_refused() -> None:
    plan = plan_reduce(state("fold"), [entry("a")], LIMITS)
    with pytest.raises(ReduceAnswerError, match="fold answer carries only"):
        reduce_step("p", GATE, plan, ReduceResult(items={"a": Result(done=True)}))


def test_apply_writes_named_answers_and_default_and_skips_failed_items() -> None:
    entries = [entry("a"), entry("b"), entry("f", status="failed", gate=0), entry("c")]
    plan = plan_reduce(state(), entries, PageLimits(10, 10**6))
    answer = ReduceResult(items={"a": Result(gate=3, data=b"A")}, default=Result(gate=2),
                          result=b"{}")
    step = reduce_step("p", GATE, plan, answer)
    assert step.pass_ is None and step.result == b"{}"
    written = {w.item_id: (w.status, w.gate, w.data, w.seen_version) for w in step.writes}
    assert written == {"a": ("available", 3, b"A", 3), "b": ("available", 2, None, 3),
                       "c": ("available", 2, None, 3)}


def test_items_not_named_complete_without_a_default() -> None:
    plan = plan_reduce(state(), [entry("a"), entry("b")], LIMITS)
    step = reduce_step("p", GATE, plan, ReduceResult())
    assert {(w.item_id, w.status, w.gate) for w in step.writes} == {
        ("a", "complete", GATE), ("b", "complete", GATE)}


def test_apply_page_keeps_accumulator_until_last_page() -> None:
    plan = plan_reduce(state("apply", page=0, accumulator=b"acc"),
                       [entry("a"), entry("b"), entry("c"), entry("d")], LIMITS)
    step = reduce_step("p", GATE, plan, ReduceResult())
    assert (step.pass_, step.page, step.after, step.accumulator) == ("apply", 1, "c", b"acc")
    assert len(step.writes) == 3


@pytest.mark.parametrize(("answer", "message"), [
    (ReduceResult(items={"zz": Result(done=True)}), "not an item of this request"),
    (ReduceResult(items={"f": Result(done=True)}), "does not change failed items"),
    (ReduceResult(items={"a": Result()}), "leaves the item at the reduce gate"),
    (ReduceResult(default=Result(gate=GATE)), "leaves the item at the reduce gate"),
    (ReduceResult(items={"a": Result(gate=0, done=True)}), "below the reduce gate"),
    (ReduceResult(items={"a": "done"}), "expected a Result"),  # type: ignore[dict-item]
    (ReduceResult(result="text"), "result must be bytes"),  # type: ignore[arg-type]
    ({"done": True}, "expected a ReduceResult"),
])
def test_malformed_answers_are_refused_whole(answer: object, message: str) -> None:
    plan = plan_reduce(state(), [entry("a"), entry("f", status="failed", gate=0)], LIMITS)
    with pytest.raises(ReduceAnswerError, match=message):
        reduce_step("p", GATE, plan, answer)


def test_idempotency_key_is_stable_per_page_and_differs_between_pages() -> None:
    assert reduce_key("p", 1, "fold", 0) == reduce_key("p", 1, "fold", 0)
    keys = {reduce_key("p", 1, "fold", 0), reduce_key("p", 1, "fold", 1),
            reduce_key("p", 1, "apply", 0), reduce_key("p", 2, "fold", 0),
            reduce_key("p1", 1, "fold", 0)}
    assert len(keys) == 5


def test_reduce_call_carries_items_and_position() -> None:
    plan = plan_reduce(state("fold", page=4, accumulator=b"[]"), [entry("a")], LIMITS)
    call = reduce_call("p", GATE, plan, attempt=2)
    assert (call.pass_, call.page, call.last, call.attempt, call.accumulator) == (
        "fold", 4, True, 2, b"[]")
    assert [item.id for item in call.items] == ["a"]
    assert call.idempotency_key == reduce_key("p", GATE, "fold", 4, plan.entries)


def test_idempotency_key_changes_when_the_page_items_were_put_back() -> None:
    """A retry of a call (no item written) keeps its key; a reduce run again after
    retry_failed put its items back (their versions bumped) gets new keys, so a handler
    that caches answers by key does not replay the first run's answer."""
    first = reduce_call("p", GATE, plan_reduce(state(), [entry("a"), entry("b")], LIMITS), 1)
    repeat = reduce_call("p", GATE, plan_reduce(state(), [entry("a"), entry("b")], LIMITS), 2)
    assert repeat.idempotency_key == first.idempotency_key
    again = reduce_call("p", GATE, plan_reduce(
        state(), [entry("a"), entry("b", version=2)], LIMITS), 1)
    more = reduce_call("p", GATE, plan_reduce(
        state(), [entry("a"), entry("b"), entry("c")], LIMITS), 1)
    assert len({first.idempotency_key, again.idempotency_key, more.idempotency_key}) == 3
