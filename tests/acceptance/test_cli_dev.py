"""``processor dev APP`` as a real subprocess, as the tutorial starts it: it serves the
user's handler (the tutorial's ``wordcount.py``) with reload, a processor, the ingest API
and the console; the three URLs it prints answer; a partition created through the API
completes through the handler, and so does the tutorial's client with its output; SIGINT
stops everything with exit 0 and leaves no child process behind."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import time
from pathlib import Path

import httpx

from tests.acceptance.test_docs import TUTORIAL, command_lines, marked_blocks

STARTED = "Ctrl-C stops everything"


def descendants(root: int) -> set[int]:
    """Every live process whose parent chain leads to ``root`` (read from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, or a process gone, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def test_dev_runs_the_handler_api_and_console_until_sigint(tmp_path: Path) -> None:
    blocks = marked_blocks(TUTORIAL)
    (tmp_path / "wordcount.py").write_text(blocks["handler"])
    (tmp_path / "pipeline.py").write_text(blocks["client"])
    [command] = command_lines(blocks["dev"])
    assert command[:3] == ["processor", "dev", "wordcount:app"]
    processor = Path(sys.executable).with_name("processor")
    # Any free ports (the last of a repeated option wins), so tests can run side by side.
    dev = await asyncio.create_subprocess_exec(
        str(processor), *command[1:], "--handler-port", "0", "--api-port", "0",
        "--console-port", "0", cwd=tmp_path, stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert dev.stdout is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(60):
            while not lines or lines[-1] != STARTED:
                line = await dev.stdout.readline()
                assert line, f"processor dev ended early: {lines}"
                lines.append(line.decode().rstrip())
        urls = {line.split()[0]: line.split()[1] for line in lines if re.match(r"\w+ +http", line)}
        assert set(urls) == {"handler", "api", "console"}, lines
        children = descendants(dev.pid)
        assert children, "the handler runs in a child process"
        async with httpx.AsyncClient(timeout=10) as http:
            assert (await http.get(urls["handler"] + "healthz")).status_code == 200
            assert (await http.get(urls["console"])).status_code == 200
            created = await http.put(urls["api"] + "partitions/api-1", json={
                "items": [{"id": "a", "data": "the quick brown fox"},
                          {"id": "b", "data": "jumps over"}],
                "reduce_gates": [1]})
            assert created.status_code == 201, created.text
            done = await http.get(urls["api"] + "partitions/api-1/wait",
                                  params={"timeout": 30}, timeout=40)
            assert done.status_code == 200, done.text
            assert (done.json()["status"], done.json()["result"]) == ("complete",
                                                                      {"words": 6})
        client = await asyncio.create_subprocess_exec(
            sys.executable, "pipeline.py", cwd=tmp_path, stdout=asyncio.subprocess.PIPE)
        out, _ = await asyncio.wait_for(client.communicate(), timeout=60)
        assert out.decode() == blocks["output"]
        dev.send_signal(signal.SIGINT)
        async with asyncio.timeout(30):
            assert await dev.wait() == 0
        # Reaped children are gone at once; a grandchild the group stop reached may take
        # a moment to be reaped by init: wait for it, with a deadline.
        end = time.monotonic() + 10
        left = [pid for pid in children if alive(pid)]
        while left and time.monotonic() < end:  # no event says when init reaps them
            await asyncio.sleep(0.1)
            left = [pid for pid in children if alive(pid)]
        assert left == [], f"children left running: {left}"
    finally:
        await _stop(dev)


async def _stop(dev: asyncio.subprocess.Process) -> None:
    """After a failure: SIGINT, then SIGKILL for ``dev`` and every process under it (the
    handler holds the output pipe: the test would hang on it)."""
    if dev.returncode is not None:
        return
    everyone = descendants(dev.pid)
    dev.send_signal(signal.SIGINT)
    try:
        await asyncio.wait_for(dev.wait(), 30)
    except TimeoutError:
        for pid in everyone | {dev.pid}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await dev.wait()
