"""The processor side of the handler contract (processor/wire/contract.py), with plain values."""

from __future__ import annotations

import base64
import email.utils
import json
from dataclasses import dataclass

import pytest

from handlers.wire import contract as handler_wire
from processor.wire.contract import (
    ITEM_ANSWER,
    decode_reply,
    encode_batch,
    encode_json,
    header_safe,
    item_headers,
    parse_answer,
    read_answer,
    read_batch_reply,
    read_item_reply,
)
from processor.wire.errors import (
    classify_error,
    item_error,
    malformed,
    parse_error_body,
    parse_handler_error,
    parse_retry_after,
    unexpected_failure,
)
from processor.wire.reduce import encode_reduce
from processor.wire.values import (
    MAX_RETRY_AFTER,
    Failure,
    HandlerError,
    MalformedResponseError,
    Reply,
    decode_json,
)
from watcher.protocol import (
    NonRetryableError,
    ReduceCall,
    ReduceItem,
    Result,
    RetryableError,
    WorkItem,
)
from watcher.rules.reduce import reduce_request_bytes

NOW = 1_700_000_000.0
LIMIT = 1000
PAGING_HINT = ("an answer that spawns many items pages them: spawn a slice and answer the "
               "same gate, not done, with a cursor in its data")
DEEP = b"[" * 100_000


def clock() -> float:
    return NOW


@dataclass(frozen=True)
class Malformed:
    """Expected: a retryable malformed-answer failure whose reason contains ``text``."""

    text: str

    def check(self, outcome: object, status: int, expected: str) -> None:
        assert isinstance(outcome, Failure) and outcome.retryable, outcome
        assert outcome.reason.startswith(f"malformed answer (HTTP {status}): "), outcome
        assert self.text in outcome.reason, outcome
        assert outcome.reason.endswith(f"; expected {expected}"), outcome


def item(**changes) -> WorkItem:
    values = {"partition_id": "p-1", "id": "item-1", "gate": 3, "attempt": 2,
              "data": b"\x00\x01payload\xff", "version": 7, "idempotency_key": "p-1:item-1:3:7"}
    values.update(changes)
    return WorkItem(**values)


# --------------------------------------------------------------------------- JSON


@pytest.mark.parametrize("body, expected", [
    (b'{"a": [1, 2.5, "x", null, true]}', {"a": [1, 2.5, "x", None, True]}),
    (b"1e308", 1e308),
    (b"-1e308", -1e308),
    (b"1e-999", 0.0),                                   # underflow is a plain zero
    (b'"NaN"', "NaN"),                                  # the word inside a string is fine
    (b'\xef\xbb\xbf{"gate": 1}', {"gate": 1}),           # a UTF-8 byte order mark
    ('{"k": "é"}'.encode("utf-16"), {"k": "é"}),       # UTF-16, as json.loads takes it
    (b"[" * 200 + b"]" * 200, json.loads(b"[" * 200 + b"]" * 200)),
])
def test_decode_json_accepts_json(body, expected):
    assert decode_json(body) == expected


@pytest.mark.parametrize("body, in_message", [
    (b"NaN", "not valid JSON (NaN is not a JSON number)"),
    (b'{"data": NaN}', "NaN is not a JSON number"),
    (b"[Infinity]", "Infinity is not a JSON number"),
    (b"[-Infinity]", "-Infinity is not a JSON number"),
    (b'{"data": 1e999}', "1e999 overflows a 64-bit float"),
    (b"[-1E400]", "-1E400 overflows"),
    (DEEP, "nested too deeply"),
    (b'{"a": ' * 50_000, "nested too deeply"),
    (b"", "not valid JSON"),
    (b"nope", "not valid JSON"),
    (b"\xff", "not valid JSON"),
    (b"\xff\xfe\x00garbage", "not valid JSON"),
    (b"1" * 5000, "not valid JSON"),                   # over Python's int digit limit
])
def test_decode_json_is_strict_and_raises_only_malformed(body, in_message):
    with pytest.raises(MalformedResponseError) as caught:
        decode_json(body)
    assert in_message in str(caught.value)


@pytest.mark.parametrize("depth", range(900, 1100, 7))
def test_nesting_near_the_limit_never_escapes_as_recursion_error(depth):
    """Decoded just under the limit, re-encoding 'data' or showing a value must not blow up."""
    nested = b"[" * depth + b"]" * depth
    for body in (b'{"data": ' + nested + b"}", b'{"gate": ' + nested + b"}",
                 b'{"error": {"message": ' + nested + b"}}"):
        outcome = read_item_reply(Reply(200, None, body), max_bytes=len(body), clock=clock)
        assert isinstance(outcome, Result | Failure), outcome
        assert isinstance(parse_error_body(body), HandlerError)


# --------------------------------------------------------------------------- answers


@pytest.mark.parametrize("body, expected", [
    (b"", Result()),
    (b" \r\n", Result()),
    (b"{}", Result()),
    (b'{"gate": 2}', Result(gate=2)),
    (b'{"gate": null, "done": null}', Result()),
    (b'{"gate": 2147483647}', Result(gate=2**31 - 1)),
    (b'{"done": true}', Result(done=True)),
    (b'{"data": {"b": [1, 2.5, "\xc3\xa9"], "a": null}}',
     Result(data='{"b":[1,2.5,"é"],"a":null}'.encode())),
    (b'{"data": null}', Result(data=b"null")),
    (b'{"data": false}', Result(data=b"false")),
    (b'{"data": "\\u00e9"}', Result(data='"é"'.encode())),
    (b'{"data_b64": "AP8="}', Result(data=b"\x00\xff")),
    (b'{"data_b64": ""}', Result(data=b"")),
    (b'{"data": 1, "data_b64": null}', Result(data=b"1")),
    (b'{"data_b64": "AA==", "unknown": [1]}', Result(data=b"\x00")),
    (b'\xef\xbb\xbf{"gate": 1}', Result(gate=1)),  # a UTF-8 byte order mark is fine
    (b'{"gate": 1, "error": null}', Result(gate=1)),
])
def test_a_2xx_item_reply_maps_valid_answers(body, expected):
    """The body of a 2xx per-item answer, as the processor reads it (read_item_reply)."""
    assert read_item_reply(Reply(200, None, body), max_bytes=LIMIT, clock=clock) == expected


@pytest.mark.parametrize("body, in_message", [
    (b"nope", "not valid JSON"),
    (b'{"gate": 1', "not valid JSON"),
    (b'{"data": Infinity}', "not valid JSON"),
    (b'{"data": NaN}', "not valid JSON"),
    (b'{"data": 1e999}', "overflows a 64-bit float"),
    (b"\xff", "not valid JSON"),
    (b"[]", "JSON array"),
    (b"3", "JSON number"),
    (b"null", "JSON null"),
    (b"true", "JSON boolean"),
    (b'{"gate": "1"}', "'gate' must be a non-negative integer, got \"1\""),
    (b'{"gate": true}', "got true"),
    (b'{"gate": 2.0}', "got 2.0"),
    (b'{"gate": -1}', "got -1"),
    (b'{"gate": 9223372036854775808}', "up to"),
    (b'{"done": "yes"}', "'done' must be true or false, got \"yes\""),
    (b'{"done": 1}', "'done' must be true or false"),
    (b'{"data": 1, "data_b64": "AA=="}', "both 'data' and 'data_b64'"),
    (b'{"data": null, "data_b64": ""}', "both 'data' and 'data_b64'"),
    (b'{"data_b64": "AA"}', "not valid base64"),       # missing padding
    (b'{"data_b64": "A?=="}', "not valid base64"),
    (b'{"data_b64": "\\u00e9AA="}', "not valid base64"),
    (b'{"data_b64": ["AA=="]}', "must be a base64 string"),
    (b'{"data": "\\ud800"}', "unpaired"),
    (b'{"error": 5}', "'error' must be an object or a string"),
    (b"[" * 50_000, "nested too deeply"),
    (b'{"gate": ' + b"1" * 5000 + b"}", "not valid JSON"),  # over Python's int digit limit
])
def test_a_2xx_item_reply_refuses_malformed_answers(body, in_message):
    """A malformed 2xx per-item body is a retryable malformed-answer failure that says why."""
    outcome = read_item_reply(Reply(200, None, body), max_bytes=len(body), clock=clock)
    Malformed(in_message).check(outcome, 200, ITEM_ANSWER)


def test_an_error_object_on_a_2xx_is_a_reported_error():
    body = b'{"error": {"message": "m", "no_retry": true}}'
    assert parse_answer(decode_json(body)) == HandlerError("m", no_retry=True)
    assert read_item_reply(Reply(200, None, body), max_bytes=LIMIT, clock=clock) == Failure(
        False, "the handler reported an error (HTTP 200): m (no_retry set: not retried)")
    body = b'{"gate": 3, "error": "plain"}'
    assert parse_answer(decode_json(body)) == HandlerError("plain")
    assert read_item_reply(Reply(200, None, body), max_bytes=LIMIT, clock=clock) == Failure(
        True, "the handler reported an error (HTTP 200): plain")


def test_parse_answer_takes_decoded_objects_and_masks_reported_errors():
    assert parse_answer({"gate": 4, "done": True}) == Result(gate=4, done=True)
    assert parse_answer({"error": "token abcd1234 refused"},
                        lambda text: text.replace("abcd1234", "***")) == (
        HandlerError("token *** refused"))
    with pytest.raises(MalformedResponseError, match="the answer is a JSON array, not an object"):
        parse_answer([{"gate": 1}])


@pytest.mark.parametrize("body, expected", [
    (b"", HandlerError("")),
    (b'{"error": {"message": "boom"}}', HandlerError("boom")),
    (b'{"error": {"message": "boom", "no_retry": true}}', HandlerError("boom", True)),
    (b'{"error": {"message": "boom", "no_retry": "true"}}', HandlerError("boom")),
    (b'{"error": {"no_retry": true}}', HandlerError("", True)),
    (b'{"error": {"message": {"code": 7}}}', HandlerError('{"code": 7}')),
    (b'{"error": "text"}', HandlerError("text")),
    (b"<html>\n  <b>Bad   Gateway</b></html>", HandlerError("<html> <b>Bad Gateway</b></html>")),
    (b'{"detail": "not ours"}', HandlerError('{"detail": "not ours"}')),
    (b"[" * 50_000, HandlerError("[" * 200 + "...")),
    (b'{"error": NaN}', HandlerError('{"error": NaN}')),     # not JSON: kept as text
])
def test_parse_error_body_is_lenient(body, expected):
    assert parse_error_body(body) == expected


def test_parse_error_body_truncates_long_messages():
    reported = parse_error_body(b'{"error": {"message": "' + b"m" * 5000 + b'"}}')
    assert len(reported.message) == 1003 and reported.message.endswith("...")


@pytest.mark.parametrize("status, error, retryable", [
    (500, HandlerError("x"), True),
    (502, HandlerError(""), True),
    (503, HandlerError("x"), True),
    (408, HandlerError(""), True),
    (429, HandlerError(""), True),
    (200, HandlerError("reported"), True),
    (400, HandlerError("x"), False),
    (401, HandlerError(""), False),
    (404, HandlerError(""), False),
    (422, HandlerError(""), False),
    (301, HandlerError(""), False),
    (500, HandlerError("x", no_retry=True), False),
    (503, HandlerError("x", no_retry=True), False),
    (200, HandlerError("x", no_retry=True), False),
    (429, HandlerError("x", no_retry=True), False),
    (600, HandlerError(""), True),
])
def test_classify_error(status, error, retryable):
    failure = classify_error(status, error, now=NOW)
    assert failure.retryable is retryable
    assert f"HTTP {status}" in failure.reason
    assert failure.retry_after is None


def test_classify_error_reads_retry_after_on_429_and_503_only():
    # The handler asked for fewer calls: throttled (held fleet-wide, no attempt used).
    assert classify_error(429, HandlerError(""), retry_after="5", now=NOW) == Failure(
        True, "the handler answered HTTP 429 with no error message", 5.0, throttled=True)
    assert classify_error(503, HandlerError("busy"), retry_after="2", now=NOW).retry_after == 2
    assert classify_error(500, HandlerError(""), retry_after="5", now=NOW).retry_after is None
    assert classify_error(503, HandlerError("", True), retry_after="5", now=NOW) == Failure(
        False, "the handler answered HTTP 503 with no error message (no_retry set: not retried)")


@pytest.mark.parametrize("value, expected", [
    ("0", 0.0),
    ("120", 120.0),
    (" 7 ", 7.0),
    ("1.5", 1.5),
    ("999999999", MAX_RETRY_AFTER),
    (email.utils.formatdate(NOW + 90, usegmt=True), 90.0),
    (email.utils.formatdate(NOW - 90, usegmt=True), 0.0),
    (email.utils.formatdate(NOW + 30, localtime=False), 30.0),  # "-0000" zone
    ("-5", None),
    ("soon", None),
    ("", None),
    ("1e3", None),
    ("٣", None),  # a non-ASCII digit
])
def test_parse_retry_after(value, expected):
    assert parse_retry_after(value, now=NOW) == expected


# --------------------------------------------------------------------------- replies


@pytest.mark.parametrize("reply, expected", [
    (Reply(200, None, b'{"gate": 1}'), {"gate": 1}),
    (Reply(201, None, b"[1, 2]"), [1, 2]),
    (Reply(200, None, b'"x"'), "x"),                     # the shape is the caller's to check
    (Reply(204, None, b""), Failure(True, "malformed answer (HTTP 204): the body is empty; "
                                          "expected X")),
    (Reply(200, None, None), Failure(True, "malformed answer (HTTP 200): the body is larger "
                                           f"than max_response_bytes ({LIMIT} bytes); "
                                           f"{PAGING_HINT}")),
    (Reply(200, None, b"{"), Malformed("not valid JSON")),
    (Reply(200, None, b"[NaN]"), Malformed("NaN is not a JSON number")),
    (Reply(200, None, b"[1e999]"), Malformed("overflows a 64-bit float")),
    (Reply(200, None, DEEP), Malformed("nested too deeply")),
    (Reply(500, None, b'{"error": {"message": "db down"}}'),
     Failure(True, "the handler answered HTTP 500: db down")),
    (Reply(404, None, None), Failure(False, "the handler answered HTTP 404: (the error body "
                                            f"is larger than {LIMIT} bytes)")),
    (Reply(503, "30", b""), Failure(True, "the handler answered HTTP 503 with no error "
                                          "message", 30.0, throttled=True)),
    (Reply(429, email.utils.formatdate(NOW + 60, usegmt=True), b""),
     Failure(True, "the handler answered HTTP 429 with no error message", 60.0,
             throttled=True)),
    (Reply(400, None, DEEP), Failure(False, "the handler answered HTTP 400: " + "[" * 200
                                            + "...")),
])
def test_decode_reply(reply, expected):
    decoded = decode_reply(reply, expected="X", max_bytes=LIMIT, clock=clock)
    if isinstance(expected, Malformed):
        expected.check(decoded, reply.status, "X")
    else:
        assert decoded == expected


def test_decode_reply_takes_an_empty_body_as_given_and_masks_error_text():
    assert decode_reply(Reply(204, None, b" "), expected="X", max_bytes=LIMIT,
                        empty={"default": True}) == {"default": True}
    masked = decode_reply(Reply(502, None, b"proxy says s3cret-value"), expected="X",
                          max_bytes=LIMIT, mask=lambda text: text.replace("s3cret-value", "***"))
    assert masked == Failure(True, "the handler answered HTTP 502: proxy says ***")


def test_decode_reply_reads_the_clock_only_for_an_error_reply():
    def no_clock() -> float:
        raise AssertionError("the clock was read")

    assert decode_reply(Reply(200, "5", b"{}"), expected="X", max_bytes=LIMIT,
                        clock=no_clock) == {}


@pytest.mark.parametrize("entry, status, expected", [
    ({"gate": 2}, 200, Result(gate=2)),
    ({}, 200, Result()),
    ({"error": {"message": "later"}}, 200,
     Failure(True, "the handler reported an error (HTTP 200): later")),
    ({"error": {"message": "bad", "no_retry": True}}, 207,
     Failure(False, "the handler reported an error (HTTP 207): bad (no_retry set: not retried)")),
    ({"gate": -1}, 200, malformed(200, "entry 0: 'gate' must be a non-negative integer up to "
                                       "2147483647, got -1", ITEM_ANSWER)),
    ([], 200, malformed(200, "entry 0: the answer is a JSON array, not an object", ITEM_ANSWER)),
    ("text", 200, malformed(200, "entry 0: the answer is a JSON string, not an object",
                            ITEM_ANSWER)),
])
def test_read_answer(entry, status, expected):
    assert read_answer(entry, status, where="entry 0: ", clock=clock) == expected


@pytest.mark.parametrize("reply, expected", [
    (Reply(200, None, b""), Result()),
    (Reply(204, None, b""), Result()),
    (Reply(200, None, b'{"done": true}'), Result(done=True)),
    (Reply(200, None, b"[]"), malformed(200, "the answer is a JSON array, not an object",
                                        ITEM_ANSWER)),
    (Reply(200, None, b"{]"), Malformed("not valid JSON")),
    (Reply(200, None, b'{"data": NaN}'), Malformed("NaN is not a JSON number")),
    (Reply(200, None, DEEP), Malformed("nested too deeply")),
    (Reply(200, None, None), Failure(True, "malformed answer (HTTP 200): the body is larger "
                                           f"than max_response_bytes ({LIMIT} bytes); "
                                           f"{PAGING_HINT}")),
    (Reply(200, None, b'{"error": "busy"}'),
     Failure(True, "the handler reported an error (HTTP 200): busy")),
    (Reply(422, None, b'{"error": "no"}'), Failure(False, "the handler answered HTTP 422: no")),
])
def test_read_item_reply(reply, expected):
    outcome = read_item_reply(reply, max_bytes=LIMIT, clock=clock)
    if isinstance(expected, Malformed):
        expected.check(outcome, reply.status, ITEM_ANSWER)
    else:
        assert outcome == expected


def batch_reply(body: bytes | None, status: int = 200) -> Reply:
    return Reply(status, None, body)


def test_read_batch_reply_answers_each_entry_in_order():
    outcomes = read_batch_reply(
        batch_reply(b'[{"gate": 1}, {"error": {"message": "bad", "no_retry": true}}, '
                    b'{"gate": "x"}, {}]'), 4, max_bytes=LIMIT, clock=clock)
    assert outcomes == [
        Result(gate=1),
        Failure(False, "the handler reported an error (HTTP 200): bad (no_retry set: not "
                       "retried)"),
        malformed(200, "batch entry 2: 'gate' must be a non-negative integer, got \"x\"",
                  ITEM_ANSWER),
        Result(),
    ]


@pytest.mark.parametrize("reply, in_reason, retryable", [
    (batch_reply(b"[{}]"), "the body is an array of 1", True),
    (batch_reply(b'{"gate": 1}'), "the body is a JSON object", True),
    (batch_reply(b"null"), "the body is a JSON null", True),
    (batch_reply(b""), "the body is empty", True),
    (batch_reply(b"<html>"), "not valid JSON", True),
    (batch_reply(b"[{}, {\"data\": NaN}]"), "NaN is not a JSON number", True),
    (batch_reply(b"[{}, {\"data\": 1e999}]"), "overflows a 64-bit float", True),
    (batch_reply(DEEP), "nested too deeply", True),
    (batch_reply(None), f"larger than max_response_bytes ({LIMIT} bytes)", True),
    (batch_reply(b'{"error": "down"}', 503), "the handler answered HTTP 503: down", True),
    (batch_reply(b"", 401), "the handler answered HTTP 401", False),
])
def test_a_whole_batch_reply_fails_as_one_failure(reply, in_reason, retryable):
    outcome = read_batch_reply(reply, 2, max_bytes=LIMIT, clock=clock)
    assert isinstance(outcome, Failure), outcome
    assert in_reason in outcome.reason
    assert outcome.retryable is retryable
    if reply.status == 200 and reply.body is not None:
        assert outcome.reason.endswith(
            "expected a JSON array of 2 answers, one per item of the batch in request order")


# --------------------------------------------------------------------------- requests


@pytest.mark.parametrize("value, expected", [
    ("abc-DEF_1.2~:/?#[]@!$&'()*+,;=", "abc-DEF_1.2~:/?#[]@!$&'()*+,;="),
    ("", ""),
    ("a b", "a%20b"),
    ("50%", "50%25"),
    ("é", "%C3%A9"),
    ("tab\tx", "tab%09x"),
    ("日本", "%E6%97%A5%E6%9C%AC"),
])
def test_header_safe(value, expected):
    assert header_safe(value) == expected


def test_item_headers_are_what_the_handler_sdk_parses():
    work = item(partition_id="p é", id="100%", idempotency_key="k:1")
    headers = {name.lower().encode(): value.encode("ascii")
               for name, value in item_headers(work).items()}
    assert headers[b"content-type"] == b"application/octet-stream"
    parsed = handler_wire.parse_item(headers, work.data)
    assert (parsed.partition_id, parsed.id, parsed.gate, parsed.attempt,
            parsed.idempotency_key, parsed.data) == ("p é", "100%", 3, 2, "k:1", work.data)


def test_a_batch_body_is_what_the_handler_sdk_parses():
    works = [item(), item(id="é", data=b"", gate=0, attempt=1)]
    entries = handler_wire.parse_batch(encode_batch(works))
    parsed = [handler_wire.parse_batch_entry(n, entry) for n, entry in enumerate(entries)]
    assert [(p.partition_id, p.id, p.gate, p.attempt, p.idempotency_key, p.data)
            for p in parsed] == [(w.partition_id, w.id, w.gate, w.attempt, w.idempotency_key,
                                  w.data) for w in works]
    assert entries[0]["data_b64"] == base64.b64encode(works[0].data).decode()


def test_encode_json_is_compact_ascii_and_refuses_nan():
    assert encode_json({"a": [1, "é"]}) == b'{"a":[1,"\\u00e9"]}'
    with pytest.raises(ValueError):
        encode_json({"a": float("nan")})


# --------------------------------------------------------------------------- failures


def test_item_error_is_the_reason_alone_and_keeps_the_verdict():
    # The item's row and the log fields name its partition, id, gate and attempt.
    retry = item_error(item(), Failure(True, "the handler answered HTTP 503", 4.0))
    assert type(retry) is RetryableError and retry.retry_after == 4.0
    assert str(retry) == "the handler answered HTTP 503"
    final = item_error(item(id="tok-abcd"), Failure(False, "refused tok-abcd"),
                       lambda text: text.replace("tok-abcd", "***"))
    assert type(final) is NonRetryableError
    assert str(final) == "refused ***"


def test_a_failure_can_be_put_in_context_and_a_bug_is_a_retryable_failure():
    failure = Failure(False, "the handler answered HTTP 400", None)
    assert failure.prefixed("the batch request failed") == Failure(
        False, "the batch request failed: the handler answered HTTP 400")
    bug = unexpected_failure(KeyError("gate"), "sending a batch")
    assert bug == Failure(True, "unexpected KeyError while sending a batch: 'gate'")


@pytest.mark.parametrize("value, expected", [
    ("plain", HandlerError("plain")),
    ({"message": "m", "no_retry": True}, HandlerError("m", True)),
    ({"message": ["a", 1]}, HandlerError('["a", 1]')),
    ({}, HandlerError("")),
    ({"message": "x" * 1200}, HandlerError("x" * 1000 + "...")),
])
def test_parse_handler_error(value, expected):
    assert parse_handler_error(value) == expected


@pytest.mark.parametrize("value", [5, ["m"], True])
def test_parse_handler_error_refuses_other_values(value):
    with pytest.raises(MalformedResponseError, match="'error' must be an object or a string"):
        parse_handler_error(value)


@pytest.mark.parametrize("call", [
    ReduceCall("p", 1, 1, "all", 0, True, (), None, "k" * 32),
    ReduceCall("p\u00e9\u2028\x01", 7, 12, "fold", 3, False,
               (ReduceItem('i"\\\u00ef', "failed", 0, b"\x00" * 7, "boom\x00 \U0001f600"),
                ReduceItem("b", "available", 7, b"", None),
                ReduceItem("c", "available", 7, bytes(range(256)) * 3, "")),
               '{"k": ["\u00e9\U0001f600", 1.5, null]}'.encode(), "0" * 32),
    ReduceCall("q", 2**31, 10**6, "apply", 10**5, True,
               (ReduceItem("x" * 255, "available", 2**31, b"ab", None),), b"[]", "z" * 32),
])
def test_the_reduce_request_size_the_page_cut_counts_is_the_body_sent(call: ReduceCall
                                                                      ) -> None:
    body = encode_reduce(call)
    assert reduce_request_bytes(call) == len(body)
    sent = json.loads(body)
    assert sent["accumulator"] == (None if call.accumulator is None
                                   else json.loads(call.accumulator))
    assert [base64.b64decode(item["data_b64"]) for item in sent["items"]] == [
        item.data for item in call.items]


def test_a_stored_accumulator_that_is_not_json_is_refused() -> None:
    with pytest.raises(ValueError):
        encode_reduce(ReduceCall("p", 1, 1, "fold", 1, False, (), b"{not json", "k"))
