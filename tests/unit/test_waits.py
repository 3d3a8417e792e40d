"""Waits as pure decisions: what a parking answer writes, what the gate does while
items wait, what a completion writes or refuses, and the token's shape."""

from __future__ import annotations

import hashlib

import pytest

import handlers
from handlers.wire.contract import encode_result, parse_item
from processor.wire.contract import batch_entry, item_headers, parse_answer
from processor.wire.values import MalformedResponseError
from watcher.errors import CompletionRefusedError
from watcher.protocol import NonRetryableError, Result, RetryableError, Wait, WorkItem
from watcher.records import GateSummary, NewItem, ReadyItem
from watcher.rules.completions import completion_write
from watcher.rules.decisions import (
    GateMove,
    RetryPolicy,
    decide_gate,
    outcome_name,
    result_problem,
    write_for_result,
)
from watcher.waits import (
    MAX_WAIT_SECONDS,
    fails_on_timeout,
    new_completion_token,
    timeout_message,
    token_hash,
    token_well_formed,
)

ITEM = ReadyItem("a", 7, 2, b"x", 1)
POLICY = RetryPolicy(max_retries=3, backoff=1.0, jitter=0.0)


@pytest.mark.parametrize(("summary", "step"), [
    (GateSummary(pending=0, failed=0, next_gate=None, waiting=2, seconds_to_deadline=5.0),
     GateMove.WAIT),
    (GateSummary(pending=0, failed=0, next_gate=3, waiting=1, seconds_to_deadline=0.0),
     GateMove.EXPIRE),
    (GateSummary(pending=1, failed=0, next_gate=None, waiting=1, seconds_to_deadline=0.0),
     GateMove.WAIT),
    (GateSummary(pending=0, failed=1, next_gate=None, waiting=1, seconds_to_deadline=9.0),
     GateMove.FAIL),
    (GateSummary(pending=0, failed=0, next_gate=None), GateMove.CLOSE),
])
def test_waiting_items_hold_the_gate_until_their_deadline(summary, step) -> None:
    assert decide_gate(summary, auto_close=True, manual_checkpoint=False).move is step


def test_a_parking_answer_writes_waiting_with_its_deadline_and_the_token_hash() -> None:
    token = new_completion_token()
    write = write_for_result("p", ITEM, Result(wait=Wait(30, "fail"), data=b"d",
                                               spawn=[NewItem("c", b"")]),
                             2, POLICY, completion_token=token)
    assert (write.status, write.retry_delay, write.gate, write.data) == ("waiting", 30.0, 2,
                                                                          b"d")
    assert write.attempts == 1, "a wait keeps the attempts: a timeout spends one more"
    assert write.wait is not None and write.wait.token_hash == token_hash(token)
    assert token not in repr(write), "only the hash is carried"
    assert write.wait.on_timeout == "fail" and [c.id for c in write.spawn] == ["c"]
    assert outcome_name(ITEM, write) == "waiting"
    plain = write_for_result("p", ITEM, Result(done=True), 2, POLICY)
    assert plain.wait is None


@pytest.mark.parametrize(("result", "fragment"), [
    (Result(wait=Wait(0)), "above 0"),
    (Result(wait=Wait(MAX_WAIT_SECONDS + 1)), "30 days"),
    (Result(wait=Wait(float("nan"))), "above 0"),
    (Result(wait=Wait(10, "later")), "on_timeout"),
    (Result(wait=Wait(10), done=True), "cannot come with"),
    (Result(wait=Wait(10), gate=3), "cannot come with"),
    (Result(wait=Wait(10), snooze=1), "cannot come with"),
])
def test_bad_waits_are_named(result, fragment) -> None:
    problem = result_problem(result)
    assert problem is not None and fragment in problem


def test_a_wait_of_thirty_days_is_allowed() -> None:
    assert result_problem(Result(wait=Wait(MAX_WAIT_SECONDS))) is None


@pytest.mark.parametrize(("answer", "field"), [
    (Result(gate=1), "gate"),
    (Result(wait=Wait(-1)), "wait"),
    (Result(done=True, snooze=3), "snooze"),
    (Result(spawn=[NewItem("", b"")]), "spawn"),
    (Result(data=b"x" * 11), "data"),
])
def test_a_completion_that_cannot_apply_is_refused_naming_the_field(answer, field) -> None:
    with pytest.raises(CompletionRefusedError) as refused:
        completion_write("p", ITEM, answer, 2, POLICY, new_token="t" * 43, max_data_bytes=10)
    assert refused.value.field == field


def test_what_a_completion_writes() -> None:
    done = completion_write("p", ITEM, Result(done=True), 2, POLICY, new_token="t" * 43)
    assert (done.status, done.attempts, done.wait) == ("complete", 0, None)
    again = completion_write("p", ITEM, Result(), 2, POLICY, new_token="t" * 43)
    assert (again.status, again.gate) == ("available", 2), "not done: runs again at its gate"
    parked = completion_write("p", ITEM, Result(wait=Wait(5)), 2, POLICY, new_token="n" * 43)
    assert parked.status == "waiting" and parked.wait is not None
    assert parked.wait.token_hash == token_hash("n" * 43)
    retry = completion_write("p", ITEM, RetryableError("later"), 2, POLICY, new_token="t" * 43)
    assert (retry.status, retry.attempts, retry.last_error) == ("available", 2, "later")
    final = completion_write("p", ITEM, NonRetryableError("no"), 2, POLICY, new_token="t" * 43)
    assert final.status == "failed"


def test_tokens() -> None:
    tokens = {new_completion_token() for _ in range(100)}
    assert len(tokens) == 100
    assert all(len(token) == 55 and token_well_formed(token) for token in tokens)
    # Keys follow the time the tokens were made, and older (unprefixed) tokens keep theirs.
    first, later = new_completion_token(), None
    while later is None or later[:12] == first[:12]:
        later = new_completion_token()
    assert token_hash(first) < token_hash(later) and token_hash(first)[:12] == first[:12]
    assert token_hash("n" * 43) == hashlib.sha256(b"n" * 43).hexdigest()
    for bad in ("", "short", "has space" * 5, "x" * 129, "é" * 43):
        assert not token_well_formed(bad)
    assert len(token_hash("abc")) == 64
    assert timeout_message(30.0) == "timed out waiting after 30 s"
    assert timeout_message(0.5) == "timed out waiting after 0.5 s"
    assert fails_on_timeout("", "fail") and fails_on_timeout("fail", "retry")
    assert not fails_on_timeout("retry", "fail") and not fails_on_timeout("", "retry")


def test_the_token_travels_per_call_and_the_sdk_reads_it() -> None:
    work = WorkItem("p", "a", 0, 1, b"{}", 1)
    token = item_headers(work)["X-Completion-Token"]
    assert token == work.completion_token and token_well_formed(token)
    assert batch_entry(work)["completion_token"] == token
    other = WorkItem("p", "a", 0, 1, b"{}", 1)
    assert other.completion_token != token, "a new call, a new token"
    headers = {key.lower().encode(): value.encode() for key, value in item_headers(work).items()}
    assert parse_item(headers, b"{}").completion_token == token
    assert token not in repr(parse_item(headers, b"{}"))


def test_the_wait_on_the_wire() -> None:
    body = encode_result(handlers.Result(wait=3600, data={"asked": True}))
    assert b'"wait":{"timeout":3600}' in body
    parsed = parse_answer({"wait": {"timeout": 3600, "on_timeout": "fail"}})
    assert isinstance(parsed, Result) and parsed.wait == Wait(3600.0, "fail")
    for bad in ({"wait": 5}, {"wait": {"timeout": 0}}, {"wait": {"timeout": 5, "x": 1}},
                {"wait": {"timeout": 5, "on_timeout": "never"}}):
        with pytest.raises(MalformedResponseError):
            parse_answer(bad)
    with pytest.raises(ValueError):
        handlers.Result(wait=10, done=True)
    with pytest.raises(ValueError):
        handlers.Result(wait=MAX_WAIT_SECONDS + 1)
