"""An item's error history: its last few errors, each with when, which attempt and at
which gate it failed. Pure functions over the stored text; no I/O.

The history is stored in ``items.error_history`` as a JSON array, the oldest entry
first, each entry ``{"at": time, "attempt": n, "gate": g, "error": text}``.

The time comes from the database clock, stamped by the very UPDATE that writes the
entry: the engine appends the new entry with ``"at": null`` (:func:`appended`), and
the store's result write replaces that one marker, :data:`PENDING_TIME`, with the
clock's time as text (:meth:`watcher.store.sql.shared.Statements.history_stamped`), the
same time it writes to ``updated_at``. That is exact, costs no statement of its
own, and needs no time read beforehand. The marker cannot occur inside an entry's
text: JSON escapes every quote inside a string, and the marker holds raw quotes.
Older entries keep the times they were stamped with, as the database wrote them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from watcher.records import ErrorEntry

# How many errors an item keeps (the newest ones).
HISTORY_LENGTH = 5
# The most UTF-8 bytes a stored history takes: the oldest entries go first past it.
# Each error is at most MAX_ERROR_LENGTH characters (watcher.rules.decisions); this keeps the
# text well inside the smallest text column a database gives it (MariaDB's TEXT, 64 KiB).
HISTORY_MAX_BYTES = 32_000
# How a new entry starts before the store stamps its time (see the module's docstring).
PENDING_TIME = '{"at":null,'


def encode_entries(entries: Sequence[dict[str, Any]]) -> str:
    """``entries`` as the stored JSON text (compact; non-ASCII kept as it is)."""
    return json.dumps(list(entries), ensure_ascii=False, separators=(",", ":"))


def stored_entries(history: str | None) -> list[dict[str, Any]]:
    """The entries of a stored history, as stored (``[]`` for ``None`` or a text that is
    not a history: a damaged value is dropped rather than kept growing)."""
    if not history:
        return []
    try:
        entries = json.loads(history)
    except ValueError:
        return []
    if not isinstance(entries, list):
        return []
    return [entry for entry in entries if isinstance(entry, dict)]


def appended(history: str | None, *, attempt: int, gate: int, error: str) -> str:
    """The stored history ``history`` with a new entry for a failed ``attempt`` at
    ``gate`` with ``error``, keeping the newest :data:`HISTORY_LENGTH` within
    :data:`HISTORY_MAX_BYTES`. The new entry's time is :data:`PENDING_TIME`, which the
    store's write replaces with the database clock's time."""
    if history is None:
        # The common case (an item's first error): one entry, with no dictionary to build.
        text = (f'[{PENDING_TIME}"attempt":{int(attempt)},"gate":{int(gate)},"error":'
                f"{json.dumps(error, ensure_ascii=False)}}}]")
        if len(text.encode("utf-8")) <= HISTORY_MAX_BYTES:
            return text
    entries = stored_entries(history)
    entries.append({"at": None, "attempt": attempt, "gate": gate, "error": error})
    del entries[:-HISTORY_LENGTH]
    text = encode_entries(entries)
    while len(entries) > 1 and len(text.encode("utf-8")) > HISTORY_MAX_BYTES:
        del entries[0]
        text = encode_entries(entries)
    return text


def parse_time(value: object) -> datetime | None:
    """A stamped time as a naive UTC datetime (each database writes its own text form of
    its timestamp: ISO 8601 with a space or a ``T``, up to 7 fractional digits);
    ``None`` when it is not one."""
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    offset = moment.utcoffset()
    return moment if offset is None else (moment - offset).replace(tzinfo=None)


def decode_history(history: str | None) -> tuple[ErrorEntry, ...]:
    """The entries of a stored history, the oldest first: ``()`` for ``None`` (an item
    that never failed, or one written before the history existed). An entry that
    cannot be read (a damaged value) is left out rather than failing the read."""
    decoded: list[ErrorEntry] = []
    for entry in stored_entries(history):
        at = parse_time(entry.get("at"))
        attempt, gate, error = entry.get("attempt"), entry.get("gate"), entry.get("error")
        if (at is None or not isinstance(attempt, int) or not isinstance(gate, int)
                or not isinstance(error, str)):
            continue
        decoded.append(ErrorEntry(at=at, attempt=attempt, gate=gate, error=error))
    return tuple(decoded)
