"""The values the processor side of the handler contract is made of: a handler's reply,
what a call's failure is, the strict JSON decoder every answer goes through, how
messages show a value, and how stored bytes show as a JSON value (the ingest API's
answers and the live feed's events). Pure: no I/O.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from watcher.text import shorten

# A Retry-After beyond this is taken as this: a day is already "much later".
MAX_RETRY_AFTER: Final = 86_400.0
MAX_ERROR_MESSAGE_CHARS: Final = 1000
ERROR_EXCERPT_CHARS: Final = 200
EXCERPT_SCAN_BYTES: Final = 64 * 1024
SHOWN_VALUE_CHARS = 60

Mask = Callable[[str], str]
"""Hides secrets in a text (a :class:`processor.observe.redact.Scrubber`)."""

Clock = Callable[[], float]
"""Unix seconds now; read only to resolve a ``Retry-After`` date."""


def unchanged(text: str) -> str:
    """``text`` as it is: the mask when there is no secret to hide."""
    return text


@dataclass(frozen=True, slots=True)
class Reply:
    """A handler's answer: status, ``Retry-After`` and the body (``None``: over the limit)."""

    status: int
    retry_after: str | None
    body: bytes | None


class MalformedResponseError(ValueError):
    """The handler's answer breaks the contract; the message says how."""


@dataclass(frozen=True, slots=True)
class HandlerError:
    """An error the handler reported (or the text of an error answer without one)."""

    message: str
    no_retry: bool = False


@dataclass(frozen=True, slots=True)
class Failure:
    """Why one call failed: the reason, and whether and when to retry."""

    retryable: bool
    reason: str
    retry_after: float | None = None
    # The handler asked for fewer calls (429 or 503 with Retry-After): every call to it
    # waits, fleet-wide, and the item loses no attempt.
    throttled: bool = False
    # No answer came from the handler's service (refused, reset, unresolvable, a connect
    # timeout, a proxy's 502/503/504): an outage, the fleet's problem and not the item's.
    unanswered: bool = False

    def prefixed(self, context: str) -> Failure:
        """This failure with ``"<context>: "`` before its reason."""
        return Failure(self.retryable, f"{context}: {self.reason}", self.retry_after,
                       self.throttled, self.unanswered)


# --------------------------------------------------------------------------- JSON


def _refuse_constant(name: str) -> Any:
    raise MalformedResponseError(f"is not valid JSON ({name} is not a JSON number)")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise MalformedResponseError(
            f"has a number out of range: {shorten(text, SHOWN_VALUE_CHARS)} "
            "overflows a 64-bit float")
    return value


class RepeatedKeyError(MalformedResponseError):
    """A JSON object has the same key twice: which value counts is not obvious."""

    def __init__(self, key: str, what: str = "") -> None:
        super().__init__(f"{what}{' ' if what else ''}has the key {key!r} twice in one "
                         "object; give each key once")
        self.key = key


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document: dict[str, Any] = {}
    for key, value in pairs:
        if key in document:
            raise RepeatedKeyError(key)
        document[key] = value
    return document


# How a decoded "data" value is stored: compact UTF-8 JSON.
DATA_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
# The one JSON decoder of every answer: strict where Python's default is not.
_DECODER: Final = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)
# The same, refusing an object with a repeated key (what the ingest API takes).
_UNIQUE_KEYS_DECODER: Final = json.JSONDecoder(
    parse_constant=_refuse_constant, parse_float=_finite_float,
    object_pairs_hook=_unique_object)


def decode_json(body: bytes, what: str = "the body", *, unique_keys: bool = False) -> Any:
    """Decode a JSON answer body strictly (UTF-8, -16 or -32, as :func:`json.loads`);
    ``what`` names it in messages (``"line 7"``). With ``unique_keys``, an object
    with a repeated key is refused (:class:`RepeatedKeyError`, naming the key).

    ``NaN``, ``Infinity`` and ``-Infinity`` are refused (they are not JSON), as
    are numbers that overflow a float (``1e999``), integers over Python's digit
    limit, and nesting too deep to decode.

    Raises:
        MalformedResponseError: the body is not such JSON; the message says why.
            Never ``RecursionError``.
    """
    decoder = _UNIQUE_KEYS_DECODER if unique_keys else _DECODER
    try:
        return decoder.decode(body.decode(json.detect_encoding(body), "surrogatepass"))
    except RepeatedKeyError as error:
        raise RepeatedKeyError(error.key, what) from None
    except MalformedResponseError as error:  # from the hooks: says what, not whose
        raise MalformedResponseError(f"{what} {error}") from None
    except RecursionError:
        raise MalformedResponseError(f"{what} is nested too deeply to parse") from None
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, the digit limit
        raise MalformedResponseError(f"{what} is not valid JSON ({error})") from None


# A \uD800-\uDFFF escape: a JSON text holding one may decode to an unpaired surrogate,
# which no UTF-8 answer can carry.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def data_value(data: bytes, name: str = "data") -> dict[str, Any]:
    """``{name: value}`` when ``data`` is UTF-8 JSON an answer can carry (no ``NaN``, no
    number out of a float's range, no unpaired surrogate), else ``{name_b64: text}``."""
    try:
        data.decode("utf-8")
        value = decode_json(data)
        if _SURROGATE_ESCAPE.search(data):
            DATA_ENCODER.encode(value).encode()
    except (MalformedResponseError, ValueError):  # UnicodeError is a ValueError
        return {f"{name}_b64": base64.b64encode(data).decode("ascii")}
    return {name: value}


def json_type(value: Any) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"


def dump_value(value: Any) -> str | None:
    # A decoded value nested nearly as deep as the decoder allows may be too
    # deep to encode again from a deeper stack.
    try:
        return json.dumps(value, ensure_ascii=False)
    except (RecursionError, ValueError, TypeError):
        return None


def show_value(value: Any) -> str:
    return shorten(dump_value(value) or f"a deeply nested {json_type(value)}", SHOWN_VALUE_CHARS)
