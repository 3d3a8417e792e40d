"""The benchmark empties only log directories it made itself."""

from __future__ import annotations

from pathlib import Path

from bench.suite import LOG_MARKER, fresh_log_directory


def test_a_foreign_directory_is_left_alone(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "keep.txt").write_text("a user's file")
    problem = fresh_log_directory(logs)
    assert problem is not None and "not made by the benchmark" in problem
    assert (logs / "keep.txt").read_text() == "a user's file"


def test_its_own_directory_is_emptied_and_marked(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    assert fresh_log_directory(logs) is None  # made
    (logs / "old.log").write_text("from the last run")
    assert fresh_log_directory(logs) is None  # emptied
    assert sorted(path.name for path in logs.iterdir()) == [LOG_MARKER]


def test_an_empty_directory_is_taken(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    assert fresh_log_directory(logs) is None
    assert (logs / LOG_MARKER).exists()
