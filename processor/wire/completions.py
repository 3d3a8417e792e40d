"""A completion on the wire: the answer a waiting item was waiting for.

A completion is the handler's answer, given later by someone else: ``gate``, ``done``,
``data`` (or ``data_b64``), ``spawn`` and ``wait`` mean what they mean in a handler's
answer (``docs/reference/http-contract.md``), and ``error`` (with ``no_retry``) records
a failed attempt. Absent fields mean what they mean there too: no ``done`` is not
done, so ``{"gate": 1}`` moves the item to gate 1 *and runs it there*, and ``{}`` runs
it again at its gate.

Every path that completes a wait builds its answer here, so they cannot drift: the
ingest API's ``POST /v1/completions/{token}`` decodes its JSON body with
:func:`read_completion`; :class:`processor.AsyncClient`'s ``complete`` and
``complete_item`` (and so ``processor complete``) build the same document with
:func:`completion_document` and read it with :func:`read_completion`; the console's
Complete form is read by :func:`completion_from_form`. Pure: no I/O.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Final

from processor.wire.contract import parse_answer
from processor.wire.values import MalformedResponseError, RepeatedKeyError, decode_json
from watcher.errors import CompletionRefusedError
from watcher.models import MAX_GATE
from watcher.protocol import NonRetryableError, Result, RetryableError
from watcher.records import NewItem
from watcher.rules.completions import Answer

# The fields a completion's JSON object may have.
COMPLETION_FIELDS: Final = frozenset({"gate", "done", "data", "data_b64", "spawn", "error",
                                      "no_retry", "wait"})
# What the console's Complete form sends (beside its partition, id and CSRF token).
FORM_FIELDS: Final = ("gate", "done", "data")
# The form's ``done`` checkbox: these values mean true, an absent or empty one false.
FORM_TRUE: Final = frozenset({"true", "yes", "on", "1"})
FORM_FALSE: Final = frozenset({"", "false", "no", "off", "0"})
_KEEP: Final = object()  # ``data`` not given: the item keeps its bytes


def completion_document(*, gate: int | None = None, done: bool = False,
                        data: Any = _KEEP, error: str | None = None,
                        no_retry: bool = False, wait: float | None = None) -> dict[str, Any]:
    """The JSON object of a completion, from a caller's arguments (the client's and the
    CLI's): ``data`` bytes go as ``data_b64``, any other value as ``data`` (``None``
    stores ``null``); leave ``data`` out to keep the item's bytes. ``wait`` is the
    timeout in seconds of a new wait. Only what was given is set, so
    :func:`read_completion` applies the contract's defaults. Never raises."""
    document: dict[str, Any] = {}
    if gate is not None:
        document["gate"] = gate
    if done:
        document["done"] = True
    if isinstance(data, bytes | bytearray | memoryview):
        document["data_b64"] = base64.b64encode(bytes(data)).decode("ascii")
    elif data is not _KEEP:
        document["data"] = data
    if error is not None:
        document["error"] = error
    if no_retry:
        document["no_retry"] = True
    if wait is not None:
        document["wait"] = {"timeout": wait}
    return document


def read_completion(document: Any, *, spawn: Sequence[NewItem] | None = None) -> Answer:
    """The answer a completion's JSON object carries, as a handler's answer would be
    read (:func:`processor.wire.contract.parse_answer`): a :class:`Result`, or, with
    ``error`` (a string beside an optional ``no_retry``, or ``{"message",
    "no_retry"}``), a :class:`RetryableError` or :class:`NonRetryableError`.
    ``spawn``, when given, replaces the document's (a caller's :class:`NewItem`
    values).

    Raises:
        CompletionRefusedError: not an object, an unknown field, or a field with the
            wrong type or value; ``field`` names it.
    """
    if not isinstance(document, dict):
        raise CompletionRefusedError(
            "body", "a completion must be a JSON object such as {\"gate\": 1} or "
                    "{\"done\": true}")
    unknown = sorted(set(document) - COMPLETION_FIELDS)
    if unknown:
        raise CompletionRefusedError(
            unknown[0], f"unknown field {unknown[0]!r}; a completion takes "
                        f"{', '.join(sorted(COMPLETION_FIELDS))}")
    no_retry = document.get("no_retry", False)
    if type(no_retry) is not bool:
        raise CompletionRefusedError("no_retry", "'no_retry' must be true or false")
    error = document.get("error")
    if isinstance(error, str):
        return NonRetryableError(error) if no_retry else RetryableError(error)
    try:
        parsed = parse_answer(document)
    except MalformedResponseError as problem:
        raise CompletionRefusedError(_field_in(str(problem)), str(problem)) from None
    if isinstance(parsed, Result):
        return parsed if spawn is None else dataclasses.replace(parsed, spawn=tuple(spawn))
    return (NonRetryableError(parsed.message) if parsed.no_retry or no_retry
            else RetryableError(parsed.message))


def decode_completion(body: bytes) -> Answer:
    """A completion's request body (strict JSON, no key twice; an empty body is
    ``{}``) as its answer (:func:`read_completion`).

    Raises:
        CompletionRefusedError: the body is not such JSON (``field`` is the repeated
            key, or ``body``), or :func:`read_completion` refuses it.
    """
    return read_completion(json_object(body))


def json_object(body: bytes) -> Any:
    """``body`` decoded as strict JSON with no key twice in any object (an empty body is
    ``{}``); the caller checks it is an object.

    Raises:
        CompletionRefusedError: it is not; ``field`` names a repeated key, else ``body``.
    """
    if not body.strip():
        return {}
    try:
        return decode_json(body, unique_keys=True)
    except RepeatedKeyError as problem:
        raise CompletionRefusedError(problem.key, str(problem)) from None
    except MalformedResponseError as problem:
        raise CompletionRefusedError("body", f"the body is not strict JSON: {problem}"
                                     ) from None


def completion_from_form(form: Mapping[str, str]) -> Answer:
    """The console's Complete form as the completion it says: ``gate`` (blank: the
    item's own gate), ``done`` (a checkbox: checked completes the item, unchecked
    runs it at the gate) and ``data`` (JSON; blank keeps the item's bytes); or, for
    whatever else a completion can say (park again with ``wait``, ``spawn``,
    ``snooze``), ``answer``: the whole answer as JSON, as the API takes it. The same
    document and decoder as every other path (:func:`read_completion`).

    Raises:
        CompletionRefusedError: a gate that is not a whole number, a ``done`` that is
            not a checkbox's value, data that is not JSON, an answer that is not a
            JSON object or comes with the fields; ``field`` names it.
    """
    whole = form.get("answer", "")
    if whole.strip():
        if any(form.get(name, "").strip() for name in ("gate", "done", "data")):
            raise CompletionRefusedError(
                "answer", "give the answer either as JSON or in the gate, done and data "
                          "fields, not both")
        document = json_object(whole.encode("utf-8", "surrogatepass"))
        if not isinstance(document, dict):
            raise CompletionRefusedError(
                "answer", 'the answer must be a JSON object, such as {"gate": 1} or '
                          '{"wait": {"timeout": 3600}}')
        return read_completion(document)
    document = {}
    gate = form.get("gate", "").strip()
    if gate:
        if not (gate.isascii() and gate.isdigit()) or int(gate) > MAX_GATE:
            raise CompletionRefusedError(
                "gate", f"the gate must be a whole number from 0 to {MAX_GATE}, got "
                        f"{gate[:40]!r}; leave it empty to keep the item's gate")
        document["gate"] = int(gate)
    done = form.get("done", "").strip().lower()
    if done in FORM_TRUE:
        document["done"] = True
    elif done not in FORM_FALSE:
        raise CompletionRefusedError("done", f"done must be checked or not, got {done[:40]!r}")
    data = form.get("data", "")
    if data.strip():
        try:
            document["data"] = decode_json(data.encode("utf-8", "surrogatepass"), "the data",
                                           unique_keys=True)
        except RepeatedKeyError as problem:
            raise CompletionRefusedError("data", str(problem)) from None
        except MalformedResponseError as problem:
            raise CompletionRefusedError(
                "data", f"the data is not JSON ({str(problem).removeprefix('the data ')}); "
                        "leave it empty to keep the item's data") from None
    return read_completion(document)


def _field_in(message: str) -> str:
    """The field a malformed answer's message names first."""
    for name in ("spawn", "wait", "data_b64", "data", "gate", "done", "error"):
        if f"'{name}" in message or message.startswith(f"{name}["):
            return name
    return "body"
