"""Reduce calls on the processor side of the contract: the request, the reply as a
:class:`~watcher.protocol.ReduceResult`, and the engine's error naming the call. Pure:
no I/O.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from typing import Any, Final

from processor.wire.contract import (
    JSON_CONTENT_TYPE,
    decode_reply,
    encode_b64,
    encode_json,
    header_safe,
    parse_answer,
    parse_spawn,
)
from processor.wire.errors import (
    classify_error,
    malformed,
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
    json_type,
    show_value,
    unchanged,
)
from watcher.protocol import (
    HandlerUnavailableError,
    NonRetryableError,
    ProcessorError,
    ReduceCall,
    ReduceResult,
    Result,
    RetryableError,
)
from watcher.records import NewItem

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
    sent as it is (UTF-8). :func:`watcher.rules.reduce.reduce_request_bytes`
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
                      mask: Mask = unchanged, clock: Clock = time.time
                      ) -> ReduceResult | Failure:
    """A reduce reply as the :class:`ReduceResult` it carries, or the call's :class:`Failure`.

    The answer is a JSON object: ``items`` (item id to a per-item answer
    object), ``default`` (a per-item answer object), ``result`` or
    ``result_b64`` (the partition result), and for a fold page ``accumulator``
    (required, any JSON value); ``spawn`` (new items at later gates, not on a
    fold page). ``error`` reports a failure as in the per-item contract.
    Whether the ids and gates fit the request is the engine's check
    (:func:`watcher.rules.reduce.reduce_step`). Never raises.
    """
    folding = call.pass_ == "fold"
    expected = FOLD_ANSWER if folding else REDUCE_ANSWER
    document = decode_reply(reply, expected=expected, max_bytes=max_bytes, mask=mask,
                            clock=clock)
    if isinstance(document, Failure):
        return document
    status = reply.status
    if not isinstance(document, dict):
        return malformed(status, f"the body is a JSON {json_type(document)}", expected)
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
            f"'items' must be an object mapping item ids to answers, got {show_value(answers)}")
    items: dict[str, Result] = {}
    for item_id, answer in answers.items():
        items[item_id] = _reduce_item_answer(f"'items'[{show_value(item_id)}]", answer)
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
                                     f"{show_value(encoded)}")
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedResponseError(
            f"{b64_name!r} is not valid base64 (standard alphabet, with = padding)") from None


def _encode_value(name: str, value: Any) -> bytes:
    try:
        return DATA_ENCODER.encode(value).encode()
    except UnicodeEncodeError:
        raise MalformedResponseError(
            f"{name!r} contains an unpaired UTF-16 surrogate escape") from None
    except RecursionError:
        raise MalformedResponseError(f"{name!r} is nested too deeply to store") from None


def describe_reduce(call: ReduceCall) -> str:
    """How messages name a reduce call: partition, gate, pass, page and attempt."""
    return (f"partition {call.partition_id!r} gate {call.gate} reduce {call.pass_} "
            f"page {call.page} (attempt {call.attempt})")


def reduce_error(call: ReduceCall, failure: Failure, mask: Mask = unchanged
                 ) -> ProcessorError:
    """``failure`` as the engine's error for a reduce call, naming the call. Never raises."""
    message = mask(f"{describe_reduce(call)}: {failure.reason}")
    if failure.unanswered:
        return HandlerUnavailableError(message)
    if failure.retryable:
        return RetryableError(message, retry_after=failure.retry_after)
    return NonRetryableError(message)

