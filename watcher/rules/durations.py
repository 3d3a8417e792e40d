"""Durations as operators write them: ``7d``, ``12h``, ``30m``, ``90s``, or plain seconds.

Pure text helpers with one wording for every option that takes a duration
(``--retention``, ``--older-than``); :func:`format_duration` writes them back
the same way for logs and messages.
"""

from __future__ import annotations

import math
import re

from watcher.errors import ConfigError

UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
# One number and an optional unit; the number may have a fraction ("1.5h").
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([dhms]?)\s*$")


def parse_duration(setting: str, text: str) -> float:
    """The seconds that ``text`` says: ``7d``, ``12h``, ``30m``, ``90s``, ``1.5h`` or ``3600``.

    Raises:
        ConfigError: ``text`` is not such a duration, or it is zero; the message
            names ``setting`` and shows the forms.
    """
    match = DURATION.match(text.lower()) if isinstance(text, str) else None
    seconds = float(match.group(1)) * UNITS[match.group(2) or "s"] if match else math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(
            f"{setting} must be a duration greater than 0 such as 7d, 12h, 30m or 90s "
            f"(days, hours, minutes, seconds), got {text!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """``seconds`` in the largest unit that divides it whole: ``7d``, ``90m``, ``2.5s``."""
    for unit, size in UNITS.items():
        if seconds >= size and float(seconds / size).is_integer():
            return f"{int(seconds / size)}{unit}"
    return f"{seconds:g}s"
