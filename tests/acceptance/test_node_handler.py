"""The spawn guide's handler in another language: examples/node/spawn_handler.js, written
with the TypeScript SDK (sdk/typescript, built here) and served by Node.js, lists a folder
by spawning its files in pages, through a real processor over HTTP; the spawn guide
(docs/how-to/spawn.md) shows that file as it is."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from processor import AsyncClient, NewItem
from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from tests.acceptance.harness.processes import START_DEADLINE
from tests.support.engine import running, wait_until
from tests.support.servers import free_port
from tests.support.typescript_sdk import built_sdk
from watcher import Watcher, WatcherConfig
from watcher.store import Store
from watcher.store.db.migrate import upgrade

ROOT = Path(__file__).resolve().parents[2]
HANDLER = ROOT / "examples" / "node" / "spawn_handler.js"
NODE = shutil.which("node")


def test_the_spawn_guide_shows_the_node_handler_as_it_is() -> None:
    guide = (ROOT / "docs" / "how-to" / "spawn.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```javascript\n(.*?)```", guide, re.S)
    assert HANDLER.read_text(encoding="utf-8") in blocks


def example_folder(folder: Path) -> Path:
    """``folder`` set up as a user's project of the example: its ``package.json`` (an ES
    module), the SDK as ``node_modules/@statefeed/sdk`` (a link to the built package, as
    ``npm install`` of ``examples/node`` makes it), and the handler."""
    shutil.copy(HANDLER.with_name("package.json"), folder / "package.json")
    (folder / "node_modules" / "@statefeed").mkdir(parents=True)
    (folder / "node_modules" / "@statefeed" / "sdk").symlink_to(built_sdk())
    shutil.copy(HANDLER, folder / HANDLER.name)
    return folder / HANDLER.name


@contextlib.asynccontextmanager
async def node_handler(folder: Path) -> AsyncIterator[str]:
    """Serve the example with Node.js on a free loopback port; yields its URL."""
    assert NODE is not None
    handler = example_folder(folder)
    port = free_port()
    server = await asyncio.create_subprocess_exec(
        NODE, str(handler), str(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"

    async def answers() -> bool:
        try:
            async with httpx.AsyncClient() as client:
                return (await client.get(f"{url}healthz")).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        await wait_until(answers, timeout=START_DEADLINE, message="the Node.js handler to listen")
        yield url
    finally:
        server.terminate()
        await asyncio.wait_for(server.wait(), timeout=10)


@pytest.mark.skipif(NODE is None, reason="Node.js is not installed")
async def test_a_node_handler_lists_a_folder_by_spawning_in_pages(tmp_path) -> None:
    db_url = f"sqlite:///{tmp_path / 'node.db'}"
    upgrade(db_url)
    client = AsyncClient(db_url)
    files = 250  # three pages of at most 100
    await client.create_partition("job", [NewItem("folder", json.dumps({"files": files})
                                                  .encode())])
    (tmp_path / "example").mkdir()
    async with node_handler(tmp_path / "example") as url:
        processor = HttpProcessor(HttpProcessorConfig(handler_url=url))
        store = Store.open(db_url)
        watcher = Watcher(store, processor,
                          WatcherConfig(owner_id="w1", poll_interval=0.05, lease_duration=3.0))
        try:
            async with running(watcher):
                info = await client.wait("job", timeout=60)
        finally:
            await processor.aclose()
            await store.close()
    assert info.status == "complete" and info.counts == {"complete": files + 1}
    assert info.spawned == files
    items = {item.id: item for item in await client.items("job", limit=1000)}
    assert json.loads(items["folder"].data) == {"files": files, "cursor": files}
    children = [item for item in items.values() if item.id != "folder"]
    assert {item.parent for item in children} == {"folder"}
    assert json.loads(items["folder/file-249"].data) == {"file": "file-249.pdf",
                                                         "checked": True}
    await client.close()
