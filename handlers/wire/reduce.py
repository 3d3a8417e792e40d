"""Reduce calls on the handler side of the contract: a reduce request to a
:class:`~handlers.model.ReducePage`, and a reduce function's answer to bytes. Pure: no
I/O, like :mod:`handlers.wire.contract`, whose checks and encoders it shares.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any, Final

from handlers.model import (
    MAX_GATE,
    UNSET,
    Item,
    Reduced,
    ReducePage,
    Result,
    reject_json_constant,
)
from handlers.wire.contract import (
    RESULT_ENCODER,
    BadRequest,
    ResultError,
    check_entry,
    coerce_result,
    entry_data,
    entry_number,
    json_type,
    shorten,
    show_value,
    spawn_payload,
)

# --------------------------------------------------------------------------- reduce

REDUCE_PASSES: Final = ("all", "fold", "apply")
REDUCE_FIELDS: Final = ("partition_id", "gate", "attempt", "pass", "page", "last",
                        "idempotency_key", "items")
REDUCE_ITEM_FIELDS: Final = ("item_id", "status", "gate", "data_b64")


def parse_reduce(body: bytes) -> ReducePage:
    """Build the :class:`ReducePage` of a reduce request body.

    Raises:
        BadRequest: the body is not a JSON object with the reduce fields, or a
            field has the wrong type or value. The message names the field.
    """
    try:
        document = json.loads(body, parse_constant=reject_json_constant)
    except RecursionError:
        raise BadRequest("the reduce body is JSON nested too deeply to decode") from None
    except ValueError as error:
        raise BadRequest(f"the reduce body is not valid JSON ({error})") from None
    if not isinstance(document, dict):
        raise BadRequest(f"the reduce body is a JSON {json_type(document)}; expected an "
                         f"object with the fields {', '.join(REDUCE_FIELDS)}")
    missing = [name for name in REDUCE_FIELDS if name not in document]
    if missing:
        raise BadRequest(f"the reduce body has no {', '.join(map(repr, missing))}; a "
                         f"statefeed processor sends {', '.join(REDUCE_FIELDS)}")
    for name in ("partition_id", "idempotency_key"):
        if not isinstance(document[name], str):
            raise BadRequest(f"reduce field {name!r} must be a string, got "
                             f"{show_value(document[name])}")
    pass_ = document["pass"]
    if pass_ not in REDUCE_PASSES:
        raise BadRequest(f"reduce field 'pass' must be one of {', '.join(REDUCE_PASSES)}, "
                         f"got {show_value(pass_)}")
    gate, attempt, page = document["gate"], document["attempt"], document["page"]
    for name, value, minimum in (("gate", gate, 0), ("attempt", attempt, 1), ("page", page, 0)):
        if type(value) is not int or not minimum <= value <= MAX_GATE:
            raise BadRequest(f"reduce field {name!r} must be an integer from {minimum} to "
                             f"{MAX_GATE}, got {show_value(value)}")
    if type(document["last"]) is not bool:
        raise BadRequest(f"reduce field 'last' must be true or false, got "
                         f"{show_value(document['last'])}")
    entries = document["items"]
    if not isinstance(entries, list):
        raise BadRequest(f"reduce field 'items' must be an array, got {show_value(entries)}")
    items = tuple(_reduce_item(position, entry, document)
                  for position, entry in enumerate(entries))
    return ReducePage(partition_id=document["partition_id"], gate=gate, attempt=attempt,
                      pass_=pass_, page=page, last=document["last"],
                      idempotency_key=document["idempotency_key"], items=items,
                      accumulator=document.get("accumulator"))


def _reduce_item(position: int, entry: Any, document: dict[str, Any]) -> Item:
    where = f"reduce item {position}"
    check_entry(where, entry, REDUCE_ITEM_FIELDS, "item", ("item_id", "status", "data_b64"))
    gate = entry_number(where, entry, "gate", 0)
    last_error = entry.get("last_error")
    if last_error is not None and not isinstance(last_error, str):
        raise BadRequest(f"{where}: 'last_error' must be a string or null, got "
                         f"{show_value(last_error)}")
    data = entry_data(where, entry)
    return Item(id=entry["item_id"], partition_id=document["partition_id"], gate=gate,
                attempt=document["attempt"], idempotency_key=document["idempotency_key"],
                data=data, status=entry["status"], last_error=last_error, in_reduce=True)


def coerce_reduced(value: Any) -> Reduced:
    """The :class:`Reduced` a reduce function's return value stands for.

    A :class:`Reduced` is taken as it is; a mapping with keys among ``items``,
    ``default``, ``result`` and ``accumulator`` is ``Reduced(**mapping)``, and
    the values of its ``items`` (and ``default``) may be result dicts.

    Raises:
        ResultError: ``value`` is ``None``, another type, or has unknown keys
            or results that cannot be coerced.
    """
    if isinstance(value, Mapping) and not isinstance(value, Reduced):
        unknown = set(value) - {"items", "default", "result", "accumulator", "spawn"}
        if unknown:
            raise ResultError(
                f"the reduce function returned a dict with unknown keys "
                f"{sorted(map(str, unknown))}; use items, default, result, accumulator "
                "and spawn")
        try:
            value = Reduced(**value)
        except TypeError as error:
            raise ResultError(f"the reduce function returned an invalid answer: {error}"
                              ) from None
    if not isinstance(value, Reduced):
        raise ResultError(
            f"the reduce function returned {type(value).__name__}; return "
            "handlers.Reduced(items=..., default=..., result=..., accumulator=...)")
    if not isinstance(value.items, Mapping):
        raise ResultError(f"Reduced.items must map item ids to results, got "
                          f"{type(value.items).__name__}")
    items = {str(key): coerce_result(result) for key, result in value.items.items()}
    default = None if value.default is None else coerce_result(value.default)
    if any(result.spawn for result in (*items.values(), *([default] if default else []))):
        raise ResultError("a reduce spawns from Reduced(spawn=[...]), not from an item's "
                          "Result")
    return Reduced(items=items, default=default, result=value.result,
                   accumulator=value.accumulator, spawn=value.spawn)


def encode_reduced(reduced: Reduced) -> bytes:
    """The JSON body of a reduce answer, compact UTF-8.

    Raises:
        ResultError: a value cannot be encoded as JSON.
    """
    payload: dict[str, Any] = {}
    if reduced.items:
        payload["items"] = {item_id: _result_payload(result)
                            for item_id, result in reduced.items.items()}
    if reduced.default is not None:
        payload["default"] = _result_payload(reduced.default)
    if reduced.result is not UNSET:
        if isinstance(reduced.result, bytes | bytearray | memoryview):
            payload["result_b64"] = base64.b64encode(reduced.result).decode("ascii")
        else:
            payload["result"] = reduced.result
    if reduced.accumulator is not UNSET:
        payload["accumulator"] = reduced.accumulator
    if reduced.spawn:
        payload["spawn"] = spawn_payload(reduced.spawn)
    try:
        return RESULT_ENCODER.encode(payload).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as error:
        raise ResultError(f"the reduce answer cannot be encoded as JSON "
                          f"({type(error).__name__}: {shorten(str(error))}); return "
                          "JSON-compatible values (dict, list, str, int, float, bool, "
                          "None) or bytes") from None


def _result_payload(result: Result) -> dict[str, Any]:
    payload: dict[str, Any] = {}
    if result.gate is not None:
        payload["gate"] = result.gate
    if result.done:
        payload["done"] = True
    if isinstance(result.data, bytes | bytearray | memoryview):
        payload["data_b64"] = base64.b64encode(result.data).decode("ascii")
    elif result.data is not UNSET:
        payload["data"] = result.data
    return payload
