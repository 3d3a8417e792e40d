"""The processor side of the HTTP handler contract, as pure functions.

The handler side is :mod:`handlers.wire.contract`. Nothing here does I/O: the classes
in :mod:`processor.http.processor` and :mod:`processor.http.batch` move bytes
between these functions and a :mod:`processor.http.transports` sender, so every
rule of the contract is tested with plain values.

The contract itself (per-item, batched and reduce requests, answers, errors, what
is malformed) is stated once, in ``docs/reference/http-contract.md``; this module
and the three beside it are its processor side, rule for rule: this one holds the
requests and the answers of item calls (their ``spawn`` included),
:mod:`processor.wire.values` the values and the strict JSON decoder,
:mod:`processor.wire.errors` error answers and their classification, and
:mod:`processor.wire.reduce` reduce calls.

A call's outcome travels as a value: a :class:`~watcher.protocol.Result` or a
:class:`~processor.wire.values.Failure`. :func:`decode_reply` turns any reply into a
decoded JSON document or a failure, the one step every kind of call shares;
:func:`read_answer` turns one answer object into a result or a failure; and
:func:`processor.wire.errors.item_error` turns a failure into the engine's
:class:`RetryableError` or :class:`NonRetryableError`, naming the item.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
from collections.abc import Sequence
from typing import Any, Final
from urllib.parse import quote

from processor.wire.errors import (
    classify_error,
    malformed,
    parse_error_body,
    parse_handler_error,
)
from processor.wire.values import (
    DATA_ENCODER,
    Clock,
    Failure,
    HandlerError,
    MalformedResponseError,
    Mask,
    Reply,
    decode_json,
    json_type,
    show_value,
    unchanged,
)
from processor.wire.waits import parse_wait
from watcher.models import MAX_GATE
from watcher.protocol import (
    Result,
    WorkItem,
)
from watcher.records import NewItem
from watcher.rules.delays import DelayError, parse_time

ITEM_CONTENT_TYPE: Final = "application/octet-stream"
JSON_CONTENT_TYPE: Final = "application/json"
# What a per-item answer (and each batch entry) should look like, for messages.
ITEM_ANSWER: Final = 'a JSON object such as {"gate": 2, "done": false}'

# Ids made of these are sent as they are; "%" is excluded so that decoding is
# never ambiguous.
_PLAIN_HEADER_VALUE = re.compile(r"[\x21-\x24\x26-\x7e]*")

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
        "X-Completion-Token": item.completion_token,  # made for this call: never logged
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
            "completion_token": item.completion_token, "data_b64": encode_b64(item.data)}


def encode_batch(items: Sequence[WorkItem]) -> bytes:
    """The body of a batch request: a JSON array of :func:`batch_entry` objects."""
    return encode_json([batch_entry(item) for item in items])



# --------------------------------------------------------------------------- answers


def parse_answer(document: Any, mask: Mask = unchanged) -> Result | HandlerError:
    """Map one decoded answer object to a :class:`Result` or a :class:`HandlerError`.

    Shared by the per-item body (:func:`read_item_reply`), each entry of a batch
    answer, and any call whose answer carries per-item answer objects.

    Raises:
        MalformedResponseError: not an object, or a field has the wrong type or value.
    """
    if not isinstance(document, dict):
        raise MalformedResponseError(
            f"the answer is a JSON {json_type(document)}, not an object")
    error = document.get("error")
    if error is not None:
        return parse_handler_error(error, mask)
    gate = document.get("gate")
    if gate is not None:
        if type(gate) is not int:
            raise MalformedResponseError(
                f"'gate' must be a non-negative integer, got {show_value(gate)}")
        if not 0 <= gate <= MAX_GATE:
            raise MalformedResponseError(
                f"'gate' must be a non-negative integer up to {MAX_GATE}, got {gate}")
    done = document.get("done")
    if done is None:
        done = False
    elif type(done) is not bool:
        raise MalformedResponseError(f"'done' must be true or false, got {show_value(done)}")
    data = _answer_data(document, "")
    spawn = parse_spawn(document["spawn"]) if document.get("spawn") is not None else ()
    snooze = document.get("snooze")
    if snooze is not None and (type(snooze) not in (int, float) or snooze != snooze):
        raise MalformedResponseError(
            f"'snooze' must be a number of seconds, got {show_value(snooze)}")
    wait = parse_wait(document["wait"]) if document.get("wait") is not None else None
    return Result(gate=gate, done=done, data=data, spawn=spawn, snooze=snooze, wait=wait)


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
            return DATA_ENCODER.encode(document["data"]).encode()
        except UnicodeEncodeError:
            raise MalformedResponseError(
                f"{where}'data' contains an unpaired UTF-16 surrogate escape") from None
        except RecursionError:
            raise MalformedResponseError(f"{where}'data' is nested too deeply to store") from None
    if encoded is None:
        return None
    if not isinstance(encoded, str):
        raise MalformedResponseError(
            f"{where}'data_b64' must be a base64 string, got {show_value(encoded)}")
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedResponseError(
            f"{where}'data_b64' is not valid base64 (standard alphabet, with = padding)"
        ) from None


SPAWN_FIELDS: Final = frozenset({"id", "gate", "data", "data_b64", "not_before"})


def parse_spawn(value: Any) -> tuple[NewItem, ...]:
    """An answer's ``spawn``: a JSON array of ``{"id", "gate"?, "data" | "data_b64"}``
    objects, as the :class:`NewItem` values the engine inserts (a missing or ``null``
    gate is ``None``: the engine's default). Only the shape is checked here; the id
    rules, the count limit, repeats and gates are the engine's
    (:func:`watcher.rules.spawn.spawn_problem`), the same for every kind of answer.

    Raises:
        MalformedResponseError: not an array, an entry not an object, an unknown
            key (a typo such as ``"gates"`` is caught), a missing or non-string id,
            a bad gate, or neither or both of ``data`` and ``data_b64``.
    """
    if not isinstance(value, list):
        raise MalformedResponseError(
            f"'spawn' must be an array of new items, got {show_value(value)}")
    return tuple(parse_new_item(entry, f"spawn[{position}]: ")
                 for position, entry in enumerate(value))


def parse_new_item(entry: Any, where: str) -> NewItem:
    """One new item: a JSON object ``{"id", "gate"?, "not_before"?, "data" | "data_b64"}``
    (``not_before`` an RFC 3339 time with an offset), as a
    handler's ``spawn`` and the ingest API's items carry it (a missing or ``null``
    gate is ``None``: the default of whoever inserts it). ``where`` starts each message
    (``"spawn[2]: "``, ``"line 7: "``). Only the shape is checked; the id rules and
    size limits are the inserter's.

    Raises:
        MalformedResponseError: not an object, an unknown key, a missing or non-string
            id, a bad gate, or neither or both of ``data`` and ``data_b64``.
    """
    if not isinstance(entry, dict):
        raise MalformedResponseError(
            f"{where}each new item must be an object such as "
            f'{{"id": "a", "data": {{}}}}, got {show_value(entry)}')
    unknown = sorted(set(entry) - SPAWN_FIELDS)
    if unknown:
        raise MalformedResponseError(
            f"{where}unknown key {show_value(unknown[0])}; a new item has 'id', 'gate', "
            "'not_before', and 'data' or 'data_b64'")
    item_id = entry.get("id")
    if not isinstance(item_id, str):
        raise MalformedResponseError(f"{where}'id' must be a string, got {show_value(item_id)}")
    gate = entry.get("gate")
    if gate is not None and (type(gate) is not int or not 0 <= gate <= MAX_GATE):
        raise MalformedResponseError(
            f"{where}'gate' must be an integer from 0 to {MAX_GATE}, got {show_value(gate)}")
    data = _answer_data(entry, where)
    if data is None:
        raise MalformedResponseError(
            f"{where}a new item needs its content: set 'data' (any JSON value) or "
            "'data_b64'")
    not_before = entry.get("not_before")
    if not_before is not None:
        try:
            not_before = parse_time(not_before, "'not_before'")
        except DelayError as error:
            raise MalformedResponseError(f"{where}{error}") from None
    return NewItem(item_id, data, gate, not_before)



# --------------------------------------------------------------------------- replies


def decode_reply(reply: Reply, *, expected: str, max_bytes: int, mask: Mask = unchanged,
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


def read_answer(entry: Any, status: int, *, mask: Mask = unchanged, clock: Clock = time.time,
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


def read_item_reply(reply: Reply, *, max_bytes: int, mask: Mask = unchanged,
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


def read_batch_reply(reply: Reply, count: int, *, max_bytes: int, mask: Mask = unchanged,
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
                 else f"a JSON {json_type(document)}")
        return malformed(reply.status, f"the body is {shape}", expected)
    return [read_answer(entry, reply.status, mask=mask, clock=clock,
                        where=f"batch entry {position}: ")
            for position, entry in enumerate(document)]

