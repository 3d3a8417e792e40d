"""The HTTP handler contract as pure functions: requests to items, results to bytes.

Nothing here does I/O, so every rule of the contract is tested with plain
values. :mod:`handlers.asgi` only moves bytes between these functions and the
ASGI server.

The contract is stated once, in ``docs/reference/http-contract.md``; this module
is its handler side. What the SDK adds is in ``docs/reference/handler-sdk.md``:
all five per-item headers are required (a missing or bad one is a 400 naming
it), and an error object carries ``"retry_after": seconds`` when the handler
asked for a delay.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final
from urllib.parse import unquote

from handlers.model import (
    MAX_GATE,
    UNSET,
    Item,
    Result,
    Spawn,
)

MAX_ERROR_MESSAGE_CHARS: Final = 1000  # the processor keeps no more than this
_SHOWN_VALUE_CHARS = 40
# One encoder for every answer: json.dumps() with options builds a new one per call.
RESULT_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False,
                                          allow_nan=False)
_ERROR_ENCODER: Final = json.JSONEncoder(separators=(",", ":"))

HEADER_PARTITION: Final = b"x-partition-id"
HEADER_ITEM: Final = b"x-item-id"
HEADER_GATE: Final = b"x-gate"
HEADER_ATTEMPT: Final = b"x-attempt"
HEADER_KEY: Final = b"idempotency-key"
# Optional: a processor older than waits does not send it (the item then cannot park).
HEADER_TOKEN: Final = b"x-completion-token"
_HEADER_NAMES: Final = {
    HEADER_PARTITION: "X-Partition-Id", HEADER_ITEM: "X-Item-Id", HEADER_GATE: "X-Gate",
    HEADER_ATTEMPT: "X-Attempt", HEADER_KEY: "Idempotency-Key",
}
_REQUIRED_HEADERS_TEXT: Final = ", ".join(_HEADER_NAMES.values())
BATCH_FIELDS: Final = ("partition_id", "item_id", "gate", "attempt", "idempotency_key",
                       "data_b64")
RESULT_KEYS: Final = frozenset({"gate", "done", "data", "spawn", "snooze", "wait"})


class BadRequest(ValueError):
    """The request breaks the contract; answered with ``status`` and ``no_retry``.

    The message names the header or field and says what was expected.
    """

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class ResultError(TypeError):
    """A handler function returned something that cannot be sent as a result.

    A bug in the handler: answered as a retryable 500, so a fixed handler can
    still process the item.
    """


# --------------------------------------------------------------------------- requests


def parse_item(headers: Mapping[bytes, bytes], body: bytes) -> Item:
    """Build the :class:`Item` of a single-item request.

    ``headers`` maps lower-case header names to raw values, as ASGI gives them.

    Raises:
        BadRequest: a required header is missing, an id is not valid
            percent-encoded UTF-8, or ``X-Gate``/``X-Attempt`` is not an integer
            in range. The message names the header.
    """
    return Item(
        id=_text_header(headers, HEADER_ITEM),
        partition_id=_text_header(headers, HEADER_PARTITION),
        gate=_int_header(headers, HEADER_GATE, minimum=0),
        attempt=_int_header(headers, HEADER_ATTEMPT, minimum=1),
        idempotency_key=_text_header(headers, HEADER_KEY),
        data=body,
        completion_token=headers.get(HEADER_TOKEN, b"").decode("ascii", "replace"),
    )


def parse_batch(body: bytes) -> list[Any]:
    """The entries of a batch request body (not yet checked one by one).

    Raises:
        BadRequest: the body is not a JSON array.
    """
    try:
        document = json.loads(body)
    except RecursionError:
        raise BadRequest("the batch body is JSON nested too deeply to decode") from None
    except ValueError as error:
        raise BadRequest(f"the batch body is not valid JSON ({error}); expected an array "
                         f"of objects with the fields {', '.join(BATCH_FIELDS)}") from None
    if not isinstance(document, list):
        raise BadRequest(f"the batch body is a JSON {json_type(document)}; expected an "
                         f"array of objects with the fields {', '.join(BATCH_FIELDS)}")
    return document


def parse_batch_entry(position: int, entry: Any) -> Item:
    """Build the :class:`Item` of the batch entry at ``position`` (0-based).

    Raises:
        BadRequest: the entry is not an object, or a field is missing or has the
            wrong type or value. The message names the position and the field.
    """
    where = f"batch entry {position}"
    check_entry(where, entry, BATCH_FIELDS, "entry",
                 ("partition_id", "item_id", "idempotency_key", "data_b64"))
    gate = entry_number(where, entry, "gate", 0)
    attempt = entry_number(where, entry, "attempt", 1)
    data = entry_data(where, entry)
    token = entry.get("completion_token")
    return Item(id=entry["item_id"], partition_id=entry["partition_id"], gate=gate,
                attempt=attempt, idempotency_key=entry["idempotency_key"], data=data,
                completion_token=token if isinstance(token, str) else "")


def check_entry(where: str, entry: Any, fields: tuple[str, ...], noun: str,
                 strings: tuple[str, ...]) -> None:
    """Check that ``entry`` (a batch entry or a reduce item) is an object with every
    one of ``fields``, and ``strings`` among them strings.

    Raises:
        BadRequest: it is not; the message names ``where`` and the field.
    """
    if not isinstance(entry, dict):
        raise BadRequest(f"{where} is a JSON {json_type(entry)}, not an object")
    missing = [name for name in fields if name not in entry]
    if missing:
        raise BadRequest(f"{where} has no {', '.join(repr(name) for name in missing)}; "
                         f"every {noun} needs {', '.join(fields)}")
    for name in strings:
        if not isinstance(entry[name], str):
            raise BadRequest(f"{where}: {name!r} must be a string, got {show_value(entry[name])}")


def entry_number(where: str, entry: dict[str, Any], name: str, minimum: int) -> int:
    """``entry[name]`` if it is an integer from ``minimum`` to :data:`MAX_GATE`.

    Raises:
        BadRequest: it is not.
    """
    value = entry[name]
    if type(value) is not int or not minimum <= value <= MAX_GATE:
        raise BadRequest(f"{where}: {name!r} must be an integer from {minimum} to {MAX_GATE}, "
                         f"got {show_value(value)}")
    return value


def entry_data(where: str, entry: dict[str, Any]) -> bytes:
    """The bytes of ``entry["data_b64"]``.

    Raises:
        BadRequest: it is not valid standard base64.
    """
    try:
        return base64.b64decode(entry["data_b64"], validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"{where}: 'data_b64' is not valid base64 (standard alphabet, "
                         "with = padding)") from None


def _text_header(headers: Mapping[bytes, bytes], name: bytes) -> str:
    raw = headers.get(name)
    if raw is None:
        raise _missing(name)
    # Values are ASCII from the processor; tolerate raw UTF-8 from other callers.
    value = raw.decode("latin-1") if raw.isascii() else _decode_utf8(name, raw)
    if "%" not in value:
        return value
    try:
        return unquote(value, errors="strict")
    except UnicodeDecodeError:
        raise BadRequest(f"header {_HEADER_NAMES[name]} is not valid percent-encoded UTF-8: "
                         f"{shorten(value, _SHOWN_VALUE_CHARS)!r}") from None


def _decode_utf8(name: bytes, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(f"header {_HEADER_NAMES[name]} is neither ASCII nor UTF-8; "
                         "percent-encode it") from None


def _int_header(headers: Mapping[bytes, bytes], name: bytes, *, minimum: int) -> int:
    raw = headers.get(name)
    if raw is None:
        raise _missing(name)
    # bytes.isdigit() accepts ASCII digits only: no sign, spaces, "_" or "1.0".
    if not raw.isdigit() or len(raw) > 19 or not minimum <= int(raw) <= MAX_GATE:
        shown = shorten(raw.decode("latin-1"), _SHOWN_VALUE_CHARS)
        raise BadRequest(f"header {_HEADER_NAMES[name]} must be an integer from {minimum} "
                         f"to {MAX_GATE}, got {shown!r}")
    return int(raw)


def _missing(name: bytes) -> BadRequest:
    return BadRequest(f"missing header {_HEADER_NAMES[name]}; a statefeed processor sends "
                      f"{_REQUIRED_HEADERS_TEXT} with every item")


# --------------------------------------------------------------------------- answers


def coerce_result(value: Any) -> Result:
    """The :class:`Result` a handler function's return value stands for.

    A :class:`Result` is taken as it is; a mapping with keys among ``gate``,
    ``done`` and ``data`` is ``Result(**mapping)``. ``None`` is refused: it is
    almost always a forgotten ``return``, and both "complete" and "run again"
    would silently do the wrong thing for the rest of the pipeline.

    Raises:
        ResultError: ``value`` is ``None``, another type, a mapping with other
            keys, or a mapping whose values :class:`Result` refuses.
    """
    if isinstance(value, Result):
        return value
    if isinstance(value, Mapping):
        unknown = set(value) - RESULT_KEYS
        if unknown:
            raise ResultError(
                f"the handler returned a dict with unknown keys {sorted(map(str, unknown))}; "
                "use only 'gate', 'done', 'data', 'spawn', 'snooze' and 'wait'")
        try:
            return Result(**value)
        except (TypeError, ValueError) as error:
            raise ResultError(f"the handler returned an invalid result: {error}") from None
    if value is None:
        raise ResultError(
            "the handler returned None; return Result(done=True) to complete the item, "
            "Result(gate=g) to move it to gate g, or Result() to run it again")
    raise ResultError(f"the handler returned a {type(value).__name__}; return a Result "
                      "(or a dict with 'gate', 'done' and 'data')")


def encode_result(result: Result) -> bytes:
    """The JSON body of a successful answer, compact UTF-8.

    Only informative keys are written: ``gate`` when set, ``done`` when true,
    ``data_b64`` for bytes data, ``data`` for other data, nothing for unset data,
    ``spawn`` when it spawns, ``snooze`` when it snoozes, and ``wait`` when it parks.

    Raises:
        ResultError: ``data`` (or a spawned item's) cannot be encoded as JSON (an
            unsupported type, a circular reference, ``NaN`` or infinity, an
            unpaired surrogate).
    """
    data = result.data
    if (data is UNSET and not result.spawn and result.snooze is None
            and result.wait is None):  # the common answers
        if result.gate is None:
            return b'{"done":true}' if result.done else b"{}"
        return (f'{{"gate":{result.gate},"done":true}}' if result.done
                else f'{{"gate":{result.gate}}}').encode("ascii")
    payload: dict[str, Any] = {}
    if result.gate is not None:
        payload["gate"] = result.gate
    if result.done:
        payload["done"] = True
    if isinstance(data, bytes | bytearray | memoryview):
        payload["data_b64"] = base64.b64encode(data).decode("ascii")
    elif data is not UNSET:
        payload["data"] = data
    if result.spawn:
        payload["spawn"] = spawn_payload(result.spawn)
    if result.snooze is not None:
        payload["snooze"] = result.snooze
    if result.wait is not None:
        payload["wait"] = dict(result.wait)
    try:
        return RESULT_ENCODER.encode(payload).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as error:
        raise ResultError(f"the handler's Result.data cannot be encoded as JSON "
                          f"({type(error).__name__}: {shorten(str(error))}); return "
                          "JSON-compatible values (dict, list, str, int, float, bool, "
                          "None) or bytes") from None


def spawn_payload(spawn: Sequence[Spawn]) -> list[dict[str, Any]]:
    """The ``spawn`` array of an answer: each new item's id, its gate when set, and its
    data (``data_b64`` for bytes, ``data`` for any other value)."""
    entries: list[dict[str, Any]] = []
    for child in spawn:
        entry: dict[str, Any] = {"id": child.id}
        if child.gate is not None:
            entry["gate"] = child.gate
        if isinstance(child.data, bytes | bytearray | memoryview):
            entry["data_b64"] = base64.b64encode(child.data).decode("ascii")
        else:
            entry["data"] = child.data
        entries.append(entry)
    return entries


def encode_error(message: str, *, no_retry: bool, retry_after: float | None = None) -> bytes:
    """The JSON body of an error answer. Never raises.

    The message is cut to :data:`MAX_ERROR_MESSAGE_CHARS` characters.
    """
    error: dict[str, Any] = {"message": shorten(message), "no_retry": no_retry}
    if retry_after is not None:
        error["retry_after"] = retry_after
    # ASCII escapes keep any str encodable, unpaired surrogates included.
    return _ERROR_ENCODER.encode({"error": error}).encode("ascii")


def retry_after_header(seconds: float) -> bytes:
    """A ``Retry-After`` value: whole seconds, rounded up so the delay is a minimum."""
    return str(math.ceil(seconds)).encode("ascii")


def exception_message(error: BaseException) -> str:
    """``"<ExceptionType>: <message>"`` (just the type when the message is empty)."""
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def shorten(text: str, limit: int = MAX_ERROR_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def show_value(value: Any) -> str:
    try:
        return shorten(json.dumps(value), _SHOWN_VALUE_CHARS)
    except (TypeError, ValueError):
        return type(value).__name__


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
