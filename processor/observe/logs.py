"""The processor's log output: one line per record, as text or as JSON.

The engine logs state changes as ``action=<name> key=value ...`` lines
(``log.info("action=lease_acquired partition=%s owner=%s", pid, owner)``).
:class:`JsonFormatter` writes each record as one JSON object per line, with
``time`` (UTC, ISO 8601), ``level``, ``logger`` and ``message``, the traceback
of an exception as ``exc_info`` (a string), and the ``key=value`` fields of the
message as fields of their own.

The fields are read from the record's *template* and arguments, never by
re-parsing the formatted text: in ``partition=%s`` the field ``partition`` is
the argument itself, whatever spaces or ``=`` signs it holds (a string stays a
string, a number a number, a float as precise as its conversion shows it; an
object that is not a JSON value is shown as its conversion, ``%r`` or ``%s``,
formats it). A literal ``key=value`` of the
template (``action=lease_acquired``) is a string field. A value that mixes
text and arguments (``gate=%d%s``) is no field: it stays in ``message`` only,
as does a key that would overwrite one of the record's own (``time``,
``level``, ``logger``, ``message``, ``exc_info``, ``stack_info``). Pure
string work: :func:`message_fields` is unit-tested without a handler.

:class:`TextFormatter` writes ``time LEVEL logger message`` with every control
character of the record escaped (:func:`processor.observe.safe_text.escape_controls`): a
newline in a partition id or a handler's error cannot start a line of its own, and
no escape byte reaches the terminal or file. A traceback keeps its lines, each
escaped and indented, so none of them reads as a record. JSON needs no such step:
its strings escape control characters already.

A record logged inside an OpenTelemetry span (a handler call's, a completion's) carries
the span's ``trace_id`` and ``span_id`` (hex, as a trace backend shows them): fields of
their own in JSON, ``trace_id=… span_id=…`` at the end of a text line, so that a log
line leads to its trace. Only when OpenTelemetry is loaded already (tracing is on);
nothing is imported for it.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
import time
from collections.abc import Mapping
from typing import Any, Final

from processor.observe.safe_text import escape_controls

LOG_FORMATS: Final = ("text", "json")
DEFAULT_LOG_FORMAT: Final = "text"
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s %(message)s"
RESERVED_KEYS: Final = frozenset({"time", "level", "logger", "message", "exc_info",
                                  "stack_info"})

# A printf conversion of a logging template (%s, %-5d, %.2f, %(name)s, %%).
_SPEC = re.compile(r"%(?:\((?P<name>[^)]*)\))?[#0\- +]*(?P<width>\*|\d+)?"
                   r"(?:\.(?P<precision>\*|\d+))?[hlL]?(?P<kind>[diouxXeEfFgGcrsa%])")
# A key=value token: the key starts a word; the value runs to whitespace, or to a
# ';', ',' or ')' that ends it (``error=%s; retrying``).
_TOKEN = re.compile(r"(?:^|(?<=[\s(]))(?P<key>[A-Za-z_][A-Za-z0-9_.]*)="
                    r"(?P<value>%\([^)]*\)[^\s;,)]*|[^\s;,)]+)")
_JSON_SCALARS = (str, int, float, bool, type(None))


def message_fields(template: object, args: Any) -> dict[str, Any]:
    """The ``key=value`` fields of a log record's template ``template`` with its ``args``
    (see the module's docstring). Never raises: a template that does not match its
    arguments has no fields."""
    if not isinstance(template, str) or "=" not in template:
        return {}
    try:
        return _fields(template, args)
    except (TypeError, ValueError, KeyError, IndexError):
        return {}


def _fields(template: str, args: Any) -> dict[str, Any]:
    """Raises TypeError, ValueError, KeyError or IndexError when ``args`` does not fit."""
    named = isinstance(args, Mapping)
    positional: tuple[Any, ...] = () if named or args is None else tuple(args)
    values: dict[int, tuple[str, Any]] = {}  # a conversion's start -> (its text, its value)
    index = 0
    for spec in _SPEC.finditer(template):
        if spec["kind"] == "%":
            continue
        if spec["width"] == "*" or spec["precision"] == "*":
            return {}  # the star takes an argument of its own: not worth following
        if spec["name"] is not None:
            if not named:
                return {}
            value = args[spec["name"]]
        else:
            value = positional[index]
            index += 1
        values[spec.start()] = (spec.group(0), value)
    if not named and index != len(positional):
        return {}  # logging could not format it either
    fields: dict[str, Any] = {}
    for token in _TOKEN.finditer(template):
        key, text = token["key"], token["value"]
        if key in RESERVED_KEYS or key in fields:
            continue
        start = token.start("value")
        if "%" not in text:
            fields[key] = text
        elif start in values and values[start][0] == text:
            fields[key] = _json_value(text, values[start][1])
    return fields


def _json_value(spec: str, value: Any) -> Any:
    """``value`` as a JSON field: itself when JSON has it, else as ``spec`` formats it."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)  # NaN and infinities are not JSON
        if spec[-1] in "eEfFgG":  # the precision the text shows: 2.7 s, not 2.6713420220
            return float(spec % (value,))
    if isinstance(value, _JSON_SCALARS):
        return value
    return spec % (value,)


def utc_time(created: float) -> str:
    """``created`` (Unix seconds) as UTC ISO 8601 with milliseconds:
    ``2025-01-31T09:30:00.125Z``."""
    whole = int(created)
    millis = min(999, int((created - whole) * 1000))
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{millis:03d}Z"


def trace_fields() -> dict[str, str]:
    """The ``trace_id`` and ``span_id`` of the OpenTelemetry span current where the record
    is formatted (the logging call's, as a stream handler formats in place); empty when
    there is none, or when OpenTelemetry was never imported (tracing off)."""
    if "opentelemetry.trace" not in sys.modules:
        return {}
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": trace.format_trace_id(context.trace_id),
            "span_id": trace.format_span_id(context.span_id)}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (see the module's docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON. Never raises for a record logging accepts."""
        line: dict[str, Any] = {
            "time": utc_time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(message_fields(record.msg, record.args))
        line.update(trace_fields())
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc_info"] = record.exc_text
        if record.stack_info:
            line["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``time LEVEL logger message``, one line per record, with control characters
    escaped in the message and every field (see the module's docstring)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        """The record as one escaped line, and its traceback (if any) as indented,
        escaped lines below it. Never raises for a record logging accepts."""
        record.message = record.getMessage()
        record.asctime = self.formatTime(record, self.datefmt)
        traced = "".join(f" {key}={value}" for key, value in trace_fields().items())
        lines = [escape_controls(self.formatMessage(record)) + traced]
        # Formatted here, not read from record.exc_text: another handler's formatter
        # may have cached it unescaped.
        if record.exc_info:
            lines.append(_indented(self.formatException(record.exc_info)))
        elif record.exc_text:
            lines.append(_indented(record.exc_text))
        if record.stack_info:
            lines.append(_indented(self.formatStack(record.stack_info)))
        return "\n".join(lines)


TRACE_INDENT: Final = "    | "


def _indented(text: str) -> str:
    return "\n".join(TRACE_INDENT + escape_controls(line) for line in text.splitlines())


def formatter(log_format: str) -> logging.Formatter:
    """The formatter of ``log_format``: ``text`` (``time LEVEL logger message``) or ``json``.

    Raises:
        ValueError: ``log_format`` is not one of :data:`LOG_FORMATS`.
    """
    if log_format == "json":
        return JsonFormatter()
    if log_format == "text":
        return TextFormatter()
    raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")


def setup_logging(level: str, log_format: str = DEFAULT_LOG_FORMAT) -> None:
    """Send every record at ``level`` or above to stderr, one line each, as ``log_format``.

    Replaces the root logger's handlers (a second call does not double the lines).

    Raises:
        ValueError: ``log_format`` is not one of :data:`LOG_FORMATS`.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format))
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        handlers=[handler], force=True)
    # httpx logs each request URL at INFO; keep the processor's lines readable.
    logging.getLogger("httpx").setLevel(logging.WARNING)
