"""Schedules through real ``processor`` subprocesses: the ``schedules`` verbs (each bad
value one line, exit 2, nothing written), and schedules ticking every second while three
``processor run`` are killed with -9 and restarted: each tick's partition is created once,
and each catch-up policy holds over the time every processor was down."""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from processor import AsyncClient
from tests.acceptance.harness.cluster import Cluster
from tests.acceptance.harness.handler import RecordingHandler
from tests.acceptance.harness.processes import run_cli
from tests.support.engine import wait_until
from watcher.store.db.migrate import downgrade, upgrade

ERROR = "processor: error: "


@pytest.fixture
def where(db_url: str) -> Iterator[tuple[str, ...]]:
    """``--db-url URL --table-prefix P`` of a fresh namespace, migrated, dropped after."""
    prefix = f"sch{uuid.uuid4().hex[:8]}_"
    upgrade(db_url, prefix)
    yield ("--db-url", db_url, "--table-prefix", prefix)
    downgrade(db_url, prefix)


def ok(done: Any) -> str:
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout


def one_error_line(done: Any, fragment: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(ERROR), done.stderr
    assert fragment in lines[0], lines[0]


def test_schedule_verbs(where, tmp_path: Path) -> None:
    items = tmp_path / "items.ndjson"
    items.write_text('{"id": "a", "data": {"n": 1}}\n{"id": "b", "gate": 1, "data": 2}\n')
    added = json.loads(ok(run_cli("schedules", "add", "nightly", "--cron", "0 3 * * *",
                                  "--timezone", "Europe/Berlin", "--items", str(items),
                                  "--reduce-gates", "1", "--key", "acme", "--priority", "2",
                                  "--catch-up", "all", "--no-overlap", *where, "--json")))
    assert added["cron"] == "0 3 * * *" and added["timezone"] == "Europe/Berlin"
    assert (added["items"], added["reduce_gates"], added["key"], added["priority"]) == (
        2, [1], "acme", 2)
    assert (added["catch_up"], added["no_overlap"], added["last_tick"]) == ("all", True, None)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT0[12]:00:00Z", added["next_tick"])  # 03:00 Berlin
    ok(run_cli("schedules", "add", "fast", "--every", "90s", *where))
    listed = json.loads(ok(run_cli("schedules", "list", *where, "--json")))
    assert [row["name"] for row in listed] == ["fast", "nightly"]
    table = ok(run_cli("schedules", "list", *where, env={"COLUMNS": "200"}))
    assert "every 90s" in table and "Europe/Berlin" in table
    assert "paused" in ok(run_cli("schedules", "pause", "fast", *where))
    assert "already" in ok(run_cli("schedules", "pause", "fast", *where))
    shown = json.loads(ok(run_cli("schedules", "show", "fast", *where, "--json")))
    assert shown["paused"] is True and shown["next_tick"] is None
    assert "resumed" in ok(run_cli("schedules", "resume", "fast", *where))
    assert "deleted" in ok(run_cli("schedules", "delete", "fast", *where))
    one_error_line(run_cli("schedules", "show", "fast", *where), "does not exist")

    for args, fragment in [
        (("bad", "--cron", "0 3 * *"), "not a cron expression"),
        (("bad", "--cron", "0 3 * * *", "--timezone", "Mars/Base"), "unknown time zone"),
        (("bad", "--every", "0.5s"), "from 1 s"),
        (("bad", "--every", "soon"), "--every must be a duration"),
        (("a/b", "--every", "1m"), "no '/'"),
        (("bad", "--every", "1m", "--catch-up", "most"), "skip, all, none"),
        (("bad",), "exactly one"),
        (("nightly", "--every", "1m"), "already exists"),
    ]:
        one_error_line(run_cli("schedules", "add", *args, *where), fragment)
    listed = json.loads(ok(run_cli("schedules", "list", *where, "--json")))
    assert [row["name"] for row in listed] == ["nightly"]
    assert listed[0]["cron"] == "0 3 * * *"  # the duplicate changed nothing


def _ticks(ids: list[str], name: str) -> list[datetime]:
    return sorted(datetime.strptime(one.split("/", 1)[1], "%Y-%m-%dT%H:%M:%SZ")
                  for one in ids if one.startswith(f"{name}/"))


async def test_ticks_once_each_through_kills_and_restarts(db_url, tmp_path: Path) -> None:
    async with Cluster(tmp_path, RecordingHandler(), db_url=db_url, name="tick") as cluster:
        client: AsyncClient = cluster.client
        await client.add_schedule("all", every=1, catch_up="all")
        await client.add_schedule("skip", every=1, catch_up="skip")

        async def ids() -> list[str]:
            return [info.id for info in await client.partitions(limit=10_000,
                                                                with_counts=False)]

        async def run_round(count: int) -> None:
            """Start three processors, wait for ``count`` more ticks, kill -9 them all."""
            now = await ids()
            before = {name: len(_ticks(now, name)) for name in ("all", "skip")}
            for _ in range(3):
                await cluster.start(None, db_url=db_url)

            async def enough() -> bool:
                now = await ids()
                return all(len(_ticks(now, name)) >= before[name] + count for name in before)

            await wait_until(enough, timeout=60, message=f"{count} more ticks")
            await cluster.kill_all()

        await run_round(3)
        down_since = await client.store.now()

        async def down_long_enough() -> bool:
            return await client.store.now() >= down_since + timedelta(seconds=4)

        await wait_until(down_long_enough, timeout=30, message="4 s of downtime")
        await run_round(3)
        cluster.assert_no_tracebacks()

        logs = "".join(proc.stderr() for proc in cluster.processors)
        created = Counter(re.findall(r"action=schedule_ticked schedule=\S+ partition=(\S+)",
                                     logs))
        final = await ids()
        # Each partition was created by one processor, once (a kill -9 may lose the
        # log lines of the last moments, never add one), and no tick was handled twice.
        assert set(created) <= set(final), sorted(set(created) - set(final))
        assert len(created) >= len(final) - 6
        assert max(created.values()) == 1, created.most_common(3)
        assert "action=schedule_tick_existed" not in logs
        # "all" missed no tick, through the downtime too: one partition a second.
        every = _ticks(final, "all")
        assert every == [every[0] + timedelta(seconds=n) for n in range(len(every))]
        # "skip" made only the latest of the ticks missed while all were down.
        skipped = _ticks(final, "skip")
        gaps = [later - earlier for earlier, later in pairwise(skipped)]
        assert max(gaps) >= timedelta(seconds=3), skipped
        assert len(skipped) < len(every)


def test_schedules_carry_notify_and_pipeline(where) -> None:
    hook = "https://ops:pw5ecret@hooks.example.com/sf?token=t0ps3cret"
    added = json.loads(ok(run_cli("schedules", "add", "billing", "--every", "1h", "--notify",
                                  hook, "--pipeline", "invoices", "--pipeline-version", "v2",
                                  *where, "--json")))
    assert (added["notify"], added["pipeline"], added["pipeline_version"]) == (
        "https://ops:***@hooks.example.com/sf?token=***", "invoices", "v2")
    shown = ok(run_cli("schedules", "show", "billing", *where))
    assert "pipeline invoices@v2, notify https://ops:***@hooks.example.com/sf?token=***" \
        in shown
    assert "pw5ecret" not in shown and "t0ps3cret" not in shown
    for args, fragment in [
        (("--notify", "ftp://example.com/x"), "must be an http:// or https:// URL"),
        (("--pipeline", "no spaces"), "pipeline 'no spaces' must be ASCII letters"),
        (("--pipeline-version", "v 2"), "pipeline_version 'v 2' must be ASCII letters"),
    ]:
        one_error_line(run_cli("schedules", "add", "bad", "--every", "1h", *args, *where),
                       fragment)
    listed = json.loads(ok(run_cli("schedules", "list", *where, "--json")))
    assert [row["name"] for row in listed] == ["billing"]
