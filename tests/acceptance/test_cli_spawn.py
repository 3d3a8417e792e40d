"""What the CLI shows of spawned items: ``processor items`` gains a parent column once a
step spawned, ``--json`` carries each item's parent, and ``processor status`` how many
items a partition's steps spawned."""

from __future__ import annotations

import json

from processor import AsyncClient, NewItem
from tests.acceptance.harness.processes import run_cli
from tests.support.engine import running
from watcher import Result, Watcher, WatcherConfig, WorkItem
from watcher.store import Store
from watcher.store.db.migrate import upgrade


async def process(item: WorkItem) -> Result:
    if item.id == "folder":
        return Result(done=True, spawn=[NewItem(f"folder/file-{n}", b"{}") for n in range(2)])
    return Result(done=True)


async def test_items_and_status_show_parents_and_spawned_counts(tmp_path) -> None:
    db_url = f"sqlite:///{tmp_path / 'cli.db'}"
    upgrade(db_url)
    async with AsyncClient(db_url) as client:
        await client.create_partition("job", [NewItem("folder", b"{}")])
        await client.create_partition("plain", [NewItem("alone", b"{}")])
        store = Store.open(db_url)
        try:
            async with running(Watcher(store, process, WatcherConfig(
                    owner_id="w1", poll_interval=0.05, lease_duration=3.0))):
                await client.wait("job", timeout=30)
                await client.wait("plain", timeout=30)
        finally:
            await store.close()

    table = run_cli("items", "job", "--db-url", db_url, env={"COLUMNS": "120"})
    assert table.returncode == 0, table.stderr
    assert "parent" in table.stdout
    rows = [line for line in table.stdout.splitlines() if "folder/file-1" in line]
    assert rows and "folder" in rows[0].split("folder/file-1", 1)[1]
    plain = run_cli("items", "plain", "--db-url", db_url, env={"COLUMNS": "120"})
    assert plain.returncode == 0 and "parent" not in plain.stdout

    listed = json.loads(run_cli("items", "job", "--db-url", db_url, "--json").stdout)
    parents = {item["id"]: item["parent"] for item in listed["items"]}
    assert parents == {"folder": None, "folder/file-0": "folder", "folder/file-1": "folder"}

    status = json.loads(run_cli("status", "--db-url", db_url, "--json").stdout)
    assert {row["id"]: row["spawned"] for row in status} == {"job": 2, "plain": 0}
    shown = run_cli("status", "--db-url", db_url, env={"COLUMNS": "160"})
    assert "spawned" in shown.stdout
