"""The spawn docs run as they stand: the guide's curl answer comes from the Node.js
example, the spawn guide's SDK handler fans a folder out through a real processor, and
its paging step is the runnable example's."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path

import httpx
import pytest

from processor import AsyncClient, NewItem
from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from tests.acceptance.test_docs import marked_blocks
from tests.acceptance.test_node_handler import NODE, node_handler
from tests.support.engine import running
from tests.support.servers import serve_app
from watcher import Watcher, WatcherConfig
from watcher.store import Store
from watcher.store.db.migrate import upgrade

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "how-to" / "spawn.md"


@pytest.mark.skipif(NODE is None, reason="Node.js is not installed")
async def test_the_guides_curl_gets_the_answer_it_shows(tmp_path) -> None:
    block = marked_blocks(GUIDE)["spawn_curl"]
    command, expected = block.replace("\\\n", " ").strip().split("\n# ")
    words = shlex.split(command)
    headers = dict(words[i + 1].split(": ", 1) for i, word in enumerate(words) if word == "-H")
    body = words[words.index("--data-binary") + 1].encode()
    async with node_handler(tmp_path) as url, httpx.AsyncClient() as client:
        answer = await client.post(url, headers=headers, content=body)
    assert answer.status_code == 200, answer.text
    assert answer.text == expected.strip()


async def test_the_guides_sdk_handler_fans_a_folder_out(tmp_path) -> None:
    (tmp_path / "unpack.py").write_text(marked_blocks(GUIDE)["spawn_handler"])
    spec = importlib.util.spec_from_file_location("guide_unpack", tmp_path / "unpack.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    db_url = f"sqlite:///{tmp_path / 'guide.db'}"
    upgrade(db_url)
    files = ["a.pdf", "b.pdf", "c.pdf"]
    async with AsyncClient(db_url) as client, serve_app(module.app) as url:
        await client.create_partition("job", [NewItem("folder-7", json.dumps(
            {"files": files}).encode())])
        processor = HttpProcessor(HttpProcessorConfig(handler_url=f"{url}/"))
        store = Store.open(db_url)
        watcher = Watcher(store, processor,
                          WatcherConfig(owner_id="w1", poll_interval=0.05, lease_duration=3))
        try:
            async with running(watcher):
                info = await client.wait("job", timeout=30)
        finally:
            await processor.aclose()
            await store.close()
        items = {item.id: item for item in await client.items("job")}
    assert info.status == "complete" and info.spawned == 3
    assert {items[f"folder-7/{name}"].parent for name in files} == {"folder-7"}
    assert json.loads(items["folder-7/b.pdf"].data) == {"checked": "b.pdf"}


def test_the_guides_paging_step_is_the_runnable_examples() -> None:
    example = (ROOT / "examples" / "paging_producer.py").read_text()
    code = {re.sub(r"\s+#.*$", "", line).strip() for line in example.splitlines()}
    for line in marked_blocks(GUIDE)["paging"].splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        assert not line or line in code, f"the guide's line {line!r} is not the example's"
