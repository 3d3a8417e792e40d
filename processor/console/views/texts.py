"""How the console words times and counts: ``"5 min"`` ago, ``"in 2 h"``, ``"100,000+"``.

Pure functions; no I/O, no HTML.
"""

from __future__ import annotations

from datetime import datetime


def age_text(then: datetime | None, now: datetime) -> str:
    """How long ago ``then`` was, in its largest whole unit: ``"12 s"``, ``"5 min"``,
    ``"3 h"``, ``"2 d"``; ``"-"`` when unknown. A time ahead of ``now`` reads ``"0 s"``."""
    if then is None:
        return "-"
    seconds = max(0, int((now - then).total_seconds()))
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def until_text(then: datetime | None, now: datetime) -> str:
    """How far ahead ``then`` is, in its largest whole unit: ``"in 2 h"``; ``"now"``
    once it has come; ``"none"`` when there is no such time."""
    if then is None:
        return "none"
    return "now" if then <= now else f"in {age_text(now, then)}"


def count_text(count: int, cap: int) -> str:
    """A count with thousands separators; ``"100,000+"`` when it reached the ``cap`` it
    was read with."""
    return f"{count:,}+" if count >= cap else f"{count:,}"
