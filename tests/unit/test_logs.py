"""The log formats (processor/observe/logs.py) and the failure lines (watcher/dispatch/failures.py),
without a process: the fields come from the template and its arguments, never from
re-parsing the formatted text."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from processor.observe.logs import (
    JsonFormatter,
    TextFormatter,
    formatter,
    message_fields,
    setup_logging,
    utc_time,
)
from watcher.dispatch import failures


@pytest.mark.parametrize(("template", "args", "fields"), [
    # literal tokens are strings; one conversion is the argument itself
    ("action=lease_acquired partition=%s owner=%s gate=%d", ("p 1", "w=1", 3),
     {"action": "lease_acquired", "partition": "p 1", "owner": "w=1", "gate": 3}),
    # a value that holds spaces and '=' stays whole: it is the argument, not the text
    ("action=item_failed item=%s error=%s", ("a", "HTTP 500: x=1 y=2"),
     {"action": "item_failed", "item": "a", "error": "HTTP 500: x=1 y=2"}),
    # the value ends at ';' ',' or ')'
    ("action=listen_failed owner=%s error=%s; polling every %s s", ("w", "Boom", 2),
     {"action": "listen_failed", "owner": "w", "error": "Boom"}),
    ("action=partition_stopped partition=%s owner=%s (cancelled)", ("p", "w"),
     {"action": "partition_stopped", "partition": "p", "owner": "w"}),
    # %r of a string is the string; of an object, its repr
    ("action=api_cancel partition=%r cancelled=%s", ("p'x", True),
     {"action": "api_cancel", "partition": "p'x", "cancelled": True}),
    ("action=duty_failed error=%r", (ValueError("v"),),
     {"action": "duty_failed", "error": "ValueError('v')"}),
    # a float is as precise as its conversion shows it
    ("action=reduce_retry wait=%.2f", (1.23456,), {"action": "reduce_retry", "wait": 1.23}),
    # a value mixing conversions, or text and a conversion, is no field
    ("action=lease_acquired gate=%d%s", (3, " (stolen)"), {"action": "lease_acquired"}),
    ("action=x pct=%d%% n=%d", (5, 6), {"action": "x", "n": 6}),
    # a key that would overwrite the record's own is left in the message
    ("action=x level=%s message=%s logger=y", ("a", "b"), {"action": "x"}),
    # named conversions
    ("action=x a=%(one)s b=%(two)d", ({"one": "1", "two": 2},), {"action": "x", "a": "1",
                                                                   "b": 2}),
    # arguments that do not fit the template: no fields, never an error
    ("action=x a=%s b=%s", ("only one",), {}),
    ("action=x a=%*d", (3, 4), {}),
    ("no fields here", (), {}),
    (ValueError("not a str"), (), {}),
])
def test_message_fields_come_from_the_template_and_its_arguments(
        template: Any, args: tuple[Any, ...], fields: dict[str, Any]) -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, template, args, None)
    assert message_fields(record.msg, record.args) == fields


def _record(msg: str, *args: Any, level: int = logging.WARNING,
            exc_info: Any = None) -> logging.LogRecord:
    record = logging.LogRecord("watcher.dispatch.failures", level, __file__, 7, msg, args, exc_info)
    record.created = 1_767_225_600.125  # 2026-01-01T00:00:00.125Z
    return record


def test_a_json_line_is_one_object_with_the_base_keys_and_the_fields() -> None:
    line = JsonFormatter().format(_record("action=item_failed partition=%s attempts=%d "
                                          "error=%s", "p", 3, "line one\nline two"))
    assert "\n" not in line
    assert json.loads(line) == {
        "time": "2026-01-01T00:00:00.125Z", "level": "WARNING",
        "logger": "watcher.dispatch.failures",
        "message": "action=item_failed partition=p attempts=3 error=line one\nline two",
        "action": "item_failed", "partition": "p", "attempts": 3,
        "error": "line one\nline two"}


def test_a_json_line_carries_the_traceback_as_a_string() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        exc_info = sys.exc_info()
    record = _record("action=hook_failed hook=%s", "item_outcome", level=logging.ERROR,
                     exc_info=exc_info)
    line = json.loads(JsonFormatter().format(record))
    assert line["hook"] == "item_outcome"
    assert line["exc_info"].startswith("Traceback (most recent call last):")
    assert line["exc_info"].endswith("RuntimeError: boom")


def test_utc_time_is_iso_with_milliseconds() -> None:
    assert utc_time(0) == "1970-01-01T00:00:00.000Z"
    assert utc_time(1_767_225_600.9999) == "2026-01-01T00:00:00.999Z"


def test_the_text_format_is_unchanged() -> None:
    text = formatter("text").format(_record("action=x a=%s", "b"))
    assert text.endswith(" WARNING watcher.dispatch.failures action=x a=b")
    with pytest.raises(ValueError, match="text, json"):
        formatter("yaml")


@pytest.fixture
def root_logging() -> Iterator[None]:
    """Put the root logger back as it was after a test that configures it."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_the_failure_lines(log_format: str, root_logging: None,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    setup_logging("info", log_format)
    setup_logging("info", log_format)  # a second call does not double the lines
    failures.item_failed("p", "a b", 2, 6, "HTTP 503\nbusy", pipeline="invoices")
    failures.partition_failed_at_items("p", 2, 3, failures.ItemFailure("a b", 6, "busy"),
                                       pipeline="invoices")
    failures.partition_failed_at_items("p", 2, 3, None, pipeline="invoices")
    failures.partition_failed_at_reduce("p", 4, 1, "refused", pipeline="invoices")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4
    if log_format == "text":
        assert (" WARNING watcher.dispatch.failures action=item_failed partition=p "
                "pipeline=invoices item=a b gate=2 attempts=6 error=HTTP 503 busy") in lines[0]
        assert " ERROR " in lines[1] and lines[1].endswith(
            "action=partition_closed partition=p pipeline=invoices status=failed gate=2 "
            "reason=item failed_items=3 item=a b attempts=6 error=busy")
        assert "could not be read" in lines[2]
        assert lines[3].endswith("reason=reduce attempts=1 error=refused")
        return
    records = [json.loads(line) for line in lines]
    assert [record["level"] for record in records] == ["WARNING", "ERROR", "ERROR", "ERROR"]
    assert {key: records[0][key] for key in ("partition", "pipeline", "item", "gate",
                                             "attempts", "error")} == {
        "partition": "p", "pipeline": "invoices", "item": "a b", "gate": 2, "attempts": 6,
        "error": "HTTP 503 busy"}
    assert (records[1]["reason"], records[1]["failed_items"], records[1]["item"]) == (
        "item", 3, "a b")
    assert (records[3]["reason"], records[3]["gate"], records[3]["error"]) == (
        "reduce", 4, "refused")


def test_one_line() -> None:
    assert failures.one_line("a\r\n  b\n\nc ") == "a b c"
    assert failures.one_line(None) == failures.one_line("") == failures.one_line("\n") == "-"


FORGED = "p1\n2026-01-01 00:00:00,000 ERROR watcher.dispatch.supervisor action=forged"


@pytest.mark.parametrize("value", [
    FORGED, "p\r\x1b[2J\x1b]0;title\x07", "a\x85b\x9bc\x7f", "x\u2028y", "\x00\t"])
def test_a_text_line_escapes_control_characters_in_the_message_and_fields(
        value: str) -> None:
    record = _record("action=item_failed partition=%s item=%r error=%s", value, value, value)
    record.name = "watcher." + value  # even the logger's name is data here
    text = formatter("text").format(record)
    assert len(text.splitlines()) == 1 and text.isprintable()
    assert " WARNING watcher." in text and "action=item_failed partition=" in text


def test_a_text_traceback_keeps_its_lines_each_indented_and_escaped() -> None:
    try:
        raise RuntimeError("boom\n2026-01-01 00:00:00,000 ERROR x forged\x1b[31m")
    except RuntimeError:
        exc_info = sys.exc_info()
    text = formatter("text").format(_record("action=hook_failed id=%s", "a\nb",
                                            level=logging.ERROR, exc_info=exc_info))
    first, *trace = text.splitlines()
    assert first.endswith("ERROR watcher.dispatch.failures action=hook_failed id=a\\nb")
    assert trace[0] == "    | Traceback (most recent call last):"
    assert all(line.startswith("    | ") and line.isprintable() for line in trace)
    assert trace[-1] == "    | 2026-01-01 00:00:00,000 ERROR x forged\\x1b[31m"


def test_the_json_format_keeps_data_as_it_was() -> None:
    line = JsonFormatter().format(_record("action=x id=%s", "a\nb\x1b"))
    assert json.loads(line)["id"] == "a\nb\x1b" and "\n" not in line


def _plain_record(message: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("watcher.x", logging.INFO, __file__, 1, message, args, None)


def test_a_record_inside_a_span_names_its_trace_and_span() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("call") as span:
        context = span.get_span_context()
        as_json = json.loads(JsonFormatter().format(_plain_record("action=x partition=%s", "p")))
        as_text = TextFormatter().format(_plain_record("action=x partition=%s", "p"))
    trace_id = trace.format_trace_id(context.trace_id)
    span_id = trace.format_span_id(context.span_id)
    assert (as_json["trace_id"], as_json["span_id"]) == (trace_id, span_id)
    assert as_json["partition"] == "p"
    assert as_text.endswith(f"action=x partition=p trace_id={trace_id} span_id={span_id}")
    outside = json.loads(JsonFormatter().format(_plain_record("action=x")))
    assert "trace_id" not in outside and "trace_id" not in TextFormatter().format(
        _plain_record("action=x")), "no span, no trace fields"
