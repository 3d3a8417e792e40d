"""How the CLI shows partitions and items: plain rows for ``--json`` and short texts for
tables.

Pure functions over the records (:class:`~watcher.records.PartitionInfo`,
:class:`~watcher.records.ItemInfo`, :class:`~watcher.reports.PurgeReport`,
:class:`~watcher.reports.RetryReport`, :class:`~watcher.reports.RewindReport`); no I/O.
"""

from __future__ import annotations

import base64
import json
import shlex
from datetime import UTC, datetime
from typing import Any

from processor.observe.redact import redact_url
from processor.observe.safe_text import escape_controls
from watcher.records import (
    DEFAULT_PIPELINE,
    ItemInfo,
    NewItem,
    PartitionInfo,
    PartitionSettings,
)
from watcher.reports import PlaceCount, PurgeReport, RetryReport, RewindReport, WaitSummary
from watcher.rules.durations import format_duration
from watcher.text import shorten

# How much of an item's last error a table shows (--json shows all of it).
ERROR_CELL_CHARS = 100
# How much of a failed partition's last error `processor wait` shows.
LAST_ERROR_CHARS = 200


def utc_text(moment: datetime) -> str:
    """A time (naive UTC as stored, or aware) as ``2026-11-26T10:00:00Z``."""
    aware = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return aware.isoformat(timespec="seconds").replace("+00:00", "Z")


def flow_text(info: PartitionInfo) -> str:
    """A partition's flow settings for a table cell: ``"paused"``, its key and its
    priority when set (``"acme +2"``); ``"-"`` when none is."""
    parts = (["paused"] if info.paused_at is not None else []) + (
        [info.key] if info.key else []) + ([f"{info.priority:+d}"] if info.priority else [])
    return " ".join(parts) or "-"


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
    """One partition as ``processor status --json`` prints it; ``version`` is what
    ``processor rewind --if-version`` and ``pipelines move --expect-version`` take."""
    reduce = None if info.reduce is None else {
        "pass": info.reduce.pass_, "pages_done": info.reduce.pages_done,
        "failed_calls": info.reduce.attempts}
    return {"id": info.id, "status": info.status, "gate": info.gate, "version": info.version,
            "owner": info.owner,
            "counts": info.counts, "reduce_gates": list(info.reduce_gates),
            "on_item_failure": info.on_item_failure, "reduce": reduce,
            "spawned": info.spawned, "last_error": info.last_error,
            "key": info.key, "priority": info.priority, "paused": info.paused_at is not None,
            "paused_at": None if info.paused_at is None else utc_text(info.paused_at),
            "pipeline": info.pipeline, "pipeline_version": info.pipeline_version,
            **result_value(info.result)}


def pipeline_text(pipeline: str, version: str | None) -> str:
    """A pipeline and its version for a table cell: ``invoices@v2``, or ``invoices``
    while no version is pinned."""
    return pipeline if version is None else f"{pipeline}@{version}"


def unserved_line(place: PlaceCount) -> str:
    """A place no live processor serves, as ``status`` shows it: where, how many open
    partitions wait there, and what to do."""
    version = ("no version pinned yet" if place.version is None
               else f"version {place.version!r}")
    many = "partition waits" if place.partitions == 1 else "partitions wait"
    return (f"not served: {place.partitions} open {many} at pipeline {place.pipeline!r} "
            f"({version}) gate {place.gate}, which no live processor serves; start a "
            "processor whose routes serve it, or check the routes of those running")


def error_after_context(item: ItemInfo) -> str | None:
    """An item's last error without the context earlier versions put before it (its
    partition, id, gate and attempt), for a table whose columns show them already, so
    a cut cell still shows what went wrong; the whole error when it does not start so
    (errors stored now never do: :func:`processor.wire.errors.item_error`).

    The processor wrote the attempt that failed, which is the item's ``attempts``
    while the error stands (a retry resets them, and the error then shows whole).
    """
    from processor.wire.errors import item_context

    error = item.last_error
    prefix = item_context(item.partition_id, item.id, item.gate, item.attempts) + ": "
    return error[len(prefix):] if error and error.startswith(prefix) else error


def error_cell(error: str | None, limit: int = ERROR_CELL_CHARS) -> str:
    """An item's last error for a table cell: its first line, shortened, its control
    characters escaped; ``-`` for none."""
    if not error:
        return "-"
    lines = error.strip().splitlines()
    return escape_controls(shorten(lines[0] if lines else "", limit)) + (
        " ..." if len(lines) > 1 else "")


def attempts_text(info: ItemInfo) -> str:
    """An item's attempts, said so that they agree with its error history: a retry
    resets the attempts and keeps the history, so ``"0 since the last retry (3 errors
    in its history)"`` where the history holds more errors than the attempts count."""
    errors = len(info.error_history)
    if errors <= info.attempts:
        return str(info.attempts)
    return (f"{info.attempts} since the last retry ({plural(errors, 'error')} in its "
            "history)")


def item_row(info: ItemInfo) -> dict[str, Any]:
    """One item as ``processor items --json`` prints it (its data left out); a waiting
    item's ``deadline`` is when its wait times out (its ``retry_at``)."""
    return {"id": info.id, "status": info.status, "gate": info.gate, "attempts": info.attempts,
            "last_error": info.last_error, "version": info.version,
            "retry_at": None if info.retry_at is None else info.retry_at.isoformat(),
            "deadline": wait_deadline(info), "parent": info.parent}


def wait_deadline(info: ItemInfo) -> str | None:
    """When a waiting item's wait times out (RFC 3339, UTC); ``None`` for any other item."""
    if info.status != "waiting" or info.retry_at is None:
        return None
    moment = info.retry_at
    return (moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment).isoformat()


def waiting_row(summary: WaitSummary | None) -> dict[str, Any] | None:
    """A partition's parked items as ``status --json`` and the API show them: counts per
    gate, the longest wait in seconds and the earliest deadline; ``None`` when none."""
    if summary is None:
        return None
    deadline = summary.next_deadline
    return {"by_gate": {str(gate): count for gate, count in sorted(summary.by_gate.items())},
            "oldest_seconds": round(summary.oldest_seconds, 3),
            "next_deadline": None if deadline is None else (
                deadline.replace(tzinfo=UTC) if deadline.tzinfo is None else deadline
            ).isoformat()}


def waiting_text(summary: WaitSummary) -> str:
    """A partition's parked items in a line: ``"3 waiting (gate 1: 2, gate 2: 1); the
    oldest for 4 min"``."""
    total = sum(summary.by_gate.values())
    gates = ", ".join(f"gate {gate}: {count}" for gate, count in sorted(summary.by_gate.items()))
    return f"{total} waiting ({gates}); the oldest for {age_text(summary.oldest_seconds)}"


def age_text(seconds: float) -> str:
    """A duration for a person: ``"42 s"``, ``"7 min"``, ``"3 h"``, ``"2 d"``."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{int(seconds // size)} {unit}"
    return f"{int(seconds)} s"


def history_rows(info: ItemInfo) -> list[dict[str, Any]]:
    """An item's error history for JSON output, the oldest entry first."""
    return [{"at": entry.at.isoformat(), "attempt": entry.attempt, "gate": entry.gate,
             "error": entry.error} for entry in info.error_history]


def item_detail(info: ItemInfo) -> dict[str, Any]:
    """One item as ``processor items PARTITION --show ITEM --json`` prints it: its row,
    its partition, its data whole (``data`` when it is JSON, ``data_b64`` otherwise, and
    ``data_bytes``) and its error history."""
    data: dict[str, Any]
    try:
        data = {"data": json.loads(info.data)} if info.data else {"data_b64": ""}
    except ValueError:
        data = {"data_b64": base64.b64encode(info.data).decode("ascii")}
    return {"partition": info.partition_id, **item_row(info), "data_bytes": len(info.data),
            **data, "error_history": history_rows(info)}


def data_lines(data: bytes, limit: int | None) -> tuple[str, list[str]]:
    """An item's data for the terminal: what it is (``"JSON, 12 bytes"``, ``"binary,
    3 bytes, hex"``, ``"empty"``) and its lines, JSON pretty-printed and other bytes in
    hex, 32 bytes a line. With a ``limit`` (characters), the text stops there and a last
    line says how much was left out and that ``--all`` prints it whole."""
    size = f"{len(data):,} byte{'' if len(data) == 1 else 's'}"
    if not data:
        return "empty", []
    try:
        text = json.dumps(json.loads(data), indent=2, ensure_ascii=False)
        kind = f"JSON, {size}"
    except ValueError:
        text = "\n".join(data[start:start + 32].hex(" ")
                         for start in range(0, len(data), 32))
        kind = f"binary, {size}, hex"
    if limit is None or len(text) <= limit:
        return kind, text.splitlines()
    left_out = len(text) - limit
    return kind, [*text[:limit].splitlines(),
                  f"... ({left_out:,} more characters; --all prints it whole)"]


def item_lines(info: ItemInfo, *, data_limit: int | None) -> list[str]:
    """One item as ``processor items PARTITION --show ITEM`` prints it: its status, gate,
    attempts, parent and retry time, its data (:func:`data_lines`), and its error
    history, the oldest first (an error stored before the history existed shows alone).
    Each line is safe for a terminal: control characters in the data and the errors are
    escaped (:func:`processor.observe.safe_text.escape_controls`)."""
    lines = [f"item {info.id!r} of partition {info.partition_id!r}",
             f"  status    {info.status}", f"  gate      {info.gate}",
             f"  attempts  {attempts_text(info)}", f"  parent    {info.parent or '-'}"]
    if info.retry_at is not None and info.status == "available":
        lines.append(f"  ready at  {info.retry_at.isoformat(sep=' ', timespec='milliseconds')} UTC")
    if info.retry_at is not None and info.status == "waiting":
        lines.append(f"  deadline  {info.retry_at.isoformat(sep=' ', timespec='milliseconds')} "
                     "UTC (its wait times out then)")
    kind, shown = data_lines(info.data, data_limit)
    lines.append(f"data ({kind})" + (":" if shown else ""))
    lines += [f"  {line}" for line in shown]
    if info.error_history:
        lines.append("error history (oldest first; times UTC):")
        for entry in info.error_history:
            first, *more = entry.error.splitlines() or [""]
            lines.append(f"  {entry.at.isoformat(sep=' ', timespec='milliseconds')}  "
                         f"attempt {entry.attempt}  gate {entry.gate}  {first}")
            lines += [f"      {line}" for line in more]
    elif info.last_error:
        lines.append(f"last error: {info.last_error}")
    else:
        lines.append("no errors")
    return [escape_controls(line) for line in lines]


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


def rewind_row(report: RewindReport) -> dict[str, Any]:
    """What a rewind did, as ``processor rewind --json`` prints it (and the API answers)."""
    return {"id": report.partition_id, "status": "available", "gate": report.gate,
            "status_before": report.status_before, "gate_before": report.gate_before,
            "version_before": report.version_before, "reopened": report.reopened,
            "items_reset": report.items_reset, "items_removed": report.items_removed,
            "items_rerun": report.items_rerun, "reduces_again": list(report.reduces_again),
            "result_cleared": report.result_cleared}


def rewind_text(report: RewindReport) -> str:
    """One line saying what a rewind did (the CLI prints it; the console shows it)."""
    where = (f"rewound partition {report.partition_id!r} from gate {report.gate_before} "
             f"({report.status_before}) to gate {report.gate}")
    done = [f"{plural(report.items_reset, 'item')} back at gate {report.gate}"]
    if report.items_removed:
        done.append(f"{plural(report.items_removed, 'spawned item')} removed")
    if report.items_rerun:
        done.append(f"{plural(report.items_rerun, 'item')} back at their reduce gate to be "
                    "reduced again")
    if report.reduces_again:
        gates = ", ".join(str(gate) for gate in report.reduces_again)
        done.append(f"the reduce at gate{'s' if len(report.reduces_again) > 1 else ''} "
                    f"{gates} runs again"
                    + (" (result cleared)" if report.result_cleared else ""))
    return f"{where}; " + ", ".join(done)


def plural(count: int, noun: str) -> str:
    """``"1 item"``, ``"2 items"``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def counts_text(counts: dict[str, int]) -> str:
    """Item counts by status: ``"2 available, 5 complete"``; ``"none"``."""
    return ", ".join(f"{count} {status}" for status, count in sorted(counts.items())) or "none"


def created_text(partition_id: str, count: int, first_gate: int,
                 settings: PartitionSettings, start_at: datetime | None = None) -> str:
    """What ``processor create`` did, in one line: its items, and each setting that is
    not the default (key, priority, quorums, start time, reduce gates, failure policy)."""
    text = f"created partition {partition_id!r} with {plural(count, 'item')}"
    if settings.key:
        text += f" under key {settings.key!r}"
    if first_gate:
        text += f", starting at gate {first_gate}"
    if settings.reduce_gates:
        text += f"; reduce gates {', '.join(map(str, sorted(settings.reduce_gates)))}"
    if settings.continue_on_failure:
        text += "; a failed item does not stop it (on-item-failure: continue)"
    if settings.priority:
        text += f"; priority {settings.priority:+d}"
    for gate, k in settings.quorum:
        text += f"; gate {gate} passes on the first {plural(k, 'item')}"
    if settings.notify is not None:
        text += f"; its end is notified to {redact_url(settings.notify)}"
    if settings.pipeline != DEFAULT_PIPELINE or settings.pipeline_version is not None:
        text += f"; pipeline {pipeline_text(settings.pipeline, settings.pipeline_version)}"
    if start_at is not None:
        text += f"; no processor starts it before {utc_text(start_at)}"
    return text


def added_text(partition_id: str, items: list[NewItem], reopened: bool) -> str:
    """What ``processor add`` did, in one line."""
    gates = sorted({item.gate or 0 for item in items})
    where = f"gate {gates[0]}" if len(gates) == 1 else f"gates {gates[0]} to {gates[-1]}"
    text = f"added {plural(len(items), 'item')} at {where} to partition {partition_id!r}"
    return text + ("; it was complete and is open again" if reopened else "")


def final_text(info: PartitionInfo) -> str:
    """How a partition ended, for ``processor wait``, with what to do next."""
    items = counts_text(info.counts)
    if info.status == "complete":
        text = f"partition {info.id!r} is complete at gate {info.gate} (items: {items})"
        if info.result is not None:
            text += f"; `processor result {shlex.quote(info.id)}` prints its result"
        return text
    if info.status == "cancelled":
        return (f"partition {info.id!r} was cancelled at gate {info.gate} (items: {items}); "
                "`processor retry` resumes it")
    text = f"partition {info.id!r} failed at gate {info.gate} (items: {items})"
    if info.last_error:
        text += f": {error_cell(info.last_error, LAST_ERROR_CHARS)}"
    return text + ("; `processor items --status failed` shows its failed items, "
                   "`processor retry` runs them again")
