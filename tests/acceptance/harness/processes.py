"""The ``processor`` command as a subprocess: one-shot runs, and long-running
``processor run`` processes a test can stop, kill -9, pause and resume.

A long-running process writes its output to files, never to pipes, so a
stopped or killed process (or one nobody reads) can never block on a full pipe.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.engine import wait_until
from tests.support.forked_cli import as_text, run_processor

PROCESSOR = str(Path(sys.executable).with_name("processor"))

LEASE = 2.0
POLL = 0.1
# Deadlines for a process to start (log a line, answer) and to stop after SIGTERM. They
# bound a wait, they assert no speed: a machine whose cores are busy with other work
# takes many times longer than an idle one to start Python and import the service.
START_DEADLINE = 90.0
STOP_DEADLINE = 60.0
# Fast settings for every processor a cluster starts, unless a test overrides them.
FAST = ("--poll-interval", str(POLL), "--lease-duration", str(LEASE), "--retry-backoff", "0.05",
        "--max-retries", "8", "--shutdown-timeout", "5", "--concurrency", "16")


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60
            ) -> subprocess.CompletedProcess[str]:
    """Run ``processor *args`` to completion with its output captured, and an empty
    stdin (forked from a server that imported the command once: :mod:`tests.support.forked_cli`).

    Raises:
        subprocess.TimeoutExpired: it ran longer than ``timeout`` seconds.
    """
    return as_text(run_processor(args, env={**os.environ, **(env or {})}, timeout=timeout))


def warning_lines(log: str) -> list[str]:
    """The WARNING lines of a processor's log."""
    return [line for line in log.splitlines() if " WARNING " in line]


@dataclass
class Processor:
    """One ``processor`` subprocess."""

    owner: str
    process: asyncio.subprocess.Process
    stdout_path: Path
    stderr_path: Path
    health_port: int
    started_at: float = field(default_factory=time.monotonic)
    paused: bool = False

    @property
    def pid(self) -> int:
        """The process id."""
        return self.process.pid

    @property
    def running(self) -> bool:
        """Whether the process has not exited (a paused process is running)."""
        return self.process.returncode is None

    def stderr(self) -> str:
        """Everything the process wrote on stderr so far."""
        return self.stderr_path.read_text(errors="replace")

    def output(self) -> str:
        """stdout and stderr so far."""
        return self.stdout_path.read_text(errors="replace") + self.stderr()

    def kill(self) -> None:
        """kill -9: no graceful stop, leases are left to expire."""
        if self.running:
            self.process.send_signal(signal.SIGKILL)

    def pause(self) -> None:
        """SIGSTOP: the process freezes with everything it holds."""
        self.process.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT."""
        self.process.send_signal(signal.SIGCONT)
        self.paused = False

    async def wait(self, timeout: float) -> int:  # noqa: ASYNC109
        """Wait for the exit; returns the code.

        Raises:
            AssertionError: it did not exit within ``timeout`` seconds (with its log).
        """
        try:
            async with asyncio.timeout(timeout):
                return await self.process.wait()
        except TimeoutError:
            raise AssertionError(f"processor {self.owner} did not exit within {timeout} s:\n"
                                 f"{self.stderr()[-3000:]}") from None

    async def terminate(self, timeout: float = STOP_DEADLINE) -> int:  # noqa: ASYNC109
        """SIGTERM (resuming a paused process first) and wait for the exit; returns the code.

        Raises:
            AssertionError: it did not exit within ``timeout`` seconds.
        """
        if self.running:
            if self.paused:
                self.resume()
            self.process.send_signal(signal.SIGTERM)
        return await self.wait(timeout)

    async def wait_log(self, fragment: str, timeout: float = START_DEADLINE  # noqa: ASYNC109
                       ) -> str:
        """Wait until stderr contains ``fragment``; return the first line holding it.

        Raises:
            AssertionError: the process exited first, or the deadline passed (with its log).
        """
        def found() -> str | None:
            for line in self.stderr().splitlines():
                if fragment in line:
                    return line
            if not self.running:
                raise AssertionError(f"processor {self.owner} exited "
                                     f"({self.process.returncode}) before logging {fragment!r}:"
                                     f"\n{self.stderr()[-3000:]}")
            return None
        try:
            return await wait_until(found, timeout=timeout, message=f"{self.owner}: {fragment}")
        except AssertionError as error:
            raise AssertionError(f"{error}; its log:\n{self.stderr()[-3000:]}") from None

    async def get(self, path: str) -> httpx.Response:
        """GET from the health port.

        Raises:
            httpx.TransportError: nobody answers on the port.
        """
        assert self.health_port, f"processor {self.owner} runs without a health port"
        async with httpx.AsyncClient(timeout=5) as http:
            return await http.get(f"http://127.0.0.1:{self.health_port}{path}")

    async def answer(self, path: str) -> httpx.Response | None:
        """GET from the health port, or ``None`` while nobody answers there."""
        try:
            return await self.get(path)
        except httpx.TransportError:
            return None

    async def metrics(self) -> dict[str, float]:
        """The Prometheus samples, keyed by name with labels (``x_total{outcome="ok"}``).

        Raises:
            AssertionError: /metrics did not answer 200 (with what it answered).
        """
        answer = await self.get("/metrics")
        assert answer.status_code == 200, f"/metrics answered {answer.status_code}: " \
            f"{answer.text[:500]}"
        samples: dict[str, float] = {}
        for line in answer.text.splitlines():
            if line and not line.startswith("#"):
                # name{labels} value [timestamp]: a label's value may hold spaces, so the
                # value is the first word after the labels' closing brace.
                end = line.rindex("}") + 1 if "}" in line else line.index(" ")
                samples[line[:end]] = float(line[end:].split()[0])
        return samples


async def spawn(owner: str, args: list[str], directory: Path, *, health_port: int = 0,
                env: dict[str, str] | None = None) -> Processor:
    """Start ``processor *args`` in the background, its output in ``directory/<owner>.out``
    and ``.err``; ``health_port`` is where it serves /healthz, if anywhere.
    """
    stdout_path = directory / f"{owner}.out"
    stderr_path = directory / f"{owner}.err"
    with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
        process = await asyncio.create_subprocess_exec(
            PROCESSOR, *args, stdout=out, stderr=err, stdin=asyncio.subprocess.DEVNULL,
            env={**os.environ, **(env or {})})
    return Processor(owner, process, stdout_path, stderr_path, health_port)
