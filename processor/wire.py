"""The processor side of the HTTP handler contract, as pure functions.

The handler side is :mod:`handlers.wire`. Nothing here does I/O: the classes
in :mod:`processor.http_processor` and :mod:`processor.http_batch` move bytes
between these functions and a :mod:`processor.transports` sender, so every
rule of the contract is tested with plain values.

The contract itself (per-item, batched and reduce requests, answers, errors, what
is malformed) is stated once, in ``docs/reference/http-contract.md``; this module
is its processor side, rule for rule.

A call's outcome travels as a value: a :class:`Result` or a :class:`Failure`.
:func:`decode_reply` turns any :class:`Reply` into a decoded JSON document or
a :class:`Failure`, the one step every kind of call shares; :func:`read_answer`
turns one answer object into a :class:`Result` or a :class:`Failure`; and
:func:`item_error` turns a :class:`Failure` into the engine's
:class:`RetryableError` or :class:`NonRetryableError`, naming the item.
"""

from __future__ import annotations

import base64
import binascii
import email.utils
import json
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import Any, Final
from urllib.parse import quote

from watcher.models import MAX_GATE
from watcher.protocol import (
    NonRetryableError,
    ProcessorError,
    ReduceCall,
    ReduceResult,
    Result,
    RetryableError,
    WorkItem,
)
from watcher.records import NewItem
from watcher.text import shorten

# A Retry-After beyond this is taken as this: a day is already "much later".
MAX_RETRY_AFTER: Final = 86_400.0
MAX_ERROR_MESSAGE_CHARS: Final = 1000
ERROR_EXCERPT_CHARS: Final = 200
EXCERPT_SCAN_BYTES: Final = 64 * 1024
_SHOWN_VALUE_CHARS = 60

ITEM_CONTENT_TYPE: Final = "application/octet-stream"
JSON_CONTENT_TYPE: Final = "application/json"
# What a per-item answer (and each batch entry) should look like, for messages.
ITEM_ANSWER: Final = 'a JSON object such as {"gate": 2, "done": false}'

# Ids made of these are sent as they are; "%" is excluded so that decoding is
# never ambiguous.
_PLAIN_HEADER_VALUE = re.compile(r"[\x21-\x24\x26-\x7e]*")
_DELTA_SECONDS = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,6})?")

Mask = Callable[[str], str]
"""Hides secrets in a text (a :class:`processor.redact.Scrubber`)."""

Clock = Callable[[], float]
"""Unix seconds now; read only to resolve a ``Retry-After`` date."""


def _unchanged(text: str) -> str:
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

    def prefixed(self, context: str) -> Failure:
        """This failure with ``"<context>: "`` before its reason."""
        return Failure(self.retryable, f"{context}: {self.reason}", self.retry_after)


_LOOP: Final = Result()
_NO_FIELDS: Final[dict[str, Any]] = {}  # what an empty per-item body stands for; read only


# --------------------------------------------------------------------------- requests


def header_safe(value: str) -> str:
    """``value`` as an HTTP header value: unchanged if plain visible ASCII without ``%``,
    else percent-encoded (UTF-8, ``urllib.parse.quote(value, safe="")``).

    Raises:
        UnicodeEncodeError: ``value`` holds an unpaired surrogate.
    """
    if _PLAIN_HEADER_VALUE.fullmatch(value):
        return value
    return quote(value, safe="")


def item_headers(item: WorkItem) -> dict[str, str]:
    """The headers of a per-item request (its body is ``item.data`` unchanged).

    Raises:
        UnicodeEncodeError: an id or the key holds an unpaired surrogate.
    """
    return {
        "Content-Type": ITEM_CONTENT_TYPE,
        "X-Partition-Id": header_safe(item.partition_id),
        "X-Item-Id": header_safe(item.id),
        "X-Gate": str(item.gate),
        "X-Attempt": str(item.attempt),
        "Idempotency-Key": header_safe(item.idempotency_key),
    }


def json_headers() -> dict[str, str]:
    """The headers of a request whose body is JSON (a batch)."""
    return {"Content-Type": JSON_CONTENT_TYPE}


# One encoder for every request body: json.dumps() with options builds one per call.
# ASCII escapes keep any str encodable, unpaired surrogates included.
_REQUEST_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def encode_json(document: Any) -> bytes:
    """A JSON request body, compact ASCII.

    Raises:
        TypeError: ``document`` holds a value JSON cannot carry.
        ValueError: ``document`` holds ``NaN`` or an infinity, or a circular reference.
    """
    return _REQUEST_ENCODER.encode(document).encode("ascii")


def encode_b64(data: bytes) -> str:
    """``data`` as standard base64 with padding, the form ``data_b64`` fields carry."""
    return base64.b64encode(data).decode("ascii")


def batch_entry(item: WorkItem) -> dict[str, Any]:
    """One entry of a batch request."""
    return {"partition_id": item.partition_id, "item_id": item.id, "gate": item.gate,
            "attempt": item.attempt, "idempotency_key": item.idempotency_key,
            "data_b64": encode_b64(item.data)}


def encode_batch(items: Sequence[WorkItem]) -> bytes:
    """The body of a batch request: a JSON array of :func:`batch_entry` objects."""
    return encode_json([batch_entry(item) for item in items])


# --------------------------------------------------------------------------- JSON


def _refuse_constant(name: str) -> Any:
    raise MalformedResponseError(f"the body is not valid JSON ({name} is not a JSON number)")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise MalformedResponseError(
            f"the body has a number out of range: {shorten(text, _SHOWN_VALUE_CHARS)} "
            "overflows a 64-bit float")
    return value


# How a decoded "data" value is stored: compact UTF-8 JSON.
_DATA_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
# The one JSON decoder of every answer: strict where Python's default is not.
_DECODER: Final = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)


def decode_json(body: bytes) -> Any:
    """Decode a JSON answer body strictly (UTF-8, -16 or -32, as :func:`json.loads`).

    ``NaN``, ``Infinity`` and ``-Infinity`` are refused (they are not JSON), as
    are numbers that overflow a float (``1e999``), integers over Python's digit
    limit, and nesting too deep to decode.

    Raises:
        MalformedResponseError: the body is not such JSON; the message says why.
            Never ``RecursionError``.
    """
    try:
        return _DECODER.decode(body.decode(json.detect_encoding(body), "surrogatepass"))
    except MalformedResponseError:
        raise
    except RecursionError:
        raise MalformedResponseError("the body is nested too deeply to parse") from None
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, the digit limit
        raise MalformedResponseError(f"the body is not valid JSON ({error})") from None


# --------------------------------------------------------------------------- answers


def parse_success_body(body: bytes, mask: Mask = _unchanged) -> Result | HandlerError:
    """Map the body of a 2xx per-item answer to a :class:`Result`.

    An empty (or blank) body is ``Result()``. A body whose ``error`` is set is an
    error report and comes back as a :class:`HandlerError`.

    Raises:
        MalformedResponseError: the body is not a JSON object, or a field has the
            wrong type or value.
    """
    if not body or body.isspace():
        return _LOOP
    return parse_answer(decode_json(body), mask)


def parse_answer(document: Any, mask: Mask = _unchanged) -> Result | HandlerError:
    """Map one decoded answer object to a :class:`Result` or a :class:`HandlerError`.

    Shared by the per-item body, each entry of a batch answer, and any call
    whose answer carries per-item answer objects.

    Raises:
        MalformedResponseError: not an object, or a field has the wrong type or value.
    """
    if not isinstance(document, dict):
        raise MalformedResponseError(
            f"the answer is a JSON {_json_type(document)}, not an object")
    error = document.get("error")
    if error is not None:
        return parse_handler_error(error, mask)
    gate = document.get("gate")
    if gate is not None:
        if type(gate) is not int:
            raise MalformedResponseError(
                f"'gate' must be a non-negative integer, got {_show(gate)}")
        if not 0 <= gate <= MAX_GATE:
            raise MalformedResponseError(
                f"'gate' must be a non-negative integer up to {MAX_GATE}, got {gate}")
    done = document.get("done")
    if done is None:
        done = False
    elif type(done) is not bool:
        raise MalformedResponseError(f"'done' must be true or false, got {_show(done)}")
    data = _answer_data(document, "")
    spawn = parse_spawn(document["spawn"]) if document.get("spawn") is not None else ()
    return Result(gate=gate, done=done, data=data, spawn=spawn)


def _answer_data(document: dict[str, Any], where: str) -> bytes | None:
    """The bytes an answer object's ``data`` (any JSON value, stored as its compact
    encoding: ``null`` too) or ``data_b64`` (standard base64) carries; ``None`` when
    it has neither. ``where`` starts each message (such as ``"spawn[2]: "``).

    Raises:
        MalformedResponseError: both are set, or the value cannot be stored.
    """
    encoded = document.get("data_b64")
    if "data" in document:
        if encoded is not None:
            raise MalformedResponseError(
                f"{where}both 'data' and 'data_b64' are set; set one of them")
        try:
            return _DATA_ENCODER.encode(document["data"]).encode()
        except UnicodeEncodeError:
            raise MalformedResponseError(
                f"{where}'data' contains an unpaired UTF-16 surrogate escape") from None
        except RecursionError:
            raise MalformedResponseError(f"{where}'data' is nested too deeply to store") from None
    if encoded is None:
        return None
    if not isinstance(encoded, str):
        raise MalformedResponseError(
            f"{where}'data_b64' must be a base64 string, got {_show(encoded)}")
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedResponseError(
            f"{where}'data_b64' is not valid base64 (standard alphabet, with = padding)"
        ) from None


SPAWN_FIELDS: Final = frozenset({"id", "gate", "data", "data_b64"})


def parse_spawn(value: Any) -> tuple[NewItem, ...]:
    """An answer's ``spawn``: a JSON array of ``{"id", "gate"?, "data" | "data_b64"}``
    objects, as the :class:`NewItem` values the engine inserts (a missing or ``null``
    gate is ``None``: the engine's default). Only the shape is checked here; the id
    rules, the count limit, repeats and gates are the engine's
    (:func:`watcher.spawning.spawn_problem`), the same for every kind of answer.

    Raises:
        MalformedResponseError: not an array, an entry not an object, an unknown
            key (a typo such as ``"gates"`` is caught), a missing or non-string id,
            a bad gate, or neither or both of ``data`` and ``data_b64``.
    """
    if not isinstance(value, list):
        raise MalformedResponseError(
            f"'spawn' must be an array of new items, got {_show(value)}")
    children: list[NewItem] = []
    for position, entry in enumerate(value):
        where = f"spawn[{position}]: "
        if not isinstance(entry, dict):
            raise MalformedResponseError(
                f"{where}each new item must be an object such as "
                f'{{"id": "a", "data": {{}}}}, got {_show(entry)}')
        unknown = sorted(set(entry) - SPAWN_FIELDS)
        if unknown:
            raise MalformedResponseError(
                f"{where}unknown key {_show(unknown[0])}; a new item has 'id', 'gate', "
                "and 'data' or 'data_b64'")
        item_id = entry.get("id")
        if not isinstance(item_id, str):
            raise MalformedResponseError(f"{where}'id' must be a string, got {_show(item_id)}")
        gate = entry.get("gate")
        if gate is not None and (type(gate) is not int or not 0 <= gate <= MAX_GATE):
            raise MalformedResponseError(
                f"{where}'gate' must be an integer from 0 to {MAX_GATE}, got {_show(gate)}")
        data = _answer_data(entry, where)
        if data is None:
            raise MalformedResponseError(
                f"{where}a new item needs its content: set 'data' (any JSON value) or "
                "'data_b64'")
        children.append(NewItem(item_id, data, gate))
    return tuple(children)


def parse_handler_error(value: Any, mask: Mask = _unchanged) -> HandlerError:
    """The handler's ``"error"`` value: ``{"message": str, "no_retry": bool}`` or a string.

    The message is masked, then cut to :data:`MAX_ERROR_MESSAGE_CHARS`; a
    message that is not a string is shown as JSON.

    Raises:
        MalformedResponseError: ``value`` is neither an object nor a string.
    """
    reported = _handler_error(value, mask)
    if reported is None:
        raise MalformedResponseError(
            f"'error' must be an object or a string, got {_show(value)}")
    return reported


def parse_error_body(body: bytes, mask: Mask = _unchanged) -> HandlerError:
    """The handler's error from the body of a non-2xx answer. Never raises.

    A body without the error object (a proxy's HTML page, plain text) is kept as a
    short excerpt in the message. ``mask`` hides secrets in the handler's text
    *before* it is shortened, so a cut never leaves part of a secret behind.
    """
    if not body or body.isspace():
        return HandlerError("")
    try:
        document = decode_json(body)
    except MalformedResponseError:
        return HandlerError(_excerpt(body, mask))
    if isinstance(document, dict) and document.get("error") is not None:
        reported = _handler_error(document["error"], mask)
        if reported is not None:
            return reported
    return HandlerError(_excerpt(body, mask))


def classify_error(status: int, error: HandlerError, *, retry_after: str | None = None,
                   now: float) -> Failure:
    """Decide what an error answer means for the item. Never raises.

    ``no_retry`` (any status), a 3xx and a 4xx other than 408 and 429 are final;
    everything else is retryable. ``retry_after`` (the header) counts on 429 and
    503 only; ``now`` (Unix seconds) resolves an HTTP-date in it.
    """
    detail = f": {error.message}" if error.message else " with no error message"
    if 200 <= status < 300:
        reason = f"the handler reported an error (HTTP {status}){detail}"
    else:
        reason = f"the handler answered HTTP {status}{detail}"
    if error.no_retry:
        return Failure(False, f"{reason} (no_retry set: not retried)")
    if 300 <= status < 400:
        return Failure(False, f"{reason}; redirects are not followed: set the handler URL "
                              "to the final address")
    if 400 <= status < 500 and status not in (408, 429):
        return Failure(False, reason)
    delay = None
    if status in (429, 503) and retry_after:
        delay = parse_retry_after(retry_after, now=now)
    return Failure(True, reason, delay)


def parse_retry_after(value: str, *, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` value: delta-seconds or an HTTP-date.

    A date in the past gives 0; anything over :data:`MAX_RETRY_AFTER` gives that.
    Returns ``None`` for a value that is neither. Never raises.
    """
    value = value.strip()
    if _DELTA_SECONDS.fullmatch(value):
        seconds = float(value)
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:  # "-0000": UTC by RFC 5322
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - now
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


# --------------------------------------------------------------------------- replies


def malformed(status: int, problem: str, expected: str) -> Failure:
    """The retryable failure of an answer that breaks the contract, in the one wording."""
    return Failure(True, f"malformed answer (HTTP {status}): {problem}; expected {expected}")


def decode_reply(reply: Reply, *, expected: str, max_bytes: int, mask: Mask = _unchanged,
                 clock: Clock = time.time, empty: Any = None) -> Any | Failure:
    """The decoded JSON document of a 2xx reply, or the :class:`Failure` the reply is.

    The step every kind of call shares: a non-2xx reply is classified
    (:func:`parse_error_body`, :func:`classify_error`); a 2xx reply over
    ``max_bytes`` (``body is None``) or not strict JSON (:func:`decode_json`) is
    a retryable malformed answer. ``expected`` says in messages what the
    document should have been. An empty 2xx body is ``empty`` when that is not
    ``None``, and malformed otherwise. The document's shape is the caller's
    to check. Never raises.
    """
    status, body = reply.status, reply.body
    if 200 <= status < 300:
        if body is None:
            return Failure(True, f"malformed answer (HTTP {status}): the body is larger than "
                                 f"max_response_bytes ({max_bytes} bytes); an answer that "
                                 "spawns many items pages them: spawn a slice and answer "
                                 "the same gate, not done, with a cursor in its data")
        if not body or body.isspace():
            return empty if empty is not None else malformed(status, "the body is empty",
                                                             expected)
        try:
            return decode_json(body)
        except MalformedResponseError as problem:
            return malformed(status, str(problem), expected)
    if body is None:
        reported = HandlerError(f"(the error body is larger than {max_bytes} bytes)")
    else:
        reported = parse_error_body(body, mask)
    return classify_error(status, reported, retry_after=reply.retry_after, now=clock())


def read_answer(entry: Any, status: int, *, mask: Mask = _unchanged, clock: Clock = time.time,
                where: str = "") -> Result | Failure:
    """One answer object of a ``status`` reply as a :class:`Result` or a :class:`Failure`.

    A reported error is classified with ``status``; a malformed object is a
    retryable failure whose message starts with ``where`` (such as ``"batch
    entry 3: "``). Never raises.
    """
    try:
        outcome = parse_answer(entry, mask)
    except MalformedResponseError as problem:
        return malformed(status, f"{where}{problem}", ITEM_ANSWER)
    if isinstance(outcome, Result):
        return outcome
    return classify_error(status, outcome, now=clock())


def read_item_reply(reply: Reply, *, max_bytes: int, mask: Mask = _unchanged,
                    clock: Clock = time.time) -> Result | Failure:
    """A per-item reply as the item's :class:`Result` or the call's :class:`Failure`.

    An empty 2xx body is ``Result()`` (a loop). Never raises.
    """
    document = decode_reply(reply, expected=ITEM_ANSWER, max_bytes=max_bytes, mask=mask,
                            clock=clock, empty=_NO_FIELDS)
    if isinstance(document, Failure):
        return document
    return read_answer(document, reply.status, mask=mask, clock=clock)


def batch_answer(count: int) -> str:
    """What the answer to a batch of ``count`` items should be, for messages."""
    return f"a JSON array of {count} answers, one per item of the batch in request order"


def read_batch_reply(reply: Reply, count: int, *, max_bytes: int, mask: Mask = _unchanged,
                     clock: Clock = time.time) -> list[Result | Failure] | Failure:
    """A batch reply as one :class:`Result` or :class:`Failure` per item, in request order.

    Returns a single :class:`Failure` when the whole reply fails (a non-2xx, a
    body that is not strict JSON, over the limit, or not an array of ``count``
    entries): it is every item's failure. Never raises.
    """
    expected = batch_answer(count)
    document = decode_reply(reply, expected=expected, max_bytes=max_bytes, mask=mask,
                            clock=clock)
    if isinstance(document, Failure):
        return document
    if not isinstance(document, list) or len(document) != count:
        shape = (f"an array of {len(document)}" if isinstance(document, list)
                 else f"a JSON {_json_type(document)}")
        return malformed(reply.status, f"the body is {shape}", expected)
    return [read_answer(entry, reply.status, mask=mask, clock=clock,
                        where=f"batch entry {position}: ")
            for position, entry in enumerate(document)]


# --------------------------------------------------------------------------- reduce

REDUCE_ANSWER: Final = ('a JSON object such as {"items": {"<item id>": {"done": true}}, '
                        '"default": {"gate": 2}, "result": {...}}')
FOLD_ANSWER: Final = 'a JSON object such as {"accumulator": ...} (and "result" on any page)'


def reduce_headers(call: ReduceCall) -> dict[str, str]:
    """The headers of a reduce request (its body is :func:`encode_reduce`).

    Raises:
        UnicodeEncodeError: the partition id or the key holds an unpaired surrogate.
    """
    return {
        "Content-Type": JSON_CONTENT_TYPE,
        "X-Partition-Id": header_safe(call.partition_id),
        "X-Gate": str(call.gate),
        "X-Attempt": str(call.attempt),
        "Idempotency-Key": header_safe(call.idempotency_key),
    }


def encode_reduce(call: ReduceCall) -> bytes:
    """The JSON body of a reduce request.

    ``{"partition_id", "gate", "attempt", "pass", "page", "last",
    "idempotency_key", "accumulator", "items": [{"item_id", "status", "gate",
    "last_error", "data_b64"}, ...]}``; the accumulator is the JSON value the
    handler returned (``null`` before the first fold page), its stored text
    sent as it is (UTF-8). :func:`watcher.reduction.reduce_request_bytes`
    says the body's size to the byte, for the page cut.

    Raises:
        ValueError: the stored accumulator is not JSON (it always is when the
            processor stored it from an answer).
    """
    accumulator = b"null"
    if call.accumulator is not None:
        json.loads(call.accumulator)  # refuse a value that is not JSON (library mode)
        accumulator = call.accumulator
    head = encode_json({
        "partition_id": call.partition_id, "gate": call.gate, "attempt": call.attempt,
        "pass": call.pass_, "page": call.page, "last": call.last,
        "idempotency_key": call.idempotency_key, "accumulator": None,
    })
    items = encode_json([{"item_id": item.id, "status": item.status, "gate": item.gate,
                          "last_error": item.last_error, "data_b64": encode_b64(item.data)}
                         for item in call.items])
    return b"".join((head[:-len(b"null}")], accumulator, b',"items":', items, b"}"))


def read_reduce_reply(reply: Reply, call: ReduceCall, *, max_bytes: int,
                      mask: Mask = _unchanged, clock: Clock = time.time
                      ) -> ReduceResult | Failure:
    """A reduce reply as the :class:`ReduceResult` it carries, or the call's :class:`Failure`.

    The answer is a JSON object: ``items`` (item id to a per-item answer
    object), ``default`` (a per-item answer object), ``result`` or
    ``result_b64`` (the partition result), and for a fold page ``accumulator``
    (required, any JSON value); ``spawn`` (new items at later gates, not on a
    fold page). ``error`` reports a failure as in the per-item contract.
    Whether the ids and gates fit the request is the engine's check
    (:func:`watcher.reduction.reduce_step`). Never raises.
    """
    folding = call.pass_ == "fold"
    expected = FOLD_ANSWER if folding else REDUCE_ANSWER
    document = decode_reply(reply, expected=expected, max_bytes=max_bytes, mask=mask,
                            clock=clock)
    if isinstance(document, Failure):
        return document
    status = reply.status
    if not isinstance(document, dict):
        return malformed(status, f"the body is a JSON {_json_type(document)}", expected)
    if document.get("error") is not None:
        try:
            reported = parse_handler_error(document["error"], mask)
        except MalformedResponseError as problem:
            return malformed(status, str(problem), expected)
        return classify_error(status, reported, now=clock())
    try:
        return _reduce_result(document, folding)
    except MalformedResponseError as problem:
        return malformed(status, str(problem), expected)


def _reduce_result(document: dict[str, Any], folding: bool) -> ReduceResult:
    answers = document.get("items")
    if answers is None:
        answers = {}
    if not isinstance(answers, dict):
        raise MalformedResponseError(
            f"'items' must be an object mapping item ids to answers, got {_show(answers)}")
    items: dict[str, Result] = {}
    for item_id, answer in answers.items():
        items[item_id] = _reduce_item_answer(f"'items'[{_show(item_id)}]", answer)
    default = document.get("default")
    default_result = (None if default is None
                      else _reduce_item_answer("'default'", default))
    result = _bytes_field(document, "result", "result_b64")
    accumulator: bytes | None = None
    if folding:
        if "accumulator" not in document:
            raise MalformedResponseError(
                "a fold answer must carry 'accumulator' (null is allowed): the next page "
                "is sent with it; a handler whose reduce takes the whole gate at once "
                "cannot serve a gate of more than one page")
        accumulator = _encode_value("accumulator", document["accumulator"])
    spawn: tuple[NewItem, ...] = ()
    if document.get("spawn") is not None:
        if folding:
            raise MalformedResponseError(
                "a fold page may not spawn items; spawn from the apply pass, or from a "
                "reduce that answers the whole gate at once")
        spawn = parse_spawn(document["spawn"])
    return ReduceResult(items=items, default=default_result, result=result,
                        accumulator=accumulator, spawn=spawn)


def _reduce_item_answer(where: str, answer: Any) -> Result:
    try:
        parsed = parse_answer(answer)
    except MalformedResponseError as problem:
        raise MalformedResponseError(f"{where}: {problem}") from None
    if isinstance(parsed, HandlerError):
        raise MalformedResponseError(
            f"{where} is an error; a reduce fails or succeeds as a whole: answer the "
            "reduce with an error instead")
    if parsed.spawn:
        raise MalformedResponseError(
            f"{where} spawns items; in a reduce, spawn from the answer's top-level 'spawn'")
    return parsed


def _bytes_field(document: dict[str, Any], name: str, b64_name: str) -> bytes | None:
    encoded = document.get(b64_name)
    if name in document and document[name] is not None:
        if encoded is not None:
            raise MalformedResponseError(
                f"both {name!r} and {b64_name!r} are set; set one of them")
        return _encode_value(name, document[name])
    if encoded is None:
        return None
    if not isinstance(encoded, str):
        raise MalformedResponseError(f"{b64_name!r} must be a base64 string, got "
                                     f"{_show(encoded)}")
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedResponseError(
            f"{b64_name!r} is not valid base64 (standard alphabet, with = padding)") from None


def _encode_value(name: str, value: Any) -> bytes:
    try:
        return _DATA_ENCODER.encode(value).encode()
    except UnicodeEncodeError:
        raise MalformedResponseError(
            f"{name!r} contains an unpaired UTF-16 surrogate escape") from None
    except RecursionError:
        raise MalformedResponseError(f"{name!r} is nested too deeply to store") from None


def describe_reduce(call: ReduceCall) -> str:
    """How messages name a reduce call: partition, gate, pass, page and attempt."""
    return (f"partition {call.partition_id!r} gate {call.gate} reduce {call.pass_} "
            f"page {call.page} (attempt {call.attempt})")


def reduce_error(call: ReduceCall, failure: Failure, mask: Mask = _unchanged
                 ) -> ProcessorError:
    """``failure`` as the engine's error for a reduce call, naming the call. Never raises."""
    message = mask(f"{describe_reduce(call)}: {failure.reason}")
    if failure.retryable:
        return RetryableError(message, retry_after=failure.retry_after)
    return NonRetryableError(message)


# --------------------------------------------------------------------------- failures


def describe_item(item: WorkItem) -> str:
    """How messages name an item: partition, item, gate and attempt."""
    return item_context(item.partition_id, item.id, item.gate, item.attempt)


def item_context(partition_id: str, item_id: str, gate: int, attempt: int) -> str:
    """The context the processor puts before an item's error (see :func:`item_error`)."""
    return f"partition {partition_id!r} item {item_id!r} gate {gate} (attempt {attempt})"


def item_error(item: WorkItem, failure: Failure, mask: Mask = _unchanged) -> ProcessorError:
    """``failure`` as the engine's error for ``item``: the one place failures become errors.

    The message names the partition, item, gate and attempt, then the reason,
    with secrets masked. Never raises.
    """
    message = mask(f"{describe_item(item)}: {failure.reason}")
    if failure.retryable:
        return RetryableError(message, retry_after=failure.retry_after)
    return NonRetryableError(message)


def unexpected_failure(error: BaseException, doing: str) -> Failure:
    """The retryable failure of a bug met while ``doing`` (such as "calling the handler")."""
    return Failure(True, f"unexpected {type(error).__name__} while {doing}: "
                         f"{shorten(str(error), MAX_ERROR_MESSAGE_CHARS)}")


# --------------------------------------------------------------------------- helpers


def _handler_error(value: Any, mask: Mask) -> HandlerError | None:
    if isinstance(value, str):
        return HandlerError(shorten(mask(value), MAX_ERROR_MESSAGE_CHARS))
    if not isinstance(value, dict):
        return None
    message = value.get("message")
    if message is None:
        message = ""
    elif not isinstance(message, str):
        message = _dump(message) or _json_type(message)
    return HandlerError(shorten(mask(message), MAX_ERROR_MESSAGE_CHARS),
                        value.get("no_retry") is True)


def _excerpt(body: bytes, mask: Mask) -> str:
    # Mask a generous prefix before cutting it short: a secret straddling the
    # cut would otherwise survive in part.
    text = mask(body[:EXCERPT_SCAN_BYTES].decode("utf-8", "replace"))
    return shorten(" ".join(text.split()), ERROR_EXCERPT_CHARS)


def _json_type(value: Any) -> str:
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


def _dump(value: Any) -> str | None:
    # A decoded value nested nearly as deep as the decoder allows may be too
    # deep to encode again from a deeper stack.
    try:
        return json.dumps(value, ensure_ascii=False)
    except (RecursionError, ValueError, TypeError):
        return None


def _show(value: Any) -> str:
    return shorten(_dump(value) or f"a deeply nested {_json_type(value)}", _SHOWN_VALUE_CHARS)
