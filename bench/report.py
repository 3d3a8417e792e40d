"""Printing the results as rich tables and writing them as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from bench.common import Goal, Outcome

VERDICT_STYLE = {"PASS": "bold green", "MISS": "bold red", "n/a": "dim"}


def print_outcome(console: Console, outcome: Outcome) -> None:
    """One table per scenario: what was measured, the figure, and how."""
    table = Table(title=f"{outcome.title}  [{outcome.seconds:.0f} s]", title_justify="left",
                  show_lines=False, expand=False)
    table.add_column("measure", style="bold", overflow="fold")
    table.add_column("figure", justify="right", no_wrap=True)
    table.add_column("detail", style="dim", overflow="fold")
    if outcome.status == "error":
        table.add_row("error", Text("ERROR", style="bold red"), outcome.reason)
    for row in outcome.rows:
        style = "bold cyan" if row.what.startswith("ratio") else None
        table.add_row(row.what, Text(row.figure, style=style or ""), row.detail)
    console.print(table)


def print_goals(console: Console, goals: list[Goal],
                title: str = "Goals") -> None:
    """The performance goals next to the figures, PASS or MISS (never asserted)."""
    table = Table(title=title, title_justify="left")
    table.add_column("goal", style="bold")
    table.add_column("target", justify="right")
    table.add_column("measured", justify="right")
    table.add_column("result", justify="center")
    for goal in goals:
        table.add_row(goal.name, goal.target, goal.measured,
                      Text(goal.verdict, style=VERDICT_STYLE[goal.verdict]))
    console.print(table)


def write_json(path: Path, document: dict[str, Any]) -> None:
    """Write ``document`` to ``path`` (creating its directory), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(json.dumps(document, indent=2, default=str) + "\n")
    partial.replace(path)
