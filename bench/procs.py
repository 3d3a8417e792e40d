"""Subprocesses the scenarios run: the minimal handler and ``processor run``.

Output goes to files, never pipes, so a stopped or killed process can never
block on a full pipe. :class:`Processes` kills whatever is still running when
its ``async with`` block ends, however it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.common import PROCESSOR, PYTHON, REPO, cpu_seconds

STARTUP_TIMEOUT = 20.0
STOP_TIMEOUT = 20.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Child:
    """One subprocess with its output files."""

    name: str
    process: asyncio.subprocess.Process
    log_path: Path
    stopping: bool = False

    @property
    def running(self) -> bool:
        """Whether it has not exited yet."""
        return self.process.returncode is None

    def log(self) -> str:
        """What it wrote on stdout and stderr so far."""
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """kill -9."""
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGKILL)

    def stop(self) -> None:
        """Send SIGTERM (a graceful stop) once, without waiting."""
        if self.running and not self.stopping:
            self.stopping = True
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)

    async def terminate(self, timeout: float = STOP_TIMEOUT) -> int:  # noqa: ASYNC109
        """SIGTERM, wait for the exit (kill -9 after ``timeout`` s); returns the exit code."""
        self.stop()
        try:
            async with asyncio.timeout(timeout):
                return await self.process.wait()
        except TimeoutError:
            self.kill()
            return await self.process.wait()


class Processes:
    """Starts subprocesses and kills every one still running on exit."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.children: list[Child] = []

    async def __aenter__(self) -> Processes:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for child in self.children:
            child.kill()
        for child in self.children:
            with contextlib.suppress(ProcessLookupError):
                await child.process.wait()

    async def start(self, name: str, *command: str, env: dict[str, str] | None = None
                    ) -> Child:
        """Start ``command`` with its output in ``<work_dir>/<name>.log``."""
        log_path = self.work_dir / f"{name}.log"
        with log_path.open("wb") as out:
            process = await asyncio.create_subprocess_exec(
                *command, stdout=out, stderr=subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL, cwd=REPO, env=env)
        child = Child(name, process, log_path)
        self.children.append(child)
        return child

    async def handler(self, name: str = "handler") -> Handler:
        """Start the minimal handler (:mod:`bench.handler_app`) and wait until it answers."""
        port = free_port()
        child = await self.start(name, PYTHON, "-m", "bench.handler_app", "--port", str(port))
        handler = Handler(child, f"http://127.0.0.1:{port}")
        await handler.wait_ready()
        return handler

    async def processor(self, name: str, *, handler_url: str, db_url: str, prefix: str,
                        args: tuple[str, ...] = ()) -> Child:
        """Start ``processor run`` (no health port, warnings only) with extra ``args``."""
        return await self.start(
            name, PROCESSOR, "run", "--handler-url", handler_url, "--db-url", db_url,
            "--table-prefix", prefix, "--owner-id", name, "--health-port", "0",
            "--log-level", "warning", *args)


class Handler:
    """The running minimal handler: its URL and its counters."""

    def __init__(self, child: Child, url: str) -> None:
        self.child = child
        self.url = url

    async def wait_ready(self) -> None:
        """Wait until ``GET /healthz`` answers. Raises RuntimeError if it exits or stalls."""
        deadline = time.monotonic() + STARTUP_TIMEOUT
        async with httpx.AsyncClient(timeout=2) as http:
            while True:
                if not self.child.running:
                    raise RuntimeError(f"the handler exited:\n{self.child.log()[-2000:]}")
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get(f"{self.url}/healthz")).status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the handler did not answer within {STARTUP_TIMEOUT} s")
                await asyncio.sleep(0.05)

    def cpu_seconds(self) -> float:
        """CPU time the handler process has used so far."""
        return cpu_seconds(self.child.process.pid)

    async def reset(self) -> None:
        """Zero its counters."""
        async with httpx.AsyncClient(timeout=5) as http:
            (await http.post(f"{self.url}/reset")).raise_for_status()

    async def stats(self) -> dict[str, Any]:
        """Items and requests answered since the reset, first arrival and last answer."""
        async with httpx.AsyncClient(timeout=5) as http:
            response = await http.get(f"{self.url}/stats")
            response.raise_for_status()
            return json.loads(response.content)


async def processor_help() -> str:
    """The text of ``processor run --help``, to see which options this build has."""
    process = await asyncio.create_subprocess_exec(
        PROCESSOR, "run", "--help", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL, cwd=REPO,
        env={**os.environ, "COLUMNS": "200"})
    try:
        async with asyncio.timeout(STARTUP_TIMEOUT):
            output, _ = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return output.decode(errors="replace")
