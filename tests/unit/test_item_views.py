"""How the CLI and the console say an item's attempts beside its error history
(processor/views.py): a retry resets the attempts and keeps the history, and the two
must not seem to disagree. Pure, a table of cases."""

from __future__ import annotations

from datetime import datetime

import pytest

from processor.views import attempts_text, item_lines
from watcher.records import ErrorEntry, ItemInfo


def item(attempts: int, errors: int, status: str = "available") -> ItemInfo:
    history = tuple(ErrorEntry(datetime(2026, 1, 1, 0, 0, n), n + 1, 0, f"boom {n}")
                    for n in range(errors))
    return ItemInfo("p", "i", status, 0, b"", attempts, history[-1].error if history else None,
                    1, error_history=history)


@pytest.mark.parametrize(("attempts", "errors", "shown"), [
    (0, 0, "0"),  # never ran
    (2, 0, "2"),  # attempts without errors kept (stalls, older rows)
    (3, 3, "3"),  # failed three times, no retry since
    (0, 3, "0 since the last retry (3 errors in its history)"),
    (1, 3, "1 since the last retry (3 errors in its history)"),
    (0, 1, "0 since the last retry (1 error in its history)"),
])
def test_attempts_agree_with_the_history(attempts: int, errors: int, shown: str) -> None:
    assert attempts_text(item(attempts, errors)) == shown


def test_the_show_lines_say_it_above_the_listed_errors() -> None:
    lines = item_lines(item(0, 3), data_limit=None)
    assert "  attempts  0 since the last retry (3 errors in its history)" in lines
    assert sum("boom" in line for line in lines) == 3
