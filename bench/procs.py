"""Subprocesses the scenarios run: the minimal handler and ``processor run``.

Output goes to files, never pipes, so a stopped or killed process can never
block on a full pipe. :class:`Processes` kills whatever is still running when
its ``async with`` block ends, however it ends; a process started in a group
of its own (``group=True``, for one that forks workers, such as a Celery
prefork worker) is killed with its whole group. On Linux the kernel also kills
every one of them when the benchmark itself dies, even by kill -9 (a test's
timeout): nothing outlives a run.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.common import PROCESSOR, PYTHON, REPO, cpu_seconds

STARTUP_TIMEOUT = 20.0
STOP_TIMEOUT = 20.0
PR_SET_PDEATHSIG = 1  # prctl(2)


def _parent_death_signal() -> Callable[[], None] | None:
    """What a child runs before its program (Linux) to be sent SIGKILL when its parent
    dies; ``None`` where ``prctl`` is missing (the child then lives on, and
    :class:`Processes` still kills it on every exit of its ``async with`` block).

    ``prctl`` is looked up here, in the parent: between fork and exec the child
    only calls it.
    """
    if sys.platform != "linux":
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def die_with_parent() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    return die_with_parent


DIE_WITH_PARENT = _parent_death_signal()


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
    group: bool = False  # the leader of a process group of its own: signals go to the group

    @property
    def running(self) -> bool:
        """Whether it has not exited yet."""
        return self.process.returncode is None

    def log(self) -> str:
        """What it wrote on stdout and stderr so far."""
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """kill -9 (the whole group, even after its leader exited, for a group leader)."""
        if self.group:
            # Forked workers may outlive their leader; the group id is the leader's pid.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
        elif self.running:
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
                code = await self.process.wait()
        except TimeoutError:
            self.kill()
            return await self.process.wait()
        if self.group:
            self.kill()  # whatever the leader left behind
        return code


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

    async def start(self, name: str, *command: str, env: dict[str, str] | None = None,
                    group: bool = False) -> Child:
        """Start ``command`` with its output in ``<work_dir>/<name>.log``; with ``group``,
        in a session (and process group) of its own."""
        log_path = self.work_dir / f"{name}.log"
        with log_path.open("wb") as out:
            process = await asyncio.create_subprocess_exec(
                *command, stdout=out, stderr=subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL, cwd=REPO, env=env, start_new_session=group,
                preexec_fn=DIE_WITH_PARENT)
        child = Child(name, process, log_path, group=group)
        self.children.append(child)
        return child

    async def handler(self, name: str = "handler", module: str = "bench.handler_app"
                      ) -> Handler:
        """Start a handler (by default the minimal one, :mod:`bench.handler_app`; any module
        run as ``python -m <module> --port N`` that answers ``GET /healthz``) and wait
        until it answers."""
        port = free_port()
        child = await self.start(name, PYTHON, "-m", module, "--port", str(port))
        handler = Handler(child, f"http://127.0.0.1:{port}")
        await handler.wait_ready()
        return handler

    async def processor(self, name: str, *, handler_url: str | None, db_url: str, prefix: str,
                        args: tuple[str, ...] = ()) -> Child:
        """Start ``processor run`` (no health port, warnings only) with extra ``args``;
        without ``handler_url``, ``args`` name the handlers (``--routes FILE``)."""
        target = ("--handler-url", handler_url) if handler_url is not None else ()
        return await self.start(
            name, PROCESSOR, "run", *target, "--db-url", db_url,
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
