"""Every way a password can sit in a database URL stays out of what the CLI prints.

Passwords in the query string (``?password=``, ``?sslpassword=``), in the
userinfo, and a URL that cannot be parsed safely (an unencoded ``@``), through
``status``, ``migrate`` and ``run`` against a database that does not answer.
"""

from __future__ import annotations

import uuid

import pytest

from tests.acceptance.harness.database import closed_port
from tests.acceptance.harness.processes import run_cli, spawn, warning_lines
from tests.support.engine import wait_until


def secret() -> str:
    return f"pw{uuid.uuid4().hex[:12]}"


def urls(password: str) -> list[str]:
    port = closed_port()
    return [
        f"postgresql://app@127.0.0.1:{port}/jobs?password={password}",
        f"postgresql://app@127.0.0.1:{port}/jobs?sslmode=disable&sslpassword={password}",
        f"postgresql://app:{password}@127.0.0.1:{port}/jobs",
        f"mysql://app@127.0.0.1:{port}/jobs?password={password}",
    ]


def test_a_url_parameter_the_driver_refuses_is_one_line() -> None:
    done = run_cli("status", "--db-url", f"mysql://app@127.0.0.1:{closed_port()}/jobs?passwd=x")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "processor: error: unexpected TypeError: connect() got an unexpected keyword argument "
        "'passwd' (a database URL parameter the driver does not take? check the URL's query "
        "string)"]


@pytest.mark.parametrize("command", ["status", "migrate"])
def test_query_string_passwords_are_masked_in_cli_errors(command: str) -> None:
    password = secret()
    for url in urls(password):
        done = run_cli(command, "--db-url", url, timeout=60)
        assert done.returncode == 1, (url, done.stdout, done.stderr)
        text = done.stdout + done.stderr
        assert password not in text, text
        assert "Traceback" not in text
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "127.0.0.1" in done.stderr  # the host is still named


def test_an_unencoded_at_sign_in_a_password_is_refused_without_echoing_it() -> None:
    done = run_cli("status", "--db-url", "postgresql://app:pa@ss-part@127.0.0.1/jobs")
    assert done.returncode == 2
    assert "pa@ss-part" not in done.stderr and "ss-part" not in done.stderr
    assert "%40" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


async def test_run_logs_mask_query_string_passwords(tmp_path) -> None:
    password = secret()
    url = urls(password)[0]
    proc = await spawn("masked", ["run", "--handler-url", "http://127.0.0.1:9/",
                                  "--db-url", url, "--health-port", "0",
                                  "--log-level", "debug"], tmp_path)
    try:
        await wait_until(lambda: "action=database_wait" in proc.stderr(), timeout=30,
                         message="the database wait line")
    finally:
        assert await proc.terminate() == 0
    log = proc.stderr()
    assert warning_lines(log), log
    assert password not in log
    assert "password=***" in log
