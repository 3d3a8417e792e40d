"""The proof runner's bookkeeping (tests/proof/runner.py, handler.py and the logs the CLI
keeps): when each process logged its start and when a call was built, on the run's
clock, and the processes' logs kept beside the history."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from tests.proof.__main__ import keep_logs
from tests.proof.handler import sent_at
from tests.proof.history import History
from tests.proof.runner import _logged_at


def test_a_log_lines_time_is_read_on_the_runs_clock() -> None:
    history = History()
    history.wall = datetime(2026, 12, 8, 0, 27, 27, 60000).timestamp()
    log = ("2026-12-08 00:27:39,160 INFO processor.service action=starting owner=p0g1\n"
           "2026-12-08 00:27:40,370 INFO watcher.schedule_ticker action=ticker_started\n")
    assert _logged_at(log, "action=starting", history) == 12.1
    assert _logged_at(log, "action=ticker_started", history) == 13.31
    assert _logged_at(log, "action=watcher_started", history) is None
    assert _logged_at("Traceback (most recent call last): action=starting", "action=starting",
                      history) is None


def test_the_processes_logs_are_kept_beside_the_history(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "p0g1.err").write_text("action=starting owner=p0g1\n")
    (work / "p0g1.out").write_text("")
    (work / "proof.db").write_text("not a log")
    logs = keep_logs(work, tmp_path / "proof-7.jsonl")
    assert logs == tmp_path / "proof-7.logs"
    assert sorted(p.name for p in logs.iterdir()) == ["p0g1.err", "p0g1.out"]
    assert (logs / "p0g1.err").read_text() == "action=starting owner=p0g1\n"


def test_a_calls_build_time_is_read_from_its_completion_token() -> None:
    from watcher.waits import new_completion_token

    history = History()
    history.wall = 1796688200.0
    assert sent_at(f"{1796688218869:012x}" + "x" * 43, history) == 18.869
    assert sent_at("not-a-timed-token-" + "x" * 37, history) is None
    assert sent_at("", history) is None
    now = History()
    assert abs(sent_at(new_completion_token(), now) - now.now()) < 0.05  # type: ignore[operator]
