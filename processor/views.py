"""How the CLI shows partitions: plain rows for ``--json`` and short texts for tables.

Pure functions over :class:`~watcher.records.PartitionInfo`; no I/O.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from watcher.records import PartitionInfo


def step_text(info: PartitionInfo) -> str:
    """What an open partition is doing at its gate: ``"items"``, ``"reduce"``,
    ``"reduce fold page 3"``, with failed reduce calls counted; ``"-"`` when closed."""
    if info.status != "available":
        return "-"
    if info.reduce is None:
        return "items"
    text = "reduce"
    if info.reduce.pass_ is not None:
        text += f" {info.reduce.pass_} page {info.reduce.pages_done}"
    if info.reduce.attempts:
        text += f" ({info.reduce.attempts} failed)"
    return text


def result_value(result: bytes | None) -> dict[str, Any]:
    """A partition result for JSON output: ``{"result": value}`` when it is JSON,
    ``{"result_b64": text}`` for other bytes, ``{"result": None}`` when there is none."""
    if result is None:
        return {"result": None}
    try:
        return {"result": json.loads(result)}
    except ValueError:
        return {"result_b64": base64.b64encode(result).decode("ascii")}


def partition_row(info: PartitionInfo) -> dict[str, Any]:
    """One partition as ``processor status --json`` prints it."""
    reduce = None if info.reduce is None else {
        "pass": info.reduce.pass_, "pages_done": info.reduce.pages_done,
        "failed_calls": info.reduce.attempts}
    return {"id": info.id, "status": info.status, "gate": info.gate, "owner": info.owner,
            "counts": info.counts, "reduce_gates": list(info.reduce_gates),
            "on_item_failure": info.on_item_failure, "reduce": reduce,
            "last_error": info.last_error, **result_value(info.result)}
