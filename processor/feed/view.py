"""What ``processor watch`` shows: a Rich progress bar per gate, a line per gate move, and
the result line at the end, drawn from the feed's events
(:mod:`processor.feed.events`).

A gate's bar counts the items that passed it (at a later gate now, or settled at it)
out of those that reached it.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn

from processor.feed.events import COUNTS, END, GATE, RESULT, STATE, Received

RESULT_CHARS = 200


def counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{status} {count}" for status, count in sorted(counts.items())) or "none"


def end_line(partition_id: str, end: dict[str, Any], result: dict[str, Any] | None) -> str:
    """How the partition ended, on one line, with its result when it is short."""
    status = end.get("status")
    gate = end.get("gate")
    text = f"partition {partition_id!r} "
    text += {"complete": "is complete", "failed": "failed", "cancelled": "was cancelled",
             "deleted": "was deleted"}.get(str(status), f"ended ({status})")
    text += f" at gate {gate} (items: {counts_text(end.get('counts') or {})})"
    if status == "failed" and end.get("last_error"):
        text += f": {str(end['last_error'])[:RESULT_CHARS]}"
    if result is not None:
        if "result" in result:
            import json

            shown = json.dumps(result["result"], separators=(",", ":"))
            text += "; result " + (shown if len(shown) <= RESULT_CHARS
                                   else f"of {result['size']} bytes")
        else:
            text += f"; result of {result.get('size')} bytes"
    return text


class WatchView:
    """The bars and lines of one ``processor watch``, fed event by event."""

    def __init__(self, partition_id: str, console: Console) -> None:
        self.partition_id = partition_id
        self.console = console
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[detail]}"),
                                 console=console, transient=False, auto_refresh=True)
        self.tasks: dict[int, TaskID] = {}
        self.totals: dict[int, int] = {}  # items that reached each gate, as last shown
        self.result: dict[str, Any] | None = None
        self.end: dict[str, Any] | None = None

    def __enter__(self) -> WatchView:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def show(self, event: Received) -> None:
        """Draw ``event``. Events this version does not know are ignored."""
        data = event.json()
        if event.kind == STATE:
            self.console.print(f"following partition {self.partition_id!r}: {data['status']} "
                               f"at gate {data['gate']}")
            self._bars(data["gates"], data["gate"])
        elif event.kind == COUNTS:
            self._bars(data["gates"], data["gate"])
        elif event.kind == GATE:
            gap = " (moves between were not seen)" if data.get("gap") else ""
            self.console.print(f"gate {data['from']} -> gate {data['to']}{gap}")
        elif event.kind == RESULT:
            self.result = data
        elif event.kind == END:
            self.end = data
            self._bars(data.get("gates") or [], data["gate"])

    def _bars(self, gates: list[dict[str, Any]], current: int) -> None:
        here = {row["gate"] for row in gates}
        for gate, task in self.tasks.items():
            if gate not in here:  # every item has left it: all that reached it passed
                self.progress.update(task, description=f"gate {gate}  ",
                                     completed=self.totals[gate], detail="passed")
        for row in gates:
            gate = row["gate"]
            detail = counts_text(row["items"])
            label = f"gate {gate}" + (" *" if gate == current else "  ")
            self.totals[gate] = row["total"]
            if gate not in self.tasks:
                self.tasks[gate] = self.progress.add_task(label, total=row["total"],
                                                          completed=row["passed"],
                                                          detail=detail)
            else:
                self.progress.update(self.tasks[gate], description=label, total=row["total"],
                                     completed=row["passed"], detail=detail)

    def end_text(self) -> str:
        return end_line(self.partition_id, self.end or {}, self.result)
