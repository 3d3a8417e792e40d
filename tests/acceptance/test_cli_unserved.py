"""``processor status`` names the places where open partitions wait that no live
processor serves, as a real ``processor`` subprocess on every live database: a line per
place with what to do, and ``"unserved"`` on each row of ``--json``; both clear once a
processor serving the place runs (a library watcher here, with a real row in the
``processors`` table)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from processor import AsyncClient, NewItem
from tests.acceptance.harness.processes import run_cli
from tests.support.engine import running, wait_until
from watcher import Watcher, WatcherConfig
from watcher.pipelines import ServedPipelines, ServedRoute
from watcher.protocol import Result, WorkItem
from watcher.store import Store

FAST = {"poll_interval": 0.05, "lease_duration": 2.0, "shutdown_timeout": 0.1}
WIDE = {"COLUMNS": "400"}  # each line of the status output whole


async def held(item: WorkItem) -> Result:
    """A call that never ends by itself: the partition stays open at its gate."""
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


async def status(db_url: str, table_prefix: str, *args: str) -> str:
    """``processor status`` run to its end (in a thread: the watchers run meanwhile)."""
    done: Any = await asyncio.to_thread(run_cli, "status", "--db-url", db_url,
                                        "--table-prefix", table_prefix, *args, env=WIDE)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return done.stdout


def unserved_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.startswith("not served")]


async def test_status_names_each_place_no_processor_serves_until_one_does(
        client: AsyncClient, db_url: str, table_prefix: str) -> None:
    for n in range(3):
        await client.create_partition(f"inv{n}", [NewItem("a", b"")], pipeline="invoices",
                                      pipeline_version="v2")
    await client.create_partition("res", [NewItem("a", b"", gate=1)], pipeline="resumes")
    await client.create_partition("done", [NewItem("a", b"")], pipeline="invoices")
    assert await client.cancel("done")  # finished: never unserved
    store = Store.open(db_url, table_prefix)
    resumes = Watcher(store, held, WatcherConfig(
        **FAST, owner_id="resumes-only", pipelines=ServedPipelines((ServedRoute("resumes"),))))
    invoices = Watcher(Store.open(db_url, table_prefix), held, WatcherConfig(
        **FAST, owner_id="invoices-v2",
        pipelines=ServedPipelines((ServedRoute("invoices", "v2", False),))))
    try:
        async with running(resumes):
            await wait_until(client.processors, timeout=30, message="the first row")
            text = await status(db_url, table_prefix)
            assert unserved_lines(text) == [
                "not served: 3 open partitions wait at pipeline 'invoices' (version 'v2') "
                "gate 0, which no live processor serves; start a processor whose routes "
                "serve it, or check the routes of those running"], text
            rows = {row["id"]: row for row in json.loads(
                await status(db_url, table_prefix, "--json"))}
            assert {pid: row["unserved"] for pid, row in rows.items()} == {
                "inv0": True, "inv1": True, "inv2": True, "res": False, "done": False}
            async with running(invoices):
                await wait_until(lambda: _rows(client, 2), timeout=30, message="both rows")
                text = await status(db_url, table_prefix)
                assert unserved_lines(text) == [] and "inv0" in text, text
                rows = {row["id"]: row for row in json.loads(
                    await status(db_url, table_prefix, "--json"))}
                assert not any(row["unserved"] for row in rows.values()), rows
    finally:
        await resumes.store.close()
        await invoices.store.close()
    # Nobody runs: every open place shows, the partition not pinned yet as such.
    assert unserved_lines(await status(db_url, table_prefix)) == [
        "not served: 3 open partitions wait at pipeline 'invoices' (version 'v2') gate 0, "
        "which no live processor serves; start a processor whose routes serve it, or check "
        "the routes of those running",
        "not served: 1 open partition waits at pipeline 'resumes' (no version pinned yet) "
        "gate 1, which no live processor serves; start a processor whose routes serve it, "
        "or check the routes of those running"]


async def _rows(client: AsyncClient, count: int) -> bool:
    return len(await client.processors()) == count


async def processors_cli(db_url: str, table_prefix: str, *args: str) -> str:
    """``processor processors`` run to its end (in a thread: the watchers run meanwhile)."""
    done: Any = await asyncio.to_thread(run_cli, "processors", "--db-url", db_url,
                                        "--table-prefix", table_prefix, *args, env=WIDE)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return done.stdout


async def test_processors_lists_each_live_processor_with_what_it_serves(
        client: AsyncClient, db_url: str, table_prefix: str) -> None:
    assert "no live processor" in await processors_cli(db_url, table_prefix)
    assert json.loads(await processors_cli(db_url, table_prefix, "--json")) == []
    gates = Watcher(Store.open(db_url, table_prefix), held, WatcherConfig(
        **FAST, owner_id="ocr-gates", pipelines=ServedPipelines(
            (ServedRoute("invoices", "v2", False, frozenset({0, 2})),))))
    everything = Watcher(Store.open(db_url, table_prefix), held,
                         WatcherConfig(**FAST, owner_id="all-of-it"))
    try:
        async with running(gates), running(everything):
            await wait_until(lambda: _rows(client, 2), timeout=30, message="both rows")
            rows = {row["owner"]: row for row in json.loads(
                await processors_cli(db_url, table_prefix, "--json"))}
            assert rows["all-of-it"]["serves"] is None
            assert rows["ocr-gates"]["serves"] == [
                {"pipeline": "invoices", "version": "v2", "gates": [0, 2]}]
            text = await processors_cli(db_url, table_prefix)
            assert "invoices@v2 gates 0,2" in text and "every pipeline and gate" in text, text
    finally:
        await gates.store.close()
        await everything.store.close()
    # Stopped cleanly: their rows are gone.
    assert "no live processor" in await processors_cli(db_url, table_prefix)
