"""``processor --version``, ``status --status`` and ``--watch``, ids that stay whole at
80 columns, and ``--log-format`` checked on every verb that logs: the CLI as
subprocesses on a real SQLite database."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator
from importlib.metadata import version
from pathlib import Path

import pytest

from processor import AsyncClient, NewItem
from tests.acceptance.harness.processes import PROCESSOR, START_DEADLINE, run_cli
from tests.support.engine import wait_until

# Two ids that differ only in their last character: an ellipsis would make them one.
TWIN_PARTITIONS = ("p" * 59 + "1", "p" * 59 + "2")
TWIN_ITEMS = ("i" * 59 + "1", "i" * 59 + "2")
NARROW = {"COLUMNS": "80", "LINES": "40"}


@pytest.fixture
async def database(tmp_path: Path) -> AsyncIterator[str]:
    """A migrated SQLite file with the twin partitions (each with the twin items) and
    one cancelled partition."""
    url = f"sqlite:///{tmp_path / 'status.db'}"
    done = run_cli("migrate", "--db-url", url)
    assert done.returncode == 0, done.stderr
    async with AsyncClient(url) as client:
        for partition_id in TWIN_PARTITIONS:
            await client.create_partition(partition_id, [NewItem(item, b"{}")
                                                         for item in TWIN_ITEMS])
        await client.create_partition("stopped", [NewItem("a", b"{}")])
        assert await client.cancel("stopped")
    yield url


def first_column(table: str) -> list[str]:
    """The first cell of each row of a table Rich printed, its folded lines joined again.

    A row starts on the line whose second cell (the status) is not blank: only the
    first line of a row fills it.
    """
    cells: list[str] = []
    for line in table.splitlines():
        parts = line.split("│")
        if len(parts) < 3:
            continue
        if parts[2].strip():
            cells.append("")
        cells[-1] += parts[1].strip()
    return cells


def test_version_prints_the_package_version() -> None:
    done = run_cli("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"processor (statefeed) {version('statefeed')}\n"


async def test_status_filters_by_status(database: str) -> None:
    done = run_cli("status", "--db-url", database, "--status", "cancelled", "--json")
    assert done.returncode == 0, done.stderr
    assert [row["id"] for row in json.loads(done.stdout)] == ["stopped"]
    table = run_cli("status", "--db-url", database, "--status", "available", env=NARROW)
    assert table.returncode == 0, table.stderr
    assert "stopped" not in table.stdout and "(available)" in table.stdout
    empty = run_cli("status", "--db-url", database, "--status", "failed")
    assert empty.returncode == 0 and empty.stdout.rstrip().endswith("no failed partitions")
    wrong = run_cli("status", "--db-url", database, "--status", "done")
    assert wrong.returncode == 2
    assert wrong.stderr.startswith("processor: error: ") and "available, complete" in wrong.stderr
    assert len(wrong.stderr.splitlines()) == 1


@pytest.mark.parametrize("verb", ["status", "items"])
async def test_long_ids_fold_at_80_columns_and_stay_apart(database: str, verb: str) -> None:
    args = ["items", TWIN_PARTITIONS[0]] if verb == "items" else ["status"]
    done = run_cli(*args, "--db-url", database, env=NARROW)
    assert done.returncode == 0, done.stderr
    # The table fits (a title may run on: the terminal wraps it, whole).
    table = [line for line in done.stdout.splitlines() if line[:1] in "┏┃┡│└"]
    assert table and max(len(line) for line in table) <= 80, done.stdout
    assert "…" not in done.stdout and "..." not in done.stdout, done.stdout
    twins = TWIN_ITEMS if verb == "items" else TWIN_PARTITIONS
    assert set(twins) <= set(first_column(done.stdout)), done.stdout  # each whole, apart
    if verb == "status":  # readable pieces, not 3-character ones
        pieces = [line.split("│")[1].strip() for line in done.stdout.splitlines()
                  if line.startswith("│") and line.split("│")[1].strip().startswith("pp")]
        assert pieces and min(len(piece) for piece in pieces[:-1]) >= 16, done.stdout


async def test_status_shows_a_fleet_pause(database: str) -> None:
    assert run_cli("pause", "--all", "--db-url", database).returncode == 0
    paused = run_cli("status", "--db-url", database, env=NARROW)
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout.startswith("everything is paused since "), paused.stdout
    assert "processor resume --all" in paused.stdout
    assert run_cli("resume", "--all", "--db-url", database).returncode == 0
    assert "paused" not in run_cli("status", "--db-url", database, env=NARROW).stdout


def header_of(table: str) -> list[str]:
    """The column names of a table Rich printed (its header on one line)."""
    header = next(line for line in table.splitlines() if line.startswith("┃"))
    return [cell.strip() for cell in header.split("┃")[1:-1]]


def rows_by_id(table: str) -> dict[str, list[str]]:
    """The cells of each row of a table Rich printed (each on one line), by its first."""
    rows = [[cell.strip() for cell in line.split("│")[1:-1]]
            for line in table.splitlines() if line.startswith("│")]
    return {row[0]: row for row in rows}


async def test_status_shows_each_partitions_pipeline_and_version(tmp_path: Path) -> None:
    """A ``pipeline`` column, ``name@version`` or the name alone while no version is
    pinned, once some partition is outside the default pipeline (or pinned); ``--json``
    names both on every row."""
    url = f"sqlite:///{tmp_path / 'pipelines.db'}"
    assert run_cli("migrate", "--db-url", url).returncode == 0
    async with AsyncClient(url) as client:
        await client.create_partition("plain", [NewItem("a", b"{}")])
        only_default = run_cli("status", "--db-url", url, env={"COLUMNS": "200"})
        assert only_default.returncode == 0, only_default.stderr
        assert "pipeline" not in header_of(only_default.stdout), only_default.stdout
        await client.create_partition("inv", [NewItem("a", b"{}")], pipeline="invoices",
                                      pipeline_version="v2")
        await client.create_partition("res", [NewItem("a", b"{}")], pipeline="resumes")
    done = run_cli("status", "--db-url", url, env={"COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    rows = rows_by_id(done.stdout)
    assert header_of(done.stdout)[-1] == "pipeline", done.stdout
    assert {pid: row[-1] for pid, row in rows.items()} == {
        "plain": "default", "inv": "invoices@v2", "res": "resumes"}, done.stdout
    listed = run_cli("status", "--db-url", url, "--json")
    assert listed.returncode == 0, listed.stderr
    assert {row["id"]: (row["pipeline"], row["pipeline_version"])
            for row in json.loads(listed.stdout)} == {
        "plain": ("default", None), "inv": ("invoices", "v2"), "res": ("resumes", None)}


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "terminal"])
async def test_watch_redraws_until_ctrl_c(database: str, tmp_path: Path,
                                          terminal: bool) -> None:
    # A terminal is drawn in place (rich's Live); a pipe gets each view after the last.
    out, err = tmp_path / "watch.out", tmp_path / "watch.err"
    env = {**NARROW, **({"TTY_COMPATIBLE": "1"} if terminal else {"TTY_COMPATIBLE": "0"})}
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            PROCESSOR, "status", "--db-url", database, "--watch", "--interval", "0.2",
            stdout=stdout, stderr=stderr, stdin=asyncio.subprocess.DEVNULL,
            env={**_environ(), **env})
    try:
        await wait_until(lambda: out.read_text(errors="replace").count("read at") >= 2,
                         timeout=30, message="two views of the table")
        process.send_signal(signal.SIGINT)
        async with asyncio.timeout(20):
            code = await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert code == 0, err.read_text()
    assert err.read_text() == ""
    shown = out.read_text()
    assert "every 0.2 s; Ctrl-C stops" in shown
    assert ("\x1b[" in shown) is terminal  # cursor moves only on a terminal
    if not terminal:
        assert set(TWIN_PARTITIONS) <= set(first_column(shown.split("read at")[0]))


async def test_ctrl_c_between_back_to_back_reads_stops_cleanly(database: str,
                                                               tmp_path: Path) -> None:
    # Redrawn every 10 ms, the watch is nearly always reading when Ctrl-C comes: the
    # read must end and the client close, not be abandoned (which left a SQLite
    # connection's thread waiting for ever, or a pending task reported at exit).
    for attempt in range(2):
        out, err = tmp_path / f"fast{attempt}.out", tmp_path / f"fast{attempt}.err"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            process = await asyncio.create_subprocess_exec(
                PROCESSOR, "status", "--db-url", database, "--watch", "--interval", "0.01",
                stdout=stdout, stderr=stderr, stdin=asyncio.subprocess.DEVNULL,
                env={**_environ(), **NARROW, "TTY_COMPATIBLE": "0"})
        try:
            await wait_until(lambda out=out: out.read_text(errors="replace").count(
                "read at") >= 3, timeout=60, message="three views of the table")
            process.send_signal(signal.SIGINT)
            async with asyncio.timeout(20):
                code = await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        assert code == 0, err.read_text()
        assert err.read_text() == ""


def _environ() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name != "TTY_COMPATIBLE"}


def test_watch_draws_a_table_not_json(tmp_path: Path) -> None:
    done = run_cli("status", "--db-url", f"sqlite:///{tmp_path / 'x.db'}", "--watch", "--json")
    assert done.returncode == 2 and "--watch" in done.stderr
    assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize("verb", [
    ["run", "--handler-url", "http://127.0.0.1:9/", "--health-port", "0"],
    ["console", "--port", "0"],
    ["api", "--port", "0"],
])
def test_a_bad_log_format_is_one_line(verb: list[str], tmp_path: Path) -> None:
    for args, env in (([*verb, "--log-format", "yaml"], {}),
                      (verb, {"PROCESSOR_LOG_FORMAT": "yaml"})):
        done = run_cli(*args, "--db-url", f"sqlite:///{tmp_path / 'x.db'}", env=env)
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert done.stderr == ("processor: error: --log-format must be one of text, json, "
                               "got 'yaml'\n")


@pytest.mark.parametrize("verb", ["console", "api"])
async def test_the_servers_log_json_lines(database: str, tmp_path: Path, verb: str) -> None:
    """``console`` and ``api`` with ``--log-format json`` (from the environment): every
    line on stderr is a JSON object, their start and stop lines with their fields."""
    err = tmp_path / f"{verb}.err"
    with err.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            PROCESSOR, verb, "--port", "0", "--db-url", database,
            stdout=asyncio.subprocess.DEVNULL, stderr=stderr, stdin=asyncio.subprocess.DEVNULL,
            env={**_environ(), "PROCESSOR_LOG_FORMAT": "json"})
    try:
        await wait_until(lambda: f"{verb}_started" in err.read_text(), timeout=START_DEADLINE,
                         message=f"{verb}_started")
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            assert await process.wait() == 0, err.read_text()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    records = [json.loads(line) for line in err.read_text().splitlines()]
    actions = {record.get("action"): record for record in records}
    started = actions[f"{verb}_started"]
    assert started["level"] == "INFO" and started["url"].startswith("http://127.0.0.1:")
    assert f"{verb}_stopped" in actions


OWNED = "invoices-2026-11-28-batch-0042"  # 30 characters: room for it at 80 columns
OWNER = "processor-7f3a9c2e-worker-01"


async def test_an_id_stays_whole_at_80_columns_beside_an_owner(tmp_path: Path) -> None:
    """The owner column folds before the ids do: at 80 columns a 30-character id is on
    one line beside a long owner (the owner in pieces, whole once joined)."""
    from watcher.store import Store

    url = f"sqlite:///{tmp_path / 'owned.db'}"
    assert run_cli("migrate", "--db-url", url).returncode == 0
    async with AsyncClient(url) as client:
        await client.create_partition(OWNED, [NewItem("a", b"{}")])
    store = Store.open(url)
    try:
        await store.leases_take(await store.leases_read_free(10), OWNER, 600)
    finally:
        await store.close()
    done = run_cli("status", "--db-url", url, env=NARROW)
    assert done.returncode == 0, done.stderr
    table = [line for line in done.stdout.splitlines() if line[:1] in "┏┃┡│└"]
    assert table and max(len(line) for line in table) <= 80, done.stdout
    assert f"│ {OWNED} │" in done.stdout, done.stdout  # whole, on one line
    rows = [line.split("│") for line in table if line.startswith("│")]
    assert "".join(row[4].strip() for row in rows) == OWNER, done.stdout


async def test_schedules_list_keeps_times_and_names_whole_at_80_columns(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'schedules.db'}"
    assert run_cli("migrate", "--db-url", url).returncode == 0
    names = ("nightly-invoices-export", "every-quarter-hour")
    async with AsyncClient(url) as client:
        await client.add_schedule(names[0], cron="0 3 * * *", timezone="Europe/Berlin")
        await client.add_schedule(names[1], every=900, no_overlap=True)
        ticks = [info.next_at for info in await client.schedules()]
    done = run_cli("schedules", "list", "--db-url", url, env=NARROW)
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout and max(map(len, done.stdout.splitlines())) <= 80
    rows = [line.split("│")[1:-1] for line in done.stdout.splitlines()
            if line.startswith("│")]
    for tick in ticks:
        assert tick is not None
        shown = tick.strftime("%Y-%m-%dT%H:%M:%SZ")
        assert any(row[3].strip() == shown for row in rows), done.stdout  # on one line
    shown_names: list[str] = []  # a schedule's row starts where its next tick is
    for row in rows:
        if row[3].strip():
            shown_names.append("")
        shown_names[-1] += row[0].strip()
    assert sorted(shown_names) == sorted(names), done.stdout  # whole, once joined
