"""The error history's pure functions: append and bound, decode, and the marker the
store's write stamps."""

from __future__ import annotations

import json
from datetime import datetime

from watcher.records import ErrorEntry
from watcher.rules.error_history import (
    HISTORY_LENGTH,
    HISTORY_MAX_BYTES,
    PENDING_TIME,
    appended,
    decode_history,
)


def stamp(history: str, at: str) -> str:
    """What the store's write does to the new entry (Statements.history_stamped)."""
    return history.replace(PENDING_TIME, '{"at":"' + at + '",')


def test_appended_adds_one_pending_entry_and_keeps_the_newest() -> None:
    history = None
    for attempt in range(1, HISTORY_LENGTH + 3):
        history = stamp(appended(history, attempt=attempt, gate=2, error=f"e{attempt}"),
                        f"2030-01-01 00:00:0{attempt}")
    entries = decode_history(history)
    assert [entry.attempt for entry in entries] == list(range(3, HISTORY_LENGTH + 3))
    assert entries[-1] == ErrorEntry(datetime(2030, 1, 1, 0, 0, HISTORY_LENGTH + 2),
                                     HISTORY_LENGTH + 2, 2, f"e{HISTORY_LENGTH + 2}")
    pending = appended(history, attempt=9, gate=2, error="new")
    assert pending.count(PENDING_TIME) == 1 and pending.endswith(
        PENDING_TIME + '"attempt":9,"gate":2,"error":"new"}]')


def test_the_marker_never_appears_inside_an_error_text() -> None:
    text = appended(None, attempt=1, gate=0, error=f"quoting {PENDING_TIME} here")
    assert text.count(PENDING_TIME) == 1


def test_appended_stays_within_its_byte_bound() -> None:
    history = None
    for attempt in range(1, HISTORY_LENGTH + 1):
        history = stamp(appended(history, attempt=attempt, gate=0,
                                 error="\U0001f600\x01" * 2000), "2030-01-01 00:00:00")
    assert history is not None and len(history.encode()) <= HISTORY_MAX_BYTES
    assert 1 <= len(decode_history(history)) < HISTORY_LENGTH


def test_decode_reads_each_database_time_form_and_skips_damage() -> None:
    assert decode_history(None) == () and decode_history("") == ()
    assert decode_history("not json") == () and decode_history('{"a":1}') == ()
    stored = json.dumps([
        {"at": "2030-01-01 10:00:00.1234567", "attempt": 1, "gate": 0, "error": "mssql"},
        {"at": "2030-01-01T10:00:01", "attempt": 2, "gate": 0, "error": "iso"},
        {"at": "2030-01-01 12:00:02+02:00", "attempt": 3, "gate": 0, "error": "offset"},
        {"at": None, "attempt": 4, "gate": 0, "error": "never stamped"},
        {"at": "2030-01-01 10:00:03", "attempt": "5", "gate": 0, "error": "bad attempt"},
        "not an entry",
    ])
    assert decode_history(stored) == (
        ErrorEntry(datetime(2030, 1, 1, 10, 0, 0, 123456), 1, 0, "mssql"),
        ErrorEntry(datetime(2030, 1, 1, 10, 0, 1), 2, 0, "iso"),
        ErrorEntry(datetime(2030, 1, 1, 10, 0, 2), 3, 0, "offset"))
