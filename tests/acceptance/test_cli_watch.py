"""``processor watch`` as a subprocess, following a partition a real watcher runs through a
real HTTP handler, over the ingest API on a real uvicorn: its progress and result
line, its exit status, a resume across an API restart, the token, and Ctrl-C."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from processor import NewItem
from processor.api.server import ApiOptions, api_running
from processor.feed.hub import FeedHub, FeedSettings
from tests.acceptance.harness.processes import PROCESSOR
from tests.support.engine import wait_until
from tests.support.feed import LAST_GATE, system
from tests.support.servers import free_port
from watcher.store.db.urls import parse_database_url

FAST = FeedSettings(poll_interval=0.05, heartbeat=1.0)
TOKEN = "a-token-of-32-characters-at-least"


class Watching:
    """``processor watch`` running, its output in files."""

    def __init__(self, tmp_path: Path, partition: str, api_url: str, *extra: str) -> None:
        self.out, self.err = tmp_path / f"{partition}.out", tmp_path / f"{partition}.err"
        self.args = (PROCESSOR, "watch", partition, "--api-url", api_url, "--interval", "100",
                     *extra)
        self.process: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Watching:
        env = {name: value for name, value in os.environ.items()
               if not name.startswith("PROCESSOR_")}
        with self.out.open("wb") as stdout, self.err.open("wb") as stderr:
            self.process = await asyncio.create_subprocess_exec(
                *self.args, stdout=stdout, stderr=stderr, stdin=asyncio.subprocess.DEVNULL,
                env={**env, "COLUMNS": "100", "TTY_COMPATIBLE": "0"})
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.process is not None
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()

    def shown(self) -> str:
        return self.out.read_text(errors="replace")

    async def code(self) -> int:
        assert self.process is not None
        async with asyncio.timeout(30):
            return await self.process.wait()


async def test_watch_shows_each_gate_and_exits_by_the_end(db_url, table_prefix,
                                                           tmp_path) -> None:
    hub = FeedHub(FAST)
    async with system(db_url, table_prefix, hub) as (url, handler, client):
        await client.create_partition("good", [NewItem(f"i{n}", b"{}") for n in range(4)])
        await client.create_partition("bad", [NewItem("bad", b"{}")])
        async with Watching(tmp_path, "good", url) as good:
            await wait_until(lambda: "following partition 'good'" in good.shown(),
                             timeout=30, message="the watch began")
            for gate in range(LAST_GATE):
                handler.open(gate)
                await wait_until(lambda gate=gate: f"gate {gate} -> gate {gate + 1}"
                                 in good.shown(), timeout=30, message=f"move to {gate + 1}")
            handler.open(LAST_GATE)
            assert await good.code() == 0, good.err.read_text()
        shown = good.shown()
        assert shown.count("gate 0 -> gate 1") == 1 and shown.count("gate 1 -> gate 2") == 1
        assert "partition 'good' is complete at gate 2 (items: complete 4)" in shown
        assert "gate 2" in shown and "4/4" in shown, "the last gate's bar is full"
        async with Watching(tmp_path, "bad", url) as bad:
            assert await bad.code() == 4
        assert "partition 'bad' failed at gate 2" in bad.shown()
        async with Watching(tmp_path, "absent", url) as absent:
            assert await absent.code() == 2
        assert "does not exist" in absent.err.read_text()


async def test_watch_resumes_across_an_api_restart(db_url, table_prefix, tmp_path) -> None:
    hub = FeedHub(FAST)
    port = free_port()
    options = ApiOptions(parse_database_url(db_url), table_prefix, port=port)
    async with system(db_url, table_prefix, hub) as (_, handler, client):
        await client.create_partition("job", [NewItem(f"i{n}", b"{}") for n in range(3)])
        api = f"http://127.0.0.1:{port}/"
        async with Watching(tmp_path, "job", api) as watching:
            async with api_running(options, client, FeedHub(FAST)):
                await wait_until(lambda: "following partition 'job'" in watching.shown(),
                                 timeout=30, message="the watch began")
                handler.open(0)
                await wait_until(lambda: "gate 0 -> gate 1" in watching.shown(), timeout=30,
                                 message="the first move")
            # The API is down (its streams were ended): the watch retries, and gate 1
            # passes meanwhile.
            handler.open(1)
            await wait_until(lambda: "reconnecting" in watching.shown(), timeout=30,
                             message="a retry")
            await wait_until(lambda: _gate(client, "job", LAST_GATE), timeout=30,
                             message="gate 2")
            async with api_running(options, client, FeedHub(FAST)):
                await wait_until(lambda: "gate 1 -> gate 2" in watching.shown(), timeout=30,
                                 message="the move made while the API was down")
                handler.open(LAST_GATE)
                assert await watching.code() == 0, watching.err.read_text()
        shown = watching.shown()
        assert shown.count("gate 0 -> gate 1") == 1, shown
        assert shown.count("-> gate 2") == 1, shown
        assert "partition 'job' is complete" in shown


async def _gate(client, partition: str, gate: int) -> bool:
    return (await client.partition(partition)).gate == gate


async def test_watch_sends_the_token_and_stops_at_ctrl_c(db_url, table_prefix,
                                                          tmp_path) -> None:
    hub = FeedHub(FAST)
    async with system(db_url, table_prefix, hub, token=TOKEN) as (url, _handler, client):
        await client.create_partition("held", [NewItem("a", b"{}")])
        async with Watching(tmp_path, "held", url) as refused:
            assert await refused.code() == 2
        assert "token" in refused.err.read_text()
        async with Watching(tmp_path, "held", url, "--token", TOKEN) as watching:
            await wait_until(lambda: "following partition 'held'" in watching.shown(),
                             timeout=30, message="the watch began")
            assert watching.process is not None
            watching.process.send_signal(signal.SIGINT)
            assert await watching.code() == 130
        assert "stopped following partition 'held'" in watching.err.read_text()
        await wait_until(lambda: hub.subscribers == 0, message="its stream closed")
