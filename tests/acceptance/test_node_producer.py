"""The ingest guide's producer in another language: examples/node/producer.mjs streams 10,000
items to the ingest API as NDJSON, waits with the long poll and prints the result a
real processor reduced them to; the ingest guide (docs/how-to/ingest.md) shows that file
as it is.

The create's answer is lost on the way back (a proxy cuts the connection once the
partition is written), so the script's retry with the same ``Idempotency-Key`` is
what makes it succeed: a retry under a new key would be refused as a second create.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

import handlers
from processor import AsyncClient
from processor.api.server import ApiOptions, api_running
from processor.http.batch import BatchingHttpProcessor
from processor.http.config import HttpProcessorConfig
from tests.acceptance.harness.faults import TcpProxy
from tests.acceptance.test_node_handler import NODE, ROOT
from tests.support.engine import running
from tests.support.servers import serve_app
from watcher import Watcher, WatcherConfig
from watcher.store import Store
from watcher.store.db.migrate import upgrade
from watcher.store.db.urls import parse_database_url

PRODUCER = ROOT / "examples" / "node" / "producer.mjs"
ITEMS = 10_000  # as the script sends them: n0 ... n9999, data {"n": k}
EXPECTED = {"items": ITEMS, "doubled_sum": 2 * sum(range(ITEMS))}
TOKEN = "node-producer-token-0123"  # the API asks for it: the script must send it

pytestmark = pytest.mark.skipif(NODE is None, reason="Node.js is not installed (no `node` "
                                "on PATH): the producer example needs Node 20")


def test_the_ingest_guide_shows_the_node_producer_as_it_is() -> None:
    guide = (ROOT / "docs" / "how-to" / "ingest.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```javascript\n(.*?)```", guide, re.S)
    assert PRODUCER.read_text(encoding="utf-8") in blocks


def double(item: handlers.Item) -> handlers.Result:
    """Gate 0, per item: double the number, then on to the reduce at gate 1."""
    n = item.json()["n"]
    return handlers.Result(gate=1, data={"n": n, "doubled": 2 * n})


def fold(total: dict[str, int], items: list[handlers.Item]) -> dict[str, int]:
    return {"items": total["items"] + len(items),
            "doubled_sum": total["doubled_sum"] + sum(item.json()["doubled"]
                                                      for item in items)}


# Gate 1: the whole gate in pages; every item completes, the sum is the result.
HANDLER = handlers.app({0: double}, reduce=handlers.Reduce(
    fold=fold, apply=lambda total, items: {}, initial={"items": 0, "doubled_sum": 0}))


@contextlib.asynccontextmanager
async def processing(db_url: str, prefix: str) -> AsyncIterator[None]:
    """The handler under uvicorn and a watcher calling it in batches, for the block."""
    async with serve_app(HANDLER) as handler_url:
        processor = BatchingHttpProcessor(HttpProcessorConfig(handler_url=f"{handler_url}/"),
                                          batch_size=100)
        store = Store.open(db_url, prefix)
        watcher = Watcher(store, processor, WatcherConfig(owner_id="node-producer",
                                                          poll_interval=0.05))
        try:
            async with running(watcher):
                yield
        finally:
            await processor.aclose()
            await store.close()


def cut_after_first_create(client: AsyncClient, proxy: TcpProxy) -> list[bool]:
    """Make the proxy cut every connection just after the first create is written (its
    answer is then never sent); returns what each create's insert reported (True:
    written, False: an idempotent replay)."""
    store = client.store
    original = store.partition_create_batches
    outcomes: list[bool] = []

    async def create_then_cut(*args: Any, **kwargs: Any) -> bool:
        created = await original(*args, **kwargs)
        outcomes.append(created)
        if len(outcomes) == 1:
            proxy.cut()
        return created

    store.partition_create_batches = create_then_cut  # type: ignore[method-assign]
    return outcomes


async def run_producer(api_url: str, partition_id: str, token: str | None = None
                       ) -> tuple[int, str, str]:
    """Run the example to its end (within two minutes): exit code, stdout, stderr."""
    assert NODE is not None
    env = {**os.environ, "PROCESSOR_API_URL": api_url}
    env.pop("PROCESSOR_API_TOKEN", None)
    if token is not None:
        env["PROCESSOR_API_TOKEN"] = token
    proc = await asyncio.create_subprocess_exec(
        NODE, str(PRODUCER), partition_id, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return proc.returncode or 0, out.decode(), err.decode()


@pytest.mark.parametrize("db_url", ["sqlite", pytest.param("postgres",
                                                           marks=pytest.mark.postgres)],
                         indirect=True)
async def test_the_node_producer_streams_retries_waits_and_prints_the_result(
        db_url: str, table_prefix: str) -> None:
    partition_id = "node/numbers"  # a slash: the script must percent-encode the id
    async with AsyncClient(db_url, table_prefix) as client:
        options = ApiOptions(parse_database_url(db_url), table_prefix, port=0, token=TOKEN)
        async with api_running(options, client) as api_url, processing(db_url, table_prefix):
            api = urlsplit(api_url)
            async with TcpProxy(api.hostname or "127.0.0.1", api.port or 80) as proxy:
                proxy.forward()
                outcomes = cut_after_first_create(client, proxy)
                code, out, err = await run_producer(f"http://127.0.0.1:{proxy.port}/",
                                                    partition_id, TOKEN)
        info = await client.partition(partition_id)
        items = await client.items(partition_id, limit=ITEMS, with_data=False)
    assert code == 0, f"exit {code}\n--- stdout:\n{out}\n--- stderr:\n{err}"
    # The first answer was lost: one retry, answered as a replay of the first create.
    assert outcomes == [True, False], err
    assert "producer: create: " in err and "; retrying" in err
    assert f"created {partition_id}, {ITEMS} items (replayed)" in err
    status_line, result_line = out.strip().splitlines()
    assert status_line == f'{partition_id}: complete {{"complete":{ITEMS}}}'
    assert json.loads(result_line) == EXPECTED
    assert info.status == "complete" and info.counts == {"complete": ITEMS}
    assert info.result_json() == EXPECTED
    assert len(items) == ITEMS and {item.status for item in items} == {"complete"}
    assert {item.id for item in items} == {f"n{n}" for n in range(ITEMS)}


async def test_the_node_producer_exits_non_zero_with_the_api_s_reason(
        tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'refused.db'}"
    upgrade(db_url)
    async with AsyncClient(db_url) as client:
        await client.create_partition("numbers", [])
        async with api_running(ApiOptions(parse_database_url(db_url), port=0)) as api_url:
            code, out, err = await run_producer(api_url, "numbers")
    assert code == 1 and out == ""
    assert err.startswith("producer: create: HTTP 409: partition 'numbers' already exists"), err
