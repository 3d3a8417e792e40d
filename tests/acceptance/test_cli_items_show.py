"""``processor items PARTITION --show ITEM`` and ``processor items --find ITEM`` as real
subprocesses, after a real engine ran the items through a real uvicorn handler that
fails some of them: the item's data (pretty JSON, hex, cut with a note unless --all),
its parent and its error history, in text and JSON; a missing item or partition is one
line and a non-zero exit."""

from __future__ import annotations

import json
from typing import Any

import pytest

import handlers
from handlers import Item, Result
from processor import AsyncClient, NewItem
from processor.cli.data import SHOW_DATA_CHARS
from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from tests.acceptance.harness.processes import run_cli
from tests.support.engine import running
from tests.support.servers import serve_app
from watcher import Watcher, WatcherConfig
from watcher.store import Store

BIG = {"rows": [{"n": n, "text": "x" * 40} for n in range(200)]}  # far over SHOW_DATA_CHARS
BINARY = bytes(range(70))


def step(item: Item) -> Result:
    if item.id == "flaky":
        raise handlers.Retry(f"the model is loading ({item.attempt})")
    if item.id == "refused":
        raise handlers.Fail("the resume has no text")
    return Result(done=True)


@pytest.fixture
def where(db_url: str, table_prefix: str) -> tuple[str, ...]:
    """``--db-url URL --table-prefix P`` of an empty, migrated namespace."""
    return ("--db-url", db_url, "--table-prefix", table_prefix)


async def _run_items(where: tuple[str, ...]) -> None:
    db_url, prefix = where[1], where[3]
    async with AsyncClient(db_url, prefix) as client:
        await client.create_partition("job", [
            NewItem("flaky", b'{"name": "Ada"}'), NewItem("refused", b"{}"),
            NewItem("big", json.dumps(BIG).encode()), NewItem("bin", BINARY)],
            on_item_failure="continue")
        async with serve_app(handlers.app({0: step})) as url:
            processor = HttpProcessor(HttpProcessorConfig(handler_url=url + "/"))
            store = Store.open(db_url, prefix)
            config = WatcherConfig(owner_id="w1", poll_interval=0.05, lease_duration=3.0,
                                   max_retries=2, retry_backoff=0.01, retry_backoff_max=0.02)
            try:
                async with running(Watcher(store, processor, config)):
                    await client.wait("job", timeout=30)
            finally:
                await processor.aclose()
                await store.close()
        # Another partition holding the same id, which no engine runs.
        await client.create_partition("other", [NewItem("flaky", b"1")])


def _ok(done: Any) -> str:
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return str(done.stdout)


def _one_error_line(done: Any) -> str:
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return str(lines[0])


async def test_show_prints_an_item_with_its_data_and_error_history(where) -> None:
    await _run_items(where)
    text = _ok(run_cli("items", "job", "--show", "flaky", *where))
    lines = text.splitlines()
    assert lines[:5] == ["item 'flaky' of partition 'job'", "  status    failed",
                         "  gate      0", "  attempts  3", "  parent    -"]
    assert "data (JSON, 15 bytes):" in lines and '    "name": "Ada"' in lines
    history = lines[lines.index("error history (oldest first; times UTC):") + 1:]
    assert len(history) == 3, text
    for attempt, line in enumerate(history, start=1):
        assert f"  attempt {attempt}  gate 0  the handler answered HTTP 503: the model is " \
               f"loading ({attempt})" in line, line
        assert "'job'" not in line and "'flaky'" not in line, "the context is said once"

    document = json.loads(_ok(run_cli("items", "job", "--show", "flaky", "--json", *where)))
    assert (document["partition"], document["id"], document["status"], document["attempts"],
            document["data"]) == ("job", "flaky", "failed", 3, {"name": "Ada"})
    assert [(entry["attempt"], entry["gate"]) for entry in document["error_history"]] == [
        (1, 0), (2, 0), (3, 0)]
    assert document["error_history"][-1]["error"] == document["last_error"]
    times = [entry["at"] for entry in document["error_history"]]
    assert times == sorted(times)

    refused = _ok(run_cli("items", "job", "--show", "refused", *where))
    assert "  attempt 1  gate 0  the handler answered HTTP 422: the resume has no text" \
        in refused


async def test_show_cuts_long_data_unless_all_and_prints_bytes_in_hex(where) -> None:
    await _run_items(where)
    cut = _ok(run_cli("items", "job", "--show", "big", *where))
    whole_json = json.dumps(BIG, indent=2)
    assert cut.splitlines()[-2].endswith(
        f"({len(whole_json) - SHOW_DATA_CHARS:,} more characters; --all prints it whole)")
    assert cut.splitlines()[-1] == "no errors"
    whole = _ok(run_cli("items", "job", "--show", "big", "--all", *where))
    assert "more characters" not in whole
    assert '        "n": 199,' in whole.splitlines()
    document = json.loads(_ok(run_cli("items", "job", "--show", "big", "--json", *where)))
    assert document["data"] == BIG, "--json carries the data whole"

    binary = _ok(run_cli("items", "job", "--show", "bin", *where)).splitlines()
    assert "data (binary, 70 bytes, hex):" in binary
    assert "  " + BINARY[:32].hex(" ") in binary
    assert "  " + BINARY[64:].hex(" ") in binary
    document = json.loads(_ok(run_cli("items", "job", "--show", "bin", "--json", *where)))
    assert document["data_bytes"] == 70 and "data" not in document


async def test_find_lists_the_partitions_holding_an_id(where) -> None:
    await _run_items(where)
    found = json.loads(_ok(run_cli("items", "--find", "flaky", "--json", *where)))
    assert [(row["partition"], row["status"]) for row in found] == [
        ("job", "failed"), ("other", "available")]
    table = _ok(run_cli("items", "--find", "flaky", *where, env={"COLUMNS": "120"}))
    assert "job" in table and "other" in table
    assert _ok(run_cli("items", "--find", "absent", *where)) == (
        "no partition holds an item 'absent'\n")


async def test_a_missing_item_or_partition_is_one_line(where) -> None:
    async with AsyncClient(where[1], where[3]) as client:
        await client.create_partition("job", [NewItem("a", b"")])
    line = _one_error_line(run_cli("items", "job", "--show", "zz", *where))
    assert line == ("processor: error: partition 'job' has no item 'zz'; list its items with "
                    "`processor items job`, or look for the id in every partition with "
                    "`processor items --find zz`")
    line = _one_error_line(run_cli("items", "nope", "--show", "a", *where))
    assert line.startswith("processor: error: partition 'nope' does not exist")
    line = _one_error_line(run_cli("items", "--show", "a", *where))
    assert "give a partition id" in line
    line = _one_error_line(run_cli("items", "job", "--find", "a", *where))
    assert "--find looks in every partition" in line
    line = _one_error_line(run_cli("items", "job", "--all", *where))
    assert "--all goes with --show" in line
