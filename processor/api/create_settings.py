"""A create's settings (reduce gates, failure policy, key, priority, quorum, notify URL,
start time), from a JSON body or an NDJSON create's query string, checked as the client checks them.

Every check raises :class:`~processor.api.problems.ApiError` naming the field at fault.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from processor.api.problems import bad_request, from_statefeed
from processor.api.upload import EPOCH, listed
from processor.client.checks import check_settings
from watcher.errors import InvalidInputError
from watcher.records import PartitionSettings
from watcher.rules.delays import DelayError, parse_time

NDJSON_CREATE_PARAMETERS = frozenset({"reduce_gates", "on_item_failure", "key", "priority",
                                      "start_at", "quorum", "notify", "pipeline",
                                      "pipeline_version"})
EARLIEST_START = EPOCH
# A gate in a query string, bounded because int() refuses over 4300 digits (over 10
# digits is out of range anyway, which the settings check says: 422).
GATE_NUMBER = re.compile(r"[0-9]{1,20}")
PRIORITY_NUMBER = re.compile(r"-?[0-9]{1,10}")
# One quorum in a query string: GATE=K (quorum=1=2,3=1).
QUORUM_PAIR = re.compile(r"([0-9]{1,20})=([0-9]{1,20})")


def settings_from(partition_id: str, reduce_gates: Any, on_item_failure: Any,
                  priority: Any = None, key: Any = None, quorum: Any = None,
                  notify: Any = None, pipeline: Any = None,
                  pipeline_version: Any = None) -> PartitionSettings:
    """A create's settings, checked as the client checks them.

    Raises:
        ApiError: 400 when a value has the wrong type, 422 when the rules refuse it.
    """
    if priority is None:
        priority = 0
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise bad_request("'priority' must be a whole number from -10 to 10", field="priority")
    if key is not None and not isinstance(key, str):
        raise bad_request("'key' must be a string (a tenant or customer id)", field="key")
    if reduce_gates is None:
        reduce_gates = []
    if on_item_failure is None:
        on_item_failure = "fail"
    if not isinstance(reduce_gates, list):
        raise bad_request("'reduce_gates' must be an array of gates, such as [1]",
                          field="reduce_gates")
    if not isinstance(on_item_failure, str):
        raise bad_request("'on_item_failure' must be \"fail\" or \"continue\"",
                          field="on_item_failure")
    if quorum is not None and not isinstance(quorum, dict):
        raise bad_request("'quorum' must be an object of gate to k, such as {\"1\": 2} "
                          "(gate 1 passes once 2 of its items are complete)", field="quorum")
    if notify is not None and not isinstance(notify, str):
        raise bad_request("'notify' must be an http(s) URL string", field="notify")
    for name, value in (("pipeline", pipeline), ("pipeline_version", pipeline_version)):
        if value is not None and not isinstance(value, str):
            raise bad_request(f"{name!r} must be a string such as \"invoices\"", field=name)
    try:
        return check_settings(partition_id, reduce_gates, on_item_failure, priority, key,
                              quorum, notify, pipeline, pipeline_version)
    except InvalidInputError as error:
        text = str(error)
        field = next((name for name in ("notify", "quorum", "on_item_failure", "priority",
                                        "pipeline_version", "pipeline", "key")
                      if name in text), "reduce_gates")
        raise from_statefeed(error, field=field) from None


def start_time(value: Any) -> datetime | None:
    """A create's ``start_at`` (RFC 3339 with an offset), checked, and no earlier than
    1970 (a time before starts it at once all the same); ``None`` when absent.

    Raises:
        ApiError: 400 when it is not a string, 422 when it is not such a time, has no
            offset, or is more than a year ahead.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_request("'start_at' must be an RFC 3339 time such as "
                          '"2026-11-26T10:00:00Z"', field="start_at")
    try:
        moment = parse_time(value, "start_at")
    except DelayError as error:
        raise from_statefeed(InvalidInputError(str(error)), field="start_at") from None
    # Any past time starts it at once; one near year 1 would overflow the rank a
    # priority moves it by.
    return max(moment, EARLIEST_START)


def query_fields(query: dict[str, str]) -> dict[str, Any]:
    """A create's settings given in its query string (``reduce_gates=1,3``,
    ``on_item_failure=continue``, ``key=acme``, ``priority=-2``, ``quorum=1=2``,
    ``start_at=...``, ``notify=https://...``), as
    the values a JSON body gives them; only those present.

    Raises:
        ApiError: 400 for an unknown parameter, or gates or a priority that are not
            numbers.
    """
    unknown = sorted(set(query) - NDJSON_CREATE_PARAMETERS)
    if unknown:
        raise bad_request(f"unknown query parameter {unknown[0]!r}; a create takes "
                          f"{listed(NDJSON_CREATE_PARAMETERS)}", field=unknown[0])
    fields: dict[str, Any] = {name: query[name] for name in ("on_item_failure", "key",
                                                             "start_at", "notify",
                                                             "pipeline",
                                                             "pipeline_version")
                              if name in query}
    if "reduce_gates" in query:
        raw = query["reduce_gates"]
        parts = raw.split(",") if raw else []
        # ASCII digits only: int() would also take "1_0", " 1" and other scripts' digits.
        if not all(GATE_NUMBER.fullmatch(part) for part in parts):
            raise bad_request(f"reduce_gates must be gates separated by commas, such as 1,3; "
                              f"got {raw!r}", field="reduce_gates")
        fields["reduce_gates"] = [int(part) for part in parts]
    if "quorum" in query:
        fields["quorum"] = _query_quorum(query["quorum"])
    priority = query.get("priority")
    if priority is not None:
        if not PRIORITY_NUMBER.fullmatch(priority):
            raise bad_request(f"priority must be a whole number from -10 to 10, got "
                              f"{priority!r}", field="priority")
        fields["priority"] = int(priority)
    return fields


def with_query_fields(document: dict[str, Any], query: dict[str, str]) -> dict[str, Any]:
    """A JSON create's body with the settings its query gives: each may be in the
    body or the query, not both.

    Raises:
        ApiError: 400 as :func:`query_fields`, and for a setting given twice.
    """
    fields = query_fields(query)
    for name in sorted(fields):
        if document.get(name) is not None:
            raise bad_request(f"{name!r} is given in the body and in the query; give it in "
                              "one of them", field=name)
    return {**document, **fields}


def query_settings(partition_id: str, query: dict[str, str]) -> PartitionSettings:
    """An NDJSON create's settings, from its query string (:func:`query_fields`; its
    ``start_at``: :func:`start_time`).

    Raises:
        ApiError: 400 for an unknown parameter or a gate that is not a number, 422
            when the rules refuse a value.
    """
    fields = query_fields(query)
    return settings_from(partition_id, fields.get("reduce_gates"),
                         fields.get("on_item_failure"), fields.get("priority"),
                         fields.get("key"), fields.get("quorum"), fields.get("notify"),
                         fields.get("pipeline"), fields.get("pipeline_version"))


def _query_quorum(raw: str) -> dict[str, int]:
    """``quorum=1=2,3=1`` as a JSON body gives it (``{"1": 2, "3": 1}``).

    Raises:
        ApiError: 400 when a pair is not GATE=K with whole numbers, or a gate repeats.
    """
    quorum: dict[str, int] = {}
    for part in raw.split(",") if raw else []:
        match = QUORUM_PAIR.fullmatch(part)
        if match is None:
            raise bad_request(f"quorum must be GATE=K pairs separated by commas, such as "
                              f"1=2; got {raw!r}", field="quorum")
        gate = str(int(match.group(1)))
        if gate in quorum:
            raise bad_request(f"quorum names gate {gate} twice; give each gate once",
                              field="quorum")
        quorum[gate] = int(match.group(2))
    return quorum
