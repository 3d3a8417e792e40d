"""Data made safe to show: control characters escaped so that they are seen, not obeyed.

Ids, keys, error texts and item data come from users and handlers. Printed raw, a
newline forges a log line, and an escape sequence retitles a terminal, clears it or
recolours what follows. :func:`escape_controls` is the one rule, for the text log
(:mod:`processor.observe.logs`) and the terminal (the CLI's output, :mod:`processor.views`):
every C0 control character (``\\x00``-``\\x1f``), DEL, every C1 control character
(``\\x80``-``\\x9f``), the Unicode line and paragraph separators and the bidirectional
overrides are written as visible escapes: ``\\n``, ``\\r``, ``\\t``, ``\\x1b``,
``\\u2028``. Everything else, backslashes included, is left as it is.

:func:`json_text` does the same for JSON printed with ``ensure_ascii=False``: JSON
escapes C0 already, the rest becomes ``\\u`` escapes, and the text stays JSON. Pure.
"""

from __future__ import annotations

import re
from typing import Final

_NAMED: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# C0, DEL, C1; the line and paragraph separators (str.splitlines breaks on them);
# the bidirectional embeddings, overrides and isolates (they reorder what follows).
_CONTROL: Final = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# What JSON (RFC 8259) leaves raw but a terminal or a line reader may obey.
_JSON_RAW: Final = re.compile("[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    char = match.group(0)
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """``text`` with every control character written as a visible escape (``\\n``,
    ``\\x1b``, ``\\x9b``, ``\\u2028``): one line, and nothing a terminal obeys. Text
    without one comes back as it is. Never raises."""
    if _CONTROL.search(text) is None:
        return text
    return _CONTROL.sub(_escape, text)


def json_text(text: str) -> str:
    """JSON text (``json.dumps(..., ensure_ascii=False)``) with the characters JSON leaves
    raw but a terminal may obey (DEL, C1, the separators and bidirectional controls)
    written as ``\\u`` escapes. Still JSON, with the same value. Never raises."""
    if _JSON_RAW.search(text) is None:
        return text
    return _JSON_RAW.sub(lambda match: f"\\u{ord(match.group(0)):04x}", text)
