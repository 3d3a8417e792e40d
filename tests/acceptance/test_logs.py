"""What an operator reads in the log of a real ``processor run``, in both formats.

A real uvicorn handler (the SDK) on loopback and a real database. One run goes
through: an item the handler refuses for good (one WARNING naming partition,
item, gate, attempts and error) and the partition it fails (one ERROR with the
reason); a reduce the handler refuses (one ERROR with the reduce's error); then a
handler outage: the handler's server stops and starts again on the same port, and
the log holds one WARNING when the outage starts and one when it ends, never a
line per failed call, while /readyz turns 503 (the handler's default health URL,
``<handler-url>/healthz``) and back to 200.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import handlers
from processor import AsyncClient, NewItem
from tests.acceptance.harness.processes import Processor, run_cli, spawn
from tests.conftest import POSTGRES_URL, require_postgres
from tests.support.engine import wait_until
from tests.support.servers import free_port, serve_app
from watcher.store.db.migrate import downgrade

SECRET = "s3cret-handler-token"
# time, level, logger, then the message: the text format (processor/observe/logs.py).
TEXT_LINE = re.compile(r"^\S+ \S+ (?P<level>[A-Z]+) (?P<logger>\S+) (?P<message>.*)$")


@dataclass(frozen=True)
class Line:
    """One log line, read the same way from either format."""

    level: str
    fields: dict[str, Any]
    raw: str


def read_lines(log: str, log_format: str) -> list[Line]:
    """Every line of ``log``; in the JSON format each must be one JSON object.

    Raises:
        AssertionError: a JSON-format line is not a JSON object with the base keys.
    """
    lines = []
    for raw in log.splitlines():
        if log_format == "json":
            record = json.loads(raw)
            assert isinstance(record, dict), raw
            assert {"time", "level", "logger", "message"} <= record.keys(), raw
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["time"]), raw
            lines.append(Line(record["level"], record, raw))
            continue
        match = TEXT_LINE.match(raw)
        if match is None:
            continue  # a traceback's continuation, say: no line this test looks for
        # The text form: key=value words, the error last (everything after "error=").
        message, _, error = match["message"].partition(" error=")
        fields: dict[str, Any] = dict(part.split("=", 1) for part in message.split()
                                      if "=" in part)
        if error:
            fields["error"] = error
        lines.append(Line(match["level"], fields, raw))
    return lines


def actions(lines: list[Line], action: str) -> list[Line]:
    return [line for line in lines if line.fields.get("action") == action]


def step(item: handlers.Item) -> handlers.Result:
    if item.id == "bad":
        raise handlers.Fail("the resume has no text")
    if item.partition_id.startswith("reduce"):
        return handlers.Result(gate=1)
    return handlers.Result(done=True)


def rank(page: handlers.ReducePage) -> handlers.Reduced:
    raise handlers.Fail("the ranking needs two resumes at least")


HANDLER = handlers.app(step, reduce=rank)


@pytest.fixture(params=[
    ("text", "sqlite"),
    ("json", "sqlite"),
    pytest.param(("json", "postgres"), marks=pytest.mark.postgres),
], ids=lambda param: "-".join(param))
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """(log format, database URL, table prefix), the prefix migrated and dropped after."""
    log_format, database = request.param
    if database == "postgres":
        require_postgres()
        db_url = POSTGRES_URL
    else:
        db_url = f"sqlite:///{tmp_path / 'logs.db'}"
    prefix = f"logs{uuid.uuid4().hex[:8]}_"
    done = run_cli("migrate", "--db-url", db_url, "--table-prefix", prefix)
    assert done.returncode == 0, done.stderr
    yield log_format, db_url, prefix
    downgrade(db_url, prefix)


async def _readiness(proc: Processor) -> int | None:
    """The status /readyz answers, or ``None`` while nothing answers on the port."""
    answer = await proc.answer("/readyz")
    return None if answer is None else answer.status_code


async def _answers(proc: Processor, status: int) -> bool:
    return await _readiness(proc) == status


async def test_failures_and_a_handler_outage_are_one_line_each(setup, tmp_path) -> None:
    log_format, db_url, prefix = setup
    port, health_port = free_port(), free_port()
    handler_url = f"http://127.0.0.1:{port}/?token={SECRET}"
    async with AsyncClient(db_url, prefix) as client:
        async with serve_app(HANDLER, port=port):
            proc = await spawn("logs", [
                "run", "--owner-id", "logs", "--handler-url", handler_url, "--db-url", db_url,
                "--table-prefix", prefix, "--health-host", "127.0.0.1",
                "--health-port", str(health_port), "--poll-interval", "0.1",
                "--lease-duration", "3", "--retry-backoff", "0.2", "--max-retries", "50",
                "--log-format", log_format], tmp_path, health_port=health_port)
            try:
                await client.create_partition("items", [NewItem("ok", b"{}"),
                                                        NewItem("bad", b"{}")])
                await client.create_partition("reduce", [NewItem("r1", b"{}")],
                                              reduce_gates=[1])
                assert (await client.wait("items", timeout=30)).status == "failed"
                assert (await client.wait("reduce", timeout=30)).status == "failed"
                await wait_until(lambda: _answers(proc, 200), timeout=20,
                                 message="/readyz to answer 200")
            except BaseException:
                await proc.terminate()
                raise
        # The handler is gone: its port refuses every call.
        try:
            await client.create_partition("outage", [NewItem(f"o{n}", b"{}") for n in range(3)])
            await proc.wait_log("handler_outage_started", timeout=30)
            assert await _readiness(proc) == 503
            async with serve_app(HANDLER, port=port):  # back, on the same port
                await proc.wait_log("handler_outage_ended", timeout=30)
                assert (await client.wait("outage", timeout=30)).status == "complete"
                await wait_until(lambda: _answers(proc, 200), timeout=20,
                                 message="/readyz to answer 200 again")
        finally:
            assert await proc.terminate() == 0, proc.stderr()[-3000:]
    log = proc.stderr()
    assert SECRET not in log
    assert "Traceback" not in log
    lines = read_lines(log, log_format)

    [failed_item] = actions(lines, "item_failed")
    assert failed_item.level == "WARNING"
    fields = failed_item.fields
    assert (fields["partition"], fields["item"]) == ("items", "bad")
    assert (str(fields["gate"]), str(fields["attempts"])) == ("0", "1")
    assert "the resume has no text" in fields["error"]

    closed = {line.fields["partition"]: line for line in actions(lines, "partition_closed")}
    assert closed["items"].level == "ERROR" and closed["reduce"].level == "ERROR"
    assert closed["items"].fields["reason"] == "item"
    assert (closed["items"].fields["item"], str(closed["items"].fields["failed_items"])) == (
        "bad", "1")
    assert "the resume has no text" in closed["items"].fields["error"]
    assert (closed["reduce"].fields["reason"], str(closed["reduce"].fields["gate"])) == (
        "reduce", "1")
    assert "the ranking needs two resumes at least" in closed["reduce"].fields["error"]
    assert closed["outage"].level == "INFO" and closed["outage"].fields["status"] == "complete"

    [started] = actions(lines, "handler_outage_started")
    [ended] = actions(lines, "handler_outage_ended")
    assert started.level == ended.level == "WARNING"
    assert started.fields["url"] == ended.fields["url"] == f"http://127.0.0.1:{port}/?token=***"
    assert int(started.fields["failed_calls"]) >= 3 and float(started.fields["seconds"]) >= 2
    assert str(port) in started.fields["error"]
    assert int(ended.fields["failed_calls"]) >= int(started.fields["failed_calls"])
    assert float(ended.fields["seconds"]) >= float(started.fields["seconds"])
    # The engine held the calls while the handler was out: one line each way.
    [held] = actions(lines, "handler_hold_started")
    [resumed] = actions(lines, "handler_hold_ended")
    assert held.level == resumed.level == "WARNING"
    # No line per failed call: the outage's calls are counted, not logged (above DEBUG).
    assert len([line for line in lines if line.level in ("WARNING", "ERROR")]) == 7, log
    if log_format == "json":  # the fields are typed in JSON
        assert isinstance(started.fields["failed_calls"], int)
        assert isinstance(failed_item.fields["attempts"], int)


FORGED = "2026-01-01 00:00:00,000 ERROR forged.logger action=forged"


def forging_step(item: handlers.Item) -> handlers.Result:
    raise handlers.Fail(f"boom\r\n{FORGED}\x1b]0;owned\x07\x1b[2J\x9b")


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
async def test_data_cannot_forge_a_text_log_line(db_url: str, table_prefix: str,
                                                 tmp_path: Path) -> None:
    """Newlines, carriage returns and escape sequences in a partition id, an item id and
    a handler's error reach the text log escaped: every line is a record (or a
    traceback's indented line), and no raw control byte is written."""
    assert run_cli("migrate", "--db-url", db_url, "--table-prefix", table_prefix
                   ).returncode == 0
    partition, item = f"p\n{FORGED}\x1b[31m", f"i\r\n{FORGED}"
    port, health_port = free_port(), free_port()
    async with AsyncClient(db_url, table_prefix) as client, \
            serve_app(handlers.app(forging_step), port=port):
        proc = await spawn("forge", [
            "run", "--owner-id", "forge", "--handler-url", f"http://127.0.0.1:{port}/",
            "--db-url", db_url, "--table-prefix", table_prefix, "--health-host",
            "127.0.0.1", "--health-port", str(health_port), "--poll-interval", "0.1",
            "--log-format", "text"], tmp_path, health_port=health_port)
        try:
            await client.create_partition(partition, [NewItem(item, b"{}")])
            assert (await client.wait(partition, timeout=30)).status == "failed"
            await proc.wait_log("partition_closed", timeout=30)
        finally:
            assert await proc.terminate() == 0, proc.stderr()[-3000:]
    log = proc.stderr()
    raw = [char for char in log if (ord(char) < 0x20 and char != "\n")
           or 0x7f <= ord(char) <= 0x9f]
    assert not raw, sorted(set(map(hex, map(ord, raw))))
    for line in log.splitlines():
        match = TEXT_LINE.match(line)
        assert match is not None or line.startswith("    | "), line
        if match is not None:
            assert match["logger"] != "forged.logger", line
    [failed] = [line for line in log.splitlines() if "action=item_failed" in line]
    assert "\\n2026-01-01 00:00:00,000 ERROR forged.logger" in failed
    assert "\\r\\n" in failed and "\\x1b]0;owned\\x07" in failed
