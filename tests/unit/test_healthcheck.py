"""`processor healthcheck`: finding the running processor in /proc, reading its health
address with `processor run`'s own parser (flags, PROCESSOR_* variables, defaults), and
probing it. A fake /proc and a real socket; the image test runs it in a container."""

from __future__ import annotations

import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from processor.cli.common import DEFAULT_HEALTH_HOST, DEFAULT_HEALTH_PORT, app
from processor.healthcheck import (
    HealthOptionsError,
    HealthTarget,
    find_running_processors,
    health_address,
    health_target,
    probe,
    run_arguments,
)


@pytest.fixture
def run_command() -> Any:
    return typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No PROCESSOR_* variable of the test machine leaks into a parse."""
    for name in list(os.environ):
        if name.startswith("PROCESSOR_"):
            monkeypatch.delenv(name)


def fake_process(proc: Path, pid: int, argv: list[str], environ: dict[str, str] | None
                 ) -> None:
    folder = proc / str(pid)
    folder.mkdir(parents=True)
    (folder / "cmdline").write_bytes(b"\0".join(word.encode() for word in argv) + b"\0")
    if environ is not None:
        (folder / "environ").write_bytes(
            b"".join(f"{key}={value}".encode() + b"\0" for key, value in environ.items()))


@pytest.mark.parametrize(("argv", "expected"), [
    (["processor", "run", "--health-port", "9"], ["--health-port", "9"]),
    (["/opt/statefeed/bin/python3", "/opt/statefeed/bin/processor", "run"], []),
    (["python", "-m", "processor.cli", "run", "--health-host", "::"], ["--health-host", "::"]),
    (["processor", "healthcheck"], None),
    (["processor", "status", "run"], None),
    (["uvicorn", "handlers.examples.resumes:app"], None),
    (["processor"], None),
    ([], None),
])
def test_run_arguments_recognise_processor_run(argv: list[str], expected: list[str] | None
                                               ) -> None:
    assert run_arguments(argv) == expected


def test_the_running_processors_are_found_lowest_pid_first(tmp_path: Path) -> None:
    fake_process(tmp_path, 40, ["processor", "run", "--health-port", "9001"],
                 {"PROCESSOR_HEALTH_HOST": "127.0.0.2", "HOME": "/x"})
    fake_process(tmp_path, 1, ["processor", "run"], None)  # another user's: no environ
    fake_process(tmp_path, 7, ["processor", "healthcheck"], {})
    fake_process(tmp_path, 8, ["processor", "run"], {})  # this process: passed by
    (tmp_path / "self").mkdir()
    found = find_running_processors(tmp_path, own_pid=8)
    assert [(running.pid, running.args) for running in found] == [
        (1, ()), (40, ("--health-port", "9001"))]
    assert found[0].environ is None
    assert found[1].environ == {"PROCESSOR_HEALTH_HOST": "127.0.0.2", "HOME": "/x"}


@pytest.mark.usefixtures("clean_environment")
def test_flags_win_over_the_environment_which_wins_over_defaults(run_command) -> None:
    assert health_address(run_command, [], {}) == (DEFAULT_HEALTH_HOST, DEFAULT_HEALTH_PORT)
    assert health_address(run_command, [], {"PROCESSOR_HEALTH_PORT": "18093"}) == (
        DEFAULT_HEALTH_HOST, 18093)
    assert health_address(run_command, ["--health-port=18094", "--health-host", "10.1.2.3"],
                          {"PROCESSOR_HEALTH_PORT": "18093"}) == ("10.1.2.3", 18094)
    # Every other option parses too, so the health options are found among them.
    assert health_address(run_command, ["--handler-url", "http://h/", "--concurrency", "4",
                                        "--no-auto-close", "--health-port", "7"], {}) == (
        DEFAULT_HEALTH_HOST, 7)


@pytest.mark.usefixtures("clean_environment")
def test_the_parse_uses_the_processors_environment_not_this_ones(
        run_command, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROCESSOR_HEALTH_PORT", "1111")
    assert health_address(run_command, [], {"PROCESSOR_HEALTH_HOST": "127.0.0.9"}) == (
        "127.0.0.9", DEFAULT_HEALTH_PORT)
    assert os.environ["PROCESSOR_HEALTH_PORT"] == "1111"  # restored
    assert "PROCESSOR_HEALTH_HOST" not in os.environ


@pytest.mark.usefixtures("clean_environment")
def test_the_target_comes_from_the_running_processor(run_command, tmp_path: Path) -> None:
    fake_process(tmp_path, 1, ["processor", "run", "--health-port", "18093"],
                 {"PROCESSOR_HEALTH_HOST": "0.0.0.0"})
    target = health_target(run_command, proc=tmp_path)
    assert (target.host, target.port) == ("127.0.0.1", 18093)
    assert "pid 1" in target.source
    # An explicit option wins; the other still comes from the processor.
    target = health_target(run_command, port=5, proc=tmp_path)
    assert (target.host, target.port) == ("127.0.0.1", 5)


@pytest.mark.usefixtures("clean_environment")
def test_without_a_running_processor_this_environment_decides(
        run_command, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROCESSOR_HEALTH_PORT", "18095")
    monkeypatch.setenv("PROCESSOR_HEALTH_HOST", "::")
    target = health_target(run_command, proc=tmp_path)
    assert (target.host, target.port) == ("::1", 18095)
    assert target.url("/healthz") == "http://[::1]:18095/healthz"


@pytest.mark.usefixtures("clean_environment")
def test_unparseable_options_raise_the_parsers_error(run_command) -> None:
    with pytest.raises(HealthOptionsError, match="--health-port"):
        health_address(run_command, ["--health-port", "many"], {})


def test_no_proc_folder_finds_nothing(tmp_path: Path) -> None:
    assert find_running_processors(tmp_path / "missing") == []


class _Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[int]:
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _Answer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def test_probe_is_healthy_on_2xx_only(server: int) -> None:
    target = HealthTarget("127.0.0.1", server, "test")
    assert probe(target, "/healthz") == (
        True, f"http://127.0.0.1:{server}/healthz answered HTTP 200")
    assert probe(target, "/readyz") == (
        False, f"http://127.0.0.1:{server}/readyz answered HTTP 503")


def test_probe_reports_a_port_nobody_answers_and_health_port_0(server: int) -> None:
    healthy, detail = probe(HealthTarget("127.0.0.1", 1, "the flags"), "/healthz", timeout=2)
    assert not healthy and "did not answer" in detail and "the flags" in detail
    healthy, detail = probe(HealthTarget("127.0.0.1", 0, "the flags"), "/healthz")
    assert not healthy and "no health endpoints" in detail and "--no-healthcheck" in detail
