"""The producer's verbs as real ``processor`` subprocesses: create (from a file and from
stdin, streamed through a spool), add, and wait (on partitions a real ``processor run``
completes or fails, that are cancelled, that stay open, that do not exist)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from processor import AsyncClient, PartitionInfo
from tests.acceptance.harness.processes import Processor, run_cli, spawn
from tests.support.engine import wait_until
from tests.support.forked_cli import run_processor
from tests.support.servers import answered_probe, read_body, send_json, serve_app
from watcher.errors import PartitionNotFoundError
from watcher.store.db.migrate import upgrade

FAST = ("--poll-interval", "0.1", "--lease-duration", "3", "--retry-backoff", "0.1")
ERROR = "processor: error: "
EXIT_STOPPED = 4
EXIT_TIMED_OUT = 5


@pytest.fixture
def where(db_url: str, table_prefix: str) -> tuple[str, str, str, str]:
    """``--db-url URL --table-prefix P`` of an empty, migrated namespace."""
    return ("--db-url", db_url, "--table-prefix", table_prefix)


def cli(*args: str, stdin: str | bytes | None = None, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    """``processor *args``, with ``stdin`` fed to it when given."""
    if stdin is None:
        return run_cli(*args, env=env)
    data = stdin.encode() if isinstance(stdin, str) else stdin
    done = run_processor(args, input=data, env={**os.environ, **(env or {})})
    return subprocess.CompletedProcess(done.args, done.returncode,
                                       done.stdout.decode(errors="replace"),
                                       done.stderr.decode(errors="replace"))


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    return done.stdout


def one_error_line(done: subprocess.CompletedProcess[str], code: int = 2) -> str:
    """The one ``processor: error:`` line the CLI printed when it failed with ``code``."""
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(ERROR), done.stderr
    return lines[0][len(ERROR):]


def ndjson(*entries: dict[str, Any]) -> str:
    return "".join(json.dumps(entry) + "\n" for entry in entries)


async def stored(where: tuple[str, ...], partition_id: str
                 ) -> tuple[PartitionInfo, dict[str, tuple[int, bytes]]]:
    """The partition and its items (id: (gate, data)) as the database holds them."""
    async with AsyncClient(where[1], where[3]) as client:
        info = await client.partition(partition_id)
        items = {item.id: (item.gate, item.data)
                 async for item in client.iter_items(partition_id)}
    return info, items


async def missing(where: tuple[str, ...], partition_id: str) -> bool:
    async with AsyncClient(where[1], where[3]) as client:
        try:
            await client.partition(partition_id)
        except PartitionNotFoundError:
            return True
    return False


# --------------------------------------------------------------------------- create


async def test_create_from_a_file_with_reduce_gates_and_policy(where, tmp_path) -> None:
    items = tmp_path / "items.ndjson"
    items.write_text(ndjson(
        {"id": "a", "data": {"name": "Ada"}},
        {"id": "b", "gate": 0, "data": [1, 2]},
        {"id": "raw", "data_b64": base64.b64encode(b"\x00\xffbytes").decode()},
        {"id": "late", "gate": 2, "data": "later"}) + "\n")  # a blank last line is skipped
    done = cli("create", "job", "--items", str(items), "--reduce-gates", "1,2",
               "--on-item-failure", "continue", "--json", *where)
    assert json.loads(ok(done)) == {"id": "job", "items": 4, "first_gate": 0,
                                    "reduce_gates": [1, 2], "on_item_failure": "continue",
                                    "key": None, "priority": 0, "quorum": None, "notify": None,
                                    "start_at": None, "pipeline": "default",
                                    "pipeline_version": None}
    info, stored_items = await stored(where, "job")
    assert (info.status, info.gate, info.counts) == ("available", 0, {"available": 4})
    assert (info.reduce_gates, info.on_item_failure) == ((1, 2), "continue")
    assert stored_items == {"a": (0, b'{"name":"Ada"}'), "b": (0, b"[1,2]"),
                            "raw": (0, b"\x00\xffbytes"), "late": (2, b'"later"')}

    text = ok(cli("create", "second", "--items", str(items), *where))
    assert text == "created partition 'second' with 4 items\n"
    info, _ = await stored(where, "second")
    assert (info.reduce_gates, info.on_item_failure) == ((), "fail")


async def test_create_from_stdin_with_options_from_the_environment(where) -> None:
    lines = ndjson({"id": "x", "gate": 3, "data": 1}, {"id": "y", "gate": 5, "data": 2})
    env = {"PROCESSOR_ITEMS": "-", "PROCESSOR_REDUCE_GATES": "5",
           "PROCESSOR_ON_ITEM_FAILURE": "continue"}
    text = ok(cli("create", "piped", *where, stdin=lines, env=env))
    assert text == ("created partition 'piped' with 2 items, starting at gate 3; reduce gates "
                    "5; a failed item does not stop it (on-item-failure: continue)\n")
    info, stored_items = await stored(where, "piped")
    assert (info.gate, info.reduce_gates, info.on_item_failure) == (3, (5,), "continue")
    assert stored_items == {"x": (3, b"1"), "y": (5, b"2")}

    text = ok(cli("create", "empty", "--json", *where))  # no --items: an empty partition
    assert json.loads(text)["items"] == 0
    info, stored_items = await stored(where, "empty")
    assert (info.status, info.counts, stored_items) == ("available", {}, {})


GOOD = ndjson(*({"id": f"i{n}", "data": n} for n in range(3)))


@pytest.fixture
def sqlite_where(tmp_path: Path) -> tuple[str, str, str, str]:
    """A migrated SQLite file, for the checks that refuse a file before any database
    write (the tests parametrized by database show that nothing is written on each)."""
    url = f"sqlite:///{tmp_path / 'lines.db'}"
    upgrade(url, "")
    return ("--db-url", url, "--table-prefix", "")


@pytest.mark.parametrize(("bad_line", "options", "expected"), [
    ("not json", (), "line 4 is not valid JSON"),
    ('{"id": "z"}', (), "line 4: a new item needs its content: set 'data'"),
    ('{"id": "z", "gate": -1, "data": 1}', (), "line 4: 'gate' must be an integer"),
    ('{"id": "", "data": 1}', (), "line 4: item id must be a non-empty string"),
    ('{"id": "z", "data": "' + "x" * 40 + '"}', ("--max-item-bytes", "16"),
     "line 4: item 'z' of partition 'job' is 42 bytes; the limit is 16 bytes"),
])
async def test_a_bad_line_names_the_file_and_line_and_writes_nothing(
        sqlite_where, tmp_path, bad_line, options, expected) -> None:
    items = tmp_path / "items.ndjson"
    items.write_text(GOOD + bad_line + "\n" + ndjson({"id": "after", "data": 0}))
    line = one_error_line(cli("create", "job", "--items", str(items), *options,
                              *sqlite_where))
    assert line.startswith(f"{items} {expected}"), line
    assert await missing(sqlite_where, "job")


async def test_bad_lines_repeated_ids_and_unreadable_files_write_nothing(
        where, tmp_path) -> None:
    line = one_error_line(cli("create", "job", "--items", "-", *where,
                              stdin=GOOD + '{"id": "z", "data": 1, "extra": 2}\n'))
    assert line == ("stdin line 4: unknown key \"extra\"; a new item has 'id', 'gate', "
                    "'not_before', and 'data' or 'data_b64'")
    line = one_error_line(cli("create", "job", "--items", "-", *where,
                              stdin=GOOD + ndjson({"id": "i1", "data": 9})))
    assert line == ("item ids 'i1' appear more than once for partition 'job'; item ids must "
                    "be unique within a partition")
    line = one_error_line(cli("create", "job", "--items", str(tmp_path / "nope.ndjson"),
                              *where))
    assert line == f"cannot read --items {tmp_path / 'nope.ndjson'}: No such file or directory"
    assert await missing(where, "job")


async def test_bad_options_are_refused(sqlite_where) -> None:
    for gates in ("1,x", "1_0", "+1", "1,,2"):
        line = one_error_line(cli("create", "job", "--reduce-gates", gates, *sqlite_where))
        assert line == ("--reduce-gates must be gates separated by commas, such as 1,3; got "
                        f"{gates!r}")
    line = one_error_line(cli("create", "job", "--reduce-gates", "1, 1", *sqlite_where))
    assert line == "reduce gates [1] of partition 'job' are given twice; name each gate once"
    line = one_error_line(cli("create", "job", "--on-item-failure", "skip", *sqlite_where))
    assert line == "--on-item-failure must be one of fail, continue, got 'skip'"
    line = one_error_line(cli("add", "job", "--items", "-", "--max-item-bytes", "0",
                              *sqlite_where))
    assert line == "--max-item-bytes must be a positive number of bytes, got 0"
    assert await missing(sqlite_where, "job")


async def test_an_existing_partition_is_refused(where) -> None:
    ok(cli("create", "job", "--items", "-", *where, stdin=GOOD))
    line = one_error_line(cli("create", "job", "--items", "-", *where,
                              stdin=ndjson({"id": "new", "data": 1})))
    assert line == ("partition 'job' already exists; nothing was written: add items to it "
                    "with `processor add job --items FILE`, or delete it first "
                    "(`processor delete`)")
    _, stored_items = await stored(where, "job")
    assert sorted(stored_items) == ["i0", "i1", "i2"]


async def test_create_streams_a_20000_line_file(where, tmp_path) -> None:
    # 20,000 items of ~300 bytes: more than the spool keeps in memory (4 MiB), so the
    # items go through its temporary file, and one transaction inserts them all.
    items = tmp_path / "big.ndjson"
    with items.open("w") as out:
        for n in range(20_000):
            out.write(json.dumps({"id": f"item-{n:05}", "gate": n % 3,
                                  "data": {"n": n, "text": "z" * 280}}) + "\n")
    assert items.stat().st_size > 4 * 1024 * 1024
    done = cli("create", "big", "--items", str(items), "--json", *where)
    assert json.loads(ok(done)) == {"id": "big", "items": 20_000, "first_gate": 0,
                                    "reduce_gates": [], "on_item_failure": "fail",
                                    "key": None, "priority": 0, "quorum": None, "notify": None,
                                    "start_at": None, "pipeline": "default",
                                    "pipeline_version": None}
    async with AsyncClient(where[1], where[3]) as client:
        counts = await client.gate_counts(["big"])
        last = await client.items("big", after="item-19998")
    assert counts == {"big": {0: {"available": 6667}, 1: {"available": 6667},
                              2: {"available": 6666}}}
    assert [(item.id, item.gate) for item in last] == [("item-19999", 1)]
    assert json.loads(last[0].data) == {"n": 19_999, "text": "z" * 280}


# --------------------------------------------------------------------------- add


async def test_add_items_and_its_refusals(where, tmp_path) -> None:
    ok(cli("create", "job", "--items", "-", *where, stdin=GOOD))
    more = tmp_path / "more.ndjson"
    more.write_text(ndjson({"id": "m1", "gate": 1, "data": "one"},
                           {"id": "m2", "gate": 3, "data": "two"}))
    text = ok(cli("add", "job", "--items", str(more), *where))
    assert text == "added 2 items at gates 1 to 3 to partition 'job'\n"
    done = cli("add", "job", "--items", "-", "--json", *where,
               stdin=ndjson({"id": "m3", "data": 3}))
    assert json.loads(ok(done)) == {"id": "job", "added": 1, "reopened": False}
    _, stored_items = await stored(where, "job")
    assert {key: stored_items[key] for key in ("m1", "m2", "m3")} == {
        "m1": (1, b'"one"'), "m2": (3, b'"two"'), "m3": (0, b"3")}

    # An id stored already, a bad line, a partition that is not there: nothing written.
    line = one_error_line(cli("add", "job", "--items", "-", *where,
                              stdin=ndjson({"id": "fresh", "data": 1}, {"id": "m1", "data": 1})))
    assert line == ("item ids 'm1' already exist in partition 'job'; item ids must be unique "
                    "within a partition")
    line = one_error_line(cli("add", "job", "--items", "-", *where,
                              stdin=ndjson({"id": "fresh", "data": 1}) + "{oops\n"))
    assert line.startswith("stdin line 2 is not valid JSON"), line
    line = one_error_line(cli("add", "nope", "--items", str(more), *where))
    assert line == ("partition 'nope' does not exist; nothing was written: create it with "
                    "`processor create nope --items FILE`")
    line = one_error_line(cli("add", "job", "--items", "-", *where, stdin=""))
    assert line == "no items given for partition 'job'"
    _, after = await stored(where, "job")
    assert after == stored_items


async def test_add_below_the_partitions_gate_is_a_gate_error(where) -> None:
    ok(cli("create", "later", "--items", "-", *where,
           stdin=ndjson({"id": "a", "gate": 2, "data": 1})))
    line = one_error_line(cli("add", "later", "--items", "-", *where,
                              stdin=ndjson({"id": "ok", "gate": 2, "data": 1},
                                           {"id": "early", "gate": 1, "data": 1})))
    assert line == ("item 'early' has gate 1 but partition 'later' is already at gate 2; add "
                    "items at gate 2 or later")
    _, stored_items = await stored(where, "later")
    assert sorted(stored_items) == ["a"]


# --------------------------------------------------------------------------- wait


@dataclass
class Handler:
    """Gate 0 items move to gate 1, gate 1 items complete; items named in ``failing``
    fail for good (422, no retry). Calls wait for ``hold`` when it is set."""

    failing: set[str] = field(default_factory=set)
    hold: asyncio.Event | None = None
    calls: list[str] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await answered_probe(scope, send):
            return
        await read_body(receive)
        headers = dict(scope["headers"])
        item = unquote(headers.get(b"x-item-id", b"").decode())
        self.calls.append(item)
        if self.hold is not None:
            await self.hold.wait()
        if item in self.failing:
            await send_json(send, 422, {"error": {"message": "unreadable scan",
                                                  "no_retry": True}})
        elif headers.get(b"x-gate") == b"0":
            await send_json(send, 200, {"gate": 1, "data": {"item": item}})
        else:
            await send_json(send, 200, {"done": True})


@contextlib.asynccontextmanager
async def processor_run(directory: Path, where: tuple[str, ...], handler_url: str
                        ) -> AsyncIterator[Processor]:
    """A real ``processor run`` for the block; SIGTERMed at its end, and it must exit 0."""
    proc = await spawn("runner", ["run", "--owner-id", "runner", "--health-port", "0",
                                  "--handler-url", handler_url, *where, *FAST], directory)
    try:
        yield proc
    finally:
        code = await proc.terminate()
    assert code == 0, proc.stderr()


async def started_wait(directory: Path, name: str, *args: str) -> Processor:
    """``processor wait *args`` in the background (its output in ``directory``)."""
    return await spawn(name, ["wait", *args], directory)


async def test_wait_returns_when_a_processor_completes_the_partition(where, tmp_path
                                                                     ) -> None:
    ok(cli("create", "job", "--items", "-", *where, stdin=GOOD))
    handler = Handler(hold=asyncio.Event())
    waiting = await started_wait(tmp_path, "waiter", "job", "--timeout", "60", *where)
    async with serve_app(handler) as base_url, processor_run(tmp_path, where, base_url):
        await wait_until(lambda: len(handler.calls) == 3, timeout=20,
                         message="the three gate-0 calls in flight")
        # The partition is open while the calls are held: the wait cannot have ended.
        assert waiting.running, waiting.output()
        handler.hold.set()
        assert await waiting.wait(30) == 0, waiting.output()
    assert waiting.stdout_path.read_text() == (
        "partition 'job' is complete at gate 1 (items: 3 complete)\n")
    assert waiting.stderr() == ""

    row = json.loads(ok(cli("wait", "job", "--json", *where)))
    assert (row["id"], row["status"], row["gate"], row["counts"]) == (
        "job", "complete", 1, {"complete": 3})
    # Adding to a complete partition re-opens it.
    done = cli("add", "job", "--items", "-", "--json", *where,
               stdin=ndjson({"id": "extra", "gate": 1, "data": 1}))
    assert json.loads(ok(done)) == {"id": "job", "added": 1, "reopened": True}
    text = ok(cli("add", "job", "--items", "-", *where,
                  stdin=ndjson({"id": "extra2", "gate": 1, "data": 1})))
    assert text == "added 1 item at gate 1 to partition 'job'\n"
    info, _ = await stored(where, "job")
    assert (info.status, info.counts) == ("available", {"available": 2, "complete": 3})


async def test_wait_exits_4_when_the_partition_fails(where, tmp_path) -> None:
    ok(cli("create", "job", "--items", "-", *where, stdin=GOOD))
    handler = Handler(failing={"i1"})
    waiting = await started_wait(tmp_path, "waiter", "job", "--timeout", "60", *where)
    async with serve_app(handler) as base_url, processor_run(tmp_path, where, base_url):
        assert await waiting.wait(30) == EXIT_STOPPED, waiting.output()
    line = waiting.stdout_path.read_text()
    assert line.startswith("partition 'job' failed at gate 0 (items: "), line
    assert "1 failed" in line and "`processor retry` runs them again" in line
    assert waiting.stderr() == ""


async def test_wait_exits_4_when_the_partition_is_cancelled(where, tmp_path) -> None:
    ok(cli("create", "job", "--items", "-", *where, stdin=GOOD))
    waiting = await started_wait(tmp_path, "waiter", "job", "--json", *where)
    ok(cli("cancel", "job", *where))
    assert await waiting.wait(30) == EXIT_STOPPED, waiting.output()
    row = json.loads(waiting.stdout_path.read_text())
    assert (row["status"], row["counts"]) == ("cancelled", {"available": 3})
    text = cli("wait", "job", *where)
    assert text.returncode == EXIT_STOPPED and text.stdout == (
        "partition 'job' was cancelled at gate 0 (items: 3 available); `processor retry` "
        "resumes it\n")


async def test_wait_times_out_with_exit_5(where) -> None:
    ok(cli("create", "job", "--items", "-", *where, stdin=GOOD))
    done = cli("wait", "job", "--timeout", "0.5", *where)
    line = one_error_line(done, EXIT_TIMED_OUT)
    assert line.startswith("partition 'job' is still available at gate 0 after 0.5 s"), line
    assert done.stdout == ""
    # With --json the partition is printed all the same; the timeout from the environment.
    done = cli("wait", "job", "--json", *where, env={"PROCESSOR_WAIT_TIMEOUT": "0"})
    assert done.returncode == EXIT_TIMED_OUT, done.stderr
    assert json.loads(done.stdout)["status"] == "available"
    assert one_error_line(cli("wait", "job", "--timeout", "-1", *where)) == (
        "--timeout must be a number of seconds from 0, got -1.0")


async def test_wait_on_a_missing_partition(where) -> None:
    line = one_error_line(cli("wait", "nope", *where))
    assert line == ("partition 'nope' does not exist; create it with `processor create nope "
                    "--items FILE`, or list the partitions with `processor status`")


def test_help_of_the_new_verbs_loads_no_database_library() -> None:
    for verb in ("create", "add", "wait"):
        done = subprocess.run([sys.executable, "-c", (
            "import sys\n"
            f"sys.argv = ['processor', {verb!r}, '--help']\n"
            "from processor.cli import main\n"
            "try:\n"
            "    main()\n"
            "except SystemExit as exit:\n"
            "    assert exit.code in (0, None), exit.code\n"
            "heavy = [m for m in ('sqlalchemy', 'starlette', 'httpx') if m in sys.modules]\n"
            "assert not heavy, heavy\n")], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "--items" in done.stdout or "--timeout" in done.stdout


@pytest.mark.parametrize("verb", [["create", "p", "--items", "-"], ["add", "p", "--items", "-"],
                                  ["wait", "p"]], ids=lambda verb: verb[0])
def test_a_database_never_migrated_is_refused_before_reading(tmp_path, verb) -> None:
    typo = tmp_path / "procesor.db"
    # stdin holds a bad line: the database is checked first, so it is never read.
    done = cli(*verb, "--db-url", f"sqlite:///{typo}", stdin="not json\n")
    line = one_error_line(done, 1)
    assert "no statefeed tables" in line and line.endswith("run `processor migrate` first")
    assert not typo.exists()


async def test_create_takes_quorums_and_refuses_bad_ones_in_one_line(where, tmp_path) -> None:
    items = tmp_path / "items.ndjson"
    items.write_text(ndjson({"id": "a", "data": 1}, {"id": "b", "data": 2}))
    done = cli("create", "job", "--items", str(items), "--quorum", "0=1", "--quorum", "2=3",
               "--json", *where)
    assert json.loads(ok(done))["quorum"] == {"0": 1, "2": 3}
    said = ok(cli("create", "other", "--quorum", "1=2", *where))
    assert "gate 1 passes on the first 2 items" in said
    for bad in ("1=0", "x=2", "1", "1=2=3", "-1=2"):
        line = one_error_line(cli("create", "bad", "--quorum", bad, *where))
        assert "quorum" in line, line
    line = one_error_line(cli("create", "bad", "--quorum", "1=2", "--quorum", "1=3", *where))
    assert "twice" in line
    async with AsyncClient(where[1], where[3]) as client:
        assert {info.id for info in await client.partitions()} == {"job", "other"}
