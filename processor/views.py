"""How the CLI shows partitions and items: plain rows for ``--json`` and short texts for
tables.

Pure functions over the records (:class:`~watcher.records.PartitionInfo`,
:class:`~watcher.records.ItemInfo`, :class:`~watcher.records.PurgeReport`,
:class:`~watcher.records.RetryReport`); no I/O.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from watcher.durations import format_duration
from watcher.records import ItemInfo, PartitionInfo, PurgeReport, RetryReport
from watcher.text import shorten

# How much of an item's last error a table shows (--json shows all of it).
ERROR_CELL_CHARS = 100


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
            "spawned": info.spawned, "last_error": info.last_error,
            **result_value(info.result)}


def error_after_context(item: ItemInfo) -> str | None:
    """An item's last error without the context the processor put before it (its
    partition, id, gate and attempt), for a table whose columns show them already, so
    a cut cell still shows what went wrong; the whole error when it does not start so.

    The processor writes the attempt that failed, which is the item's ``attempts``
    while the error stands (a retry resets them, and the error then shows whole).
    """
    from processor.wire_errors import item_context

    error = item.last_error
    prefix = item_context(item.partition_id, item.id, item.gate, item.attempts) + ": "
    return error[len(prefix):] if error and error.startswith(prefix) else error


def error_cell(error: str | None, limit: int = ERROR_CELL_CHARS) -> str:
    """An item's last error for a table cell: its first line, shortened; ``-`` for none."""
    if not error:
        return "-"
    lines = error.strip().splitlines()
    return shorten(lines[0] if lines else "", limit) + (" ..." if len(lines) > 1 else "")


def item_row(info: ItemInfo) -> dict[str, Any]:
    """One item as ``processor items --json`` prints it (its data left out)."""
    return {"id": info.id, "status": info.status, "gate": info.gate, "attempts": info.attempts,
            "last_error": info.last_error, "version": info.version,
            "retry_at": None if info.retry_at is None else info.retry_at.isoformat(),
            "parent": info.parent}


def purge_text(report: PurgeReport, *, older_than: float, statuses: tuple[str, ...],
               dry_run: bool) -> str:
    """One line saying what a purge removed, or would remove."""
    what = (f"{report.partitions} partition(s) ({', '.join(statuses)}, last updated more than "
            f"{format_duration(older_than)} ago) and {report.items} item(s)")
    return f"would delete {what}" if dry_run else f"deleted {what}"


def retry_row(report: RetryReport) -> dict[str, Any]:
    """What a retry did, as ``processor retry --json`` prints it."""
    return {"id": report.partition_id, "status": report.status, "gate": report.gate,
            "status_before": report.status_before, "gate_before": report.gate_before,
            "reopened": report.reopened, "items_reset": report.items_reset,
            "items_rerun": report.items_rerun, "items_left_failed": report.items_left_failed,
            "reduce_rearmed": report.reduce_rearmed}


def retry_text(report: RetryReport) -> str:
    """One line saying what a retry did (the CLI prints it; the console shows it)."""
    if report.reopened:
        where = (f"re-opened partition {report.partition_id!r} ({report.status_before} at "
                 f"gate {report.gate_before}) at gate {report.gate}")
    else:
        where = f"partition {report.partition_id!r} is {report.status} at gate {report.gate}"
    done = [f"{report.items_reset} failed item(s) reset"]
    if report.items_rerun:
        done.append(f"{report.items_rerun} item(s) back at their reduce gate to be reduced "
                    "again")
    if report.reduce_rearmed:
        done.append("its failed reduce re-armed")
    if report.items_left_failed:
        done.append(f"{report.items_left_failed} failed item(s) below gate {report.gate} "
                    "left failed while it runs (retry again once it has stopped)")
    if report:
        return f"{where}; " + ", ".join(done)
    if report.items_left_failed:
        return f"{where}; nothing to retry at or after its gate, " + done[-1]
    return f"{where}; nothing to retry: no item of it failed"
