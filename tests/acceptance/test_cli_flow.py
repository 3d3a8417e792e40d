"""The flow-control verbs as real ``processor`` subprocesses: ``create --key --priority
--start-at`` (and items' ``not_before``), ``pause``/``resume`` of a partition, a key or
everything, ``keys`` and ``keys set``, and ``run``'s flow options; each bad value is one
line on stderr, exit 2, and nothing written."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from processor import AsyncClient
from processor.http.config import service_name as handler_name
from tests.acceptance.harness.processes import run_cli
from watcher.store import Store

ERROR = "processor: error: "
WIDE = {"COLUMNS": "200"}  # tables at full width, whatever the terminal


@pytest.fixture
def where(db_url: str, table_prefix: str) -> tuple[str, ...]:
    """``--db-url URL --table-prefix P`` of an empty, migrated namespace."""
    return ("--db-url", db_url, "--table-prefix", table_prefix)


def one_error_line(done: Any, fragment: str) -> str:
    """The CLI failed with exit 2 and one line on stderr holding ``fragment``."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(ERROR), done.stderr
    assert fragment in lines[0], lines[0]
    assert done.stdout == ""
    return lines[0]


def ok(done: Any) -> str:
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout


def ok_json(*args: str) -> Any:
    return json.loads(ok(run_cli(*args, "--json")))


async def controls(where: tuple[str, ...]) -> list[tuple[str, str, Any, Any, bool]]:
    async with AsyncClient(where[1], where[3]) as client:
        return [(row.scope, row.name, row.max_inflight, row.rate_limit,
                 row.paused_at is not None) for row in await client.flow_controls()]


async def test_create_takes_a_key_a_priority_a_start_and_items_not_before(
        where, tmp_path: Path) -> None:
    later = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=2)
    items = tmp_path / "items.ndjson"
    items.write_text(json.dumps({"id": "late", "data": 1, "not_before": later.isoformat()})
                     + "\n" + json.dumps({"id": "now", "data": 2}) + "\n")
    start = (later + timedelta(hours=1)).astimezone(timezone_plus_one())
    created = ok_json("create", "acme-1", "--items", str(items), "--key", "acme",
                      "--priority", "3", "--start-at", start.isoformat(), *where)
    assert (created["key"], created["priority"]) == ("acme", 3)
    assert created["start_at"] == (later + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    text = ok(run_cli("create", "plain", *where))
    assert text.strip() == "created partition 'plain' with 0 items"

    [row] = [row for row in ok_json("status", *where) if row["id"] == "acme-1"]
    assert (row["key"], row["priority"], row["paused"]) == ("acme", 3, False)
    table = ok(run_cli("status", *where, env=WIDE))
    assert "acme +3" in table
    async with AsyncClient(where[1], where[3]) as client:
        info = await client.partition("acme-1")
        stored = {item.id: item.retry_at for item in await client.items("acme-1")}
    assert info.until == (later + timedelta(hours=1)).replace(tzinfo=None)
    assert stored["late"] == later.replace(tzinfo=None)  # the line's not_before kept
    assert stored["now"] is not None and stored["now"] < later.replace(tzinfo=None)


def timezone_plus_one() -> Any:
    from datetime import timezone

    return timezone(timedelta(hours=1))


@pytest.mark.parametrize(("args", "fragment"), [
    (["--priority", "11"], "priority must be from -10"),
    (["--priority", "-11"], "priority must be from -10"),
    (["--start-at", "2026-11-26T10:00:00"], "has no offset"),
    (["--start-at", "tomorrow"], "is not an RFC 3339 time"),
    (["--start-at", "2999-01-01T00:00:00Z"], "days ahead"),
    (["--key", "k" * 300], "the limit is 255"),
])
async def test_create_refuses_bad_flow_settings_and_writes_nothing(where, args,
                                                                   fragment) -> None:
    one_error_line(run_cli("create", "bad", *args, *where), fragment)
    async with AsyncClient(where[1], where[3]) as client:
        assert [info.id for info in await client.partitions()] == []


async def test_pause_and_resume_a_partition_a_key_or_everything(where) -> None:
    ok(run_cli("create", "p", "--key", "acme", *where))
    assert ok_json("pause", "p", *where)["paused"] is True
    assert ok_json("pause", "p", *where)["paused"] is False
    assert ok_json("status", *where)[0]["paused"] is True
    assert ok_json("resume", "p", *where)["resumed"] is True

    assert ok_json("pause", "--key", "acme", *where) == {"key": "acme", "all": False,
                                                         "paused": True}
    said = ok(run_cli("pause", "--key", "acme", *where))
    assert said.strip() == "key 'acme' is paused already; nothing to do"
    assert ok_json("pause", "--all", *where) == {"key": None, "all": True, "paused": True}
    listed = ok_json("keys", *where)
    assert listed["fleet_paused"] is True and listed["fleet_paused_at"]
    assert [(row["name"], row["paused"]) for row in listed["controls"]] == [("acme", True)]
    assert "everything is paused since" in ok(run_cli("keys", *where))
    said = ok(run_cli("resume", "--all", *where))
    assert said.startswith("resumed everything")
    assert ok_json("resume", "--key", "acme", *where)["resumed"] is True
    assert await controls(where) == []


@pytest.mark.parametrize(("args", "fragment"), [
    ([], "takes one of PARTITION, --key KEY or --all; got none"),
    (["p", "--key", "acme"], "got PARTITION and --key"),
    (["--key", "acme", "--all"], "got --key and --all"),
    (["--key", "typo"], "no partition has had key 'typo'"),
    (["nowhere"], "partition 'nowhere' does not exist"),
])
async def test_pause_refuses_what_it_cannot_pause(where, args, fragment) -> None:
    ok(run_cli("create", "p", "--key", "acme", *where))
    for verb in ("pause", "resume"):
        one_error_line(run_cli(verb, *args, *where), fragment)
    assert await controls(where) == []
    assert ok_json("status", *where)[0]["paused"] is False


async def test_keys_set_and_list_with_grants(where) -> None:
    ok(run_cli("create", "p", "--key", "acme", *where))
    ok(run_cli("create", "q", "--key", "globex", *where))
    said = ok(run_cli("keys", *where))
    assert said.startswith("no key or handler has a limit")
    set_ = ok_json("keys", "set", "acme", "--max-inflight", "4", "--rate", "2.5", *where)
    assert set_ == {"key": "acme", "max_inflight": 4, "rate_limit": 2.5}
    assert ok_json("keys", "set", "early", "--max-inflight", "7", "--define", *where) == {
        "key": "early", "max_inflight": 7}
    assert await controls(where) == [("key", "acme", 4, 2.5, False),
                                     ("key", "early", 7, None, False)]
    # A grant of globex (under a default limit: no control of its own) and of acme.
    store = Store.open(where[1], where[3])
    try:
        await store.flow_grant("acme", "w1", limit=4, wanted=3, in_use=0, duration=60)
        await store.flow_grant("globex", "w2", limit=2, wanted=1, in_use=0, duration=60)
    finally:
        await store.close()
    plain = ok_json("keys", *where)["controls"]
    assert [row["name"] for row in plain] == ["acme", "early"] and "grants" not in plain[0]
    granted = {row["name"]: row["grants"] for row in ok_json("keys", "--grants", *where)[
        "controls"]}
    assert granted == {"acme": [{"owner": "w1", "slots": 3, "wanted": 3}], "early": [],
                       "globex": [{"owner": "w2", "slots": 1, "wanted": 1}]}
    table = ok(run_cli("keys", "--grants", *where, env=WIDE))
    assert "w1: 3/3" in table and "globex" in table
    lifted = ok(run_cli("keys", "set", "acme", "--max-inflight", "none", *where))
    assert "no in-flight limit of its own" in lifted
    assert await controls(where) == [("key", "acme", None, 2.5, False),
                                     ("key", "early", 7, None, False)]


@pytest.mark.parametrize(("args", "fragment"), [
    ([], "give --max-inflight N and/or --rate N"),
    (["--max-inflight", "0"], "at least 1"),
    (["--max-inflight", "-2"], "at least 1"),
    (["--max-inflight", "four"], "--max-inflight must be a whole number"),
    (["--max-inflight", "2", "--rate", "0"], "calls_per_second"),
    (["--rate", "fast"], "--rate must be calls per second"),
    (["--rate", "1e9"], "calls_per_second"),
    (["--rate", "nan"], "calls_per_second"),
])
async def test_keys_set_refuses_bad_values_and_writes_nothing(where, args,
                                                              fragment) -> None:
    ok(run_cli("create", "p", "--key", "acme", *where))
    line = one_error_line(run_cli("keys", "set", "acme", *args, *where), fragment)
    assert "nothing was written" in line
    assert await controls(where) == []


async def test_keys_set_refuses_an_unknown_key(where) -> None:
    line = one_error_line(run_cli("keys", "set", "typo", "--max-inflight", "3", *where),
                          "no partition has had key 'typo'")
    assert "--define" in line
    assert await controls(where) == []


@pytest.mark.parametrize(("args", "fragment"), [
    (["--max-inflight-per-key", "0"], "max in-flight per key"),
    (["--rate-limit", "0"], "rate limit"),
    (["--rate-limit-per-key", "100000"], "rate limit per key"),
])
def test_run_refuses_bad_flow_options(where, args, fragment) -> None:
    done = run_cli("run", "--handler-url", "http://127.0.0.1:9/", "--health-port", "0",
                   *args, *where)
    one_error_line(done, fragment)


def test_a_handler_is_named_by_its_url_without_secrets() -> None:
    assert handler_name("http://user:pw@Handler.example:8080/step?code=s3cret#x") == (
        "http://handler.example:8080/step")
    assert handler_name("https://[::1]/a") == "https://[::1]/a"
    assert handler_name("http://h") == "http://h/"
