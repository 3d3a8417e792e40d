"""The pure parts of the HTTP processor: answer parsing, error classification, encoding."""

from __future__ import annotations

import base64
import email.utils

import pytest

from processor.http_processor import (
    MAX_RETRY_AFTER,
    Failure,
    HandlerError,
    MalformedResponseError,
    classify_error,
    header_safe,
    parse_error_body,
    parse_retry_after,
    parse_success_body,
)
from processor.redact import Scrubber, header_secrets, redact_url, url_secrets
from watcher.protocol import Result

NOW = 1_700_000_000.0


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
def test_parse_success_body_maps_valid_answers(body, expected):
    assert parse_success_body(body) == expected


@pytest.mark.parametrize("body, in_message", [
    (b"nope", "not valid JSON"),
    (b'{"gate": 1', "not valid JSON"),
    (b'{"data": Infinity}', "not valid JSON"),
    (b'{"data": NaN}', "not valid JSON"),
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
def test_parse_success_body_rejects_malformed_answers(body, in_message):
    with pytest.raises(MalformedResponseError) as caught:
        parse_success_body(body)
    assert in_message in str(caught.value)


def test_an_error_object_on_a_2xx_is_a_reported_error():
    assert parse_success_body(b'{"error": {"message": "m", "no_retry": true}}') == (
        HandlerError("m", no_retry=True))
    assert parse_success_body(b'{"gate": 3, "error": "plain"}') == HandlerError("plain")


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
    assert classify_error(429, HandlerError(""), retry_after="5", now=NOW) == Failure(
        True, "the handler answered HTTP 429 with no error message", 5.0)
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


def test_redact_url_hides_password_and_query_values():
    assert redact_url("http://bob:pw@h:8/p?code=abc&x=1&flag") == (
        "http://bob:***@h:8/p?code=***&x=***&flag")
    assert redact_url("https://bob@h/p") == "https://bob@h/p"
    assert redact_url("http://h/p") == "http://h/p"
    assert redact_url("http://[::1") == "<unparseable URL>"


def test_url_and_header_secrets():
    assert {"p%40ss", "p@ss", "k%2Fy", "k/y"} <= set(url_secrets("http://u:p%40ss@h/?code=k%2Fy"))
    assert "tok123" in header_secrets("Bearer tok123")
    basic = "Basic " + base64.b64encode(b"u:p").decode()
    assert basic.split()[1] in header_secrets(basic)


def test_scrubber_masks_longest_secrets_first_and_ignores_short_values():
    scrub = Scrubber(["abcd", "abcdef", "1", ""])
    assert scrub("x abcdef y abcd z 1") == "x *** y *** z 1"
    assert "abcd" not in repr(scrub)
