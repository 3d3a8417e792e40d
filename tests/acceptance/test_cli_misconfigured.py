"""A misconfigured processor refuses to start instead of looking healthy.

``processor run`` needs its database named; its first log line says (masked) which
database, handler and concurrency it runs with; and every verb but ``migrate`` refuses a
database that was never migrated with the same line, without creating a SQLite file.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.acceptance.harness.processes import spawn
from tests.support.forked_cli import as_text, run_processor
from tests.support.servers import free_port

NOT_MIGRATED = "run `processor migrate` first"
# Every verb that reads or writes the tables, with the arguments it needs.
VERBS = [["status"], ["status", "--watch", "--interval", "0.1"], ["items", "p"],
         ["result", "p"], ["retry", "p"], ["cancel", "p"], ["delete", "p"],
         ["set-gate", "p", "2"], ["purge", "--older-than", "1d"], ["create", "p"],
         ["add", "p", "--items", os.devnull], ["wait", "p", "--timeout", "1"],
         ["pause", "p"], ["resume", "--key", "k"], ["pause", "--all"], ["keys"],
         ["keys", "set", "k", "--max-inflight", "2"],
         ["console", "--port", "0"], ["api", "--port", "0"],
         ["run", "--handler-url", "http://127.0.0.1:9/", "--health-port", "0",
          "--exit-on-db-error"],
         ["run", "--handler-url", "http://127.0.0.1:9/", "--health-port", "0",
          "--exit-on-db-error", "--log-format", "json"]]


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None,
        ) -> subprocess.CompletedProcess[str]:
    """``processor *args`` in ``cwd``, with no PROCESSOR_* variable of the caller's."""
    clean = {name: value for name, value in os.environ.items()
             if not name.startswith("PROCESSOR_")}
    return as_text(run_processor(args, cwd=cwd, env={**clean, **(env or {})}))


def one_line(done: subprocess.CompletedProcess[str], code: int) -> str:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    # run logs its start-up line first; the error is the last line, and the only other.
    errors = [line for line in lines if "action=starting" not in line]
    assert len(errors) == 1, done.stderr
    assert errors[0].startswith("processor: error: "), done.stderr
    assert "Traceback" not in done.stderr
    return errors[0]


def test_run_without_a_database_exits_2_and_creates_nothing(tmp_path: Path) -> None:
    for extra in ([], ["--migrate"]):
        done = cli("run", "--handler-url", "http://127.0.0.1:9/", "--health-port", "0",
                   *extra, cwd=tmp_path)
        line = one_line(done, 2)
        assert "--db-url is required" in line and "PROCESSOR_DB_URL" in line
    # An empty variable is no database either.
    done = cli("run", "--handler-url", "http://127.0.0.1:9/", cwd=tmp_path,
               env={"PROCESSOR_DB_URL": ""})
    assert "--db-url is required" in one_line(done, 2)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("verb", VERBS, ids=lambda verb: "-".join(
    [verb[0], *(part[2:] for part in verb if part in ("--watch", "--log-format"))]))
def test_a_mistyped_sqlite_path_is_refused_not_created(tmp_path: Path, verb: list[str]
                                                       ) -> None:
    typo = tmp_path / "procesor.db"
    done = cli(*verb, "--db-url", f"sqlite:///{typo}", cwd=tmp_path)
    line = one_line(done, 1)
    assert line.endswith(NOT_MIGRATED), line
    assert "no statefeed tables" in line
    assert list(tmp_path.iterdir()) == [], "a SQLite file was created"


@pytest.mark.parametrize("verb", VERBS, ids=lambda verb: "-".join(
    [verb[0], *(part[2:] for part in verb if part in ("--watch", "--log-format"))]))
def test_every_verb_refuses_a_database_never_migrated(db_url: str, tmp_path: Path,
                                                      verb: list[str]) -> None:
    prefix = f"nm{uuid.uuid4().hex[:8]}_"
    if db_url.startswith("sqlite"):
        # An existing file without the tables (not a missing one: see the test above).
        Path(db_url.removeprefix("sqlite:///")).touch()
    done = cli(*verb, "--db-url", db_url, "--table-prefix", prefix, cwd=tmp_path)
    line = one_line(done, 1)
    assert line.endswith(NOT_MIGRATED), line
    assert f"with prefix {prefix!r}" in line and f"{prefix}partitions" in line


async def test_run_migrate_creates_the_file_and_logs_what_it_runs_with(tmp_path: Path
                                                                       ) -> None:
    db_file = tmp_path / "fresh.db"
    handler = "http://ranker:s3cret-pass@127.0.0.1:9/process?token=t0ken-value"
    port = free_port()
    proc = await spawn("p1", ["run", "--db-url", f"sqlite:///{db_file}", "--migrate",
                              "--handler-url", handler, "--concurrency", "7",
                              "--health-port", str(port), "--health-host", "127.0.0.1",
                              "--owner-id", "p1"], tmp_path, health_port=port)
    try:
        line = await proc.wait_log("action=starting")
        await proc.wait_log("action=migrated")
    finally:
        assert await proc.terminate() == 0, proc.stderr()
    assert db_file.exists()
    start = next(part for part in line.splitlines() if "action=starting" in part)
    assert f"database=sqlite:///{db_file}" in start
    assert "concurrency=7" in start and "owner=p1" in start and "migrate=yes" in start
    assert "handler=http://ranker:***@127.0.0.1:9/process" in start
    assert "s3cret-pass" not in proc.stderr() and "t0ken-value" not in proc.stderr()


async def test_the_start_line_masks_the_database_password(db_url: str, tmp_path: Path
                                                          ) -> None:
    if db_url.startswith("sqlite"):
        pytest.skip("a SQLite URL has no password")
    # The test servers let anyone in: a password in the URL is accepted and ignored.
    scheme, rest = db_url.split("://", 1)
    user, host = rest.split("@", 1)
    with_password = f"{scheme}://{user}:pw-{uuid.uuid4().hex[:6]}@{host}"
    proc = await spawn("p2", ["run", "--db-url", with_password, "--table-prefix", "never_",
                              "--handler-url", "http://127.0.0.1:9/", "--health-port", "0",
                              "--owner-id", "p2"], tmp_path)
    try:
        start = await proc.wait_log("action=starting")
    finally:
        # It goes on to refuse the unmigrated prefix (or to wait for MariaDB, which refuses
        # a password for a user without one): how it ends is not what this test checks.
        await proc.terminate()
    assert f"{user}:***@" in start, start
    assert with_password.split(":")[2].split("@")[0] not in proc.stderr()


def test_run_with_a_bad_routes_file_says_each_error_on_a_line_and_starts_nothing(
        tmp_path: Path) -> None:
    routes = tmp_path / "routes.toml"
    routes.write_text('[[pipeline]]\nname = "a"\n[[pipeline.route]]\ngate = 0\n\n'
                      '[[pipeline.route]]\ngate = 1\nurl = "ftp://x/"\nretries = 3\n')
    done = cli("run", "--db-url", f"sqlite:///{tmp_path / 'never.db'}", "--health-port",
               "0", env={"PROCESSOR_ROUTES": str(routes)}, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "never.db").exists()
    assert done.stderr.splitlines() == [
        f"processor: error: {routes}:3: pipeline 'a' gate 0: the route has no url; give "
        "the handler's URL, such as url = \"http://ocr:8000/process\"",
        f"processor: error: {routes}:9: pipeline 'a': unknown key 'retries' in a route; use "
        "batch_size, batch_url, gate, headers, health_url, reduce_url, timeout, url, version",
        f"processor: error: {routes}:6: pipeline 'a' gate 1: url 'ftp://x/' must start "
        "with http:// or https://, such as http://handler:8000/process"]
    routes.write_text('[[pipeline]]\nname = "a"\n[[pipeline.route]]\ngate = "*"\n'
                      'url = "http://h/"\n')
    both = cli("run", "--routes", str(routes), "--handler-url", "http://h/", cwd=tmp_path)
    assert "--handler-url or --routes, not both" in one_line(both, 2)
