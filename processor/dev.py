"""``processor dev APP``: everything a handler's author needs, in one command.

A database (a throwaway SQLite file, or the one given), the handler app served by
uvicorn with reload on change (``APP`` an import string such as ``wordcount:app``, as
uvicorn takes it), a processor calling it, the ingest API and the web console, all on
loopback. The handler runs as a child process in a session of its own (uvicorn's
reloader restarts its worker on every change); the processor, the API and the console
run in this process, as ``processor demo`` runs its pieces (:mod:`processor.embedded`,
:func:`processor.api.server.api_running`, :func:`processor.console.server.console_running`).
SIGINT (Ctrl-C) or SIGTERM stops everything: the processor, the API and the console
here, then the handler's whole process group, so that no child outlives the command.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from processor.api.server import ApiOptions, api_running
from processor.console.server import ConsoleOptions, console_running
from processor.embedded import stop_on_signals
from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from watcher.config import WatcherConfig
from watcher.errors import ConfigError
from watcher.store import Store
from watcher.store.db.migrate import upgrade
from watcher.store.db.urls import parse_database_url
from watcher.watcher import Watcher

log = logging.getLogger(__name__)

# How long the handler's server may take to answer its first request.
HANDLER_START_TIMEOUT = 30.0
# How long the handler's process group has to stop on SIGTERM before it is killed.
HANDLER_STOP_TIMEOUT = 5.0
# A quick loop for one machine: new partitions are taken within this many seconds.
DEV_POLL_INTERVAL = 0.2


@dataclass(frozen=True, slots=True)
class DevOptions:
    """What ``processor dev`` runs: the handler ``app`` (an import string) from
    ``app_dir``, the database (``None``: a throwaway SQLite file), and the ports on
    127.0.0.1 (0: any free port)."""

    app: str
    app_dir: Path
    db_url: str | None = None
    handler_port: int = 8000
    api_port: int = 8091
    console_port: int = 8090
    reload: bool = True

    def __post_init__(self) -> None:
        """Raises:
            ConfigError: ``app`` is not ``module:attribute``, or a port is not from 0 to
                65535.
        """
        module, _, attribute = self.app.partition(":")
        if not module or not attribute:
            raise ConfigError(f"APP must be an import string such as wordcount:app (module, "
                              f"a colon, the ASGI app's name), got {self.app!r}")
        for name in ("handler_port", "api_port", "console_port"):
            port = getattr(self, name)
            if not 0 <= port <= 65535:
                raise ConfigError(f"--{name.replace('_', '-')} must be from 0 to 65535, "
                                  f"got {port}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def handler_command(options: DevOptions, port: int) -> list[str]:
    """The command that serves the handler app: uvicorn, reloading on changes to the
    app's folder (and with it, on loopback only)."""
    command = [sys.executable, "-m", "uvicorn", options.app, "--host", "127.0.0.1",
               "--port", str(port), "--app-dir", str(options.app_dir),
               "--log-level", "warning"]
    if options.reload:
        command += ["--reload", "--reload-dir", str(options.app_dir)]
    return command


@contextlib.asynccontextmanager
async def handler_running(options: DevOptions) -> AsyncIterator[str]:
    """Serve the handler app in a child process (a session of its own) for the block;
    yields its URL once it answers. Its whole process group is stopped at the end
    (SIGTERM, then SIGKILL after :data:`HANDLER_STOP_TIMEOUT`).

    Raises:
        ConfigError: the app's server exited before it answered (its output says why:
            an import error, a port in use), or did not answer within
            :data:`HANDLER_START_TIMEOUT` seconds.
    """
    port = options.handler_port or free_port()
    url = f"http://127.0.0.1:{port}"
    child = await asyncio.create_subprocess_exec(*handler_command(options, port),
                                                 cwd=options.app_dir, start_new_session=True)
    try:
        await _until_answering(child, url, options.app)
        yield url
    finally:
        await stop_group(child)


async def _until_answering(child: asyncio.subprocess.Process, url: str, app: str) -> None:
    """Wait until the handler's server answers any HTTP request.

    Raises:
        ConfigError: it exited first, or did not answer in time.
    """
    deadline = time.monotonic() + HANDLER_START_TIMEOUT
    async with httpx.AsyncClient(timeout=1.0) as http:
        while True:
            if child.returncode is not None:
                raise ConfigError(f"the handler app {app!r} did not start: uvicorn exited "
                                  f"with code {child.returncode} (its output above says "
                                  "why)")
            try:
                await http.get(f"{url}/healthz")
                return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise ConfigError(f"the handler app {app!r} did not answer on {url} within "
                                  f"{HANDLER_START_TIMEOUT:g} s")
            await asyncio.sleep(0.1)


async def stop_group(child: asyncio.subprocess.Process) -> None:
    """Stop ``child``'s process group (uvicorn's reloader and its worker): SIGTERM, then
    SIGKILL for what is left after :data:`HANDLER_STOP_TIMEOUT`; returns once the
    child is reaped and no process of its group is left (or after the SIGKILL's grace)."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signum)
        end = time.monotonic() + HANDLER_STOP_TIMEOUT
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(child.wait(), HANDLER_STOP_TIMEOUT)
        # The reloader is reaped; its worker may still be stopping in the same group.
        while time.monotonic() < end:  # no event tells when a group empties: look again
            if not _group_alive(child.pid):
                break
            await asyncio.sleep(0.05)
        if child.returncode is not None and not _group_alive(child.pid):
            return


def _group_alive(group: int) -> bool:
    """Whether any process of process group ``group`` is left."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def run_dev(options: DevOptions, announce: Callable[[str], None]) -> int:
    """Run everything until SIGINT or SIGTERM; returns the exit status (0).

    Raises:
        ConfigError: the handler did not start, or an address cannot be bound.
        DatabaseError: the database given does not answer.
    """
    stop = stop_on_signals()
    async with contextlib.AsyncExitStack() as stack:
        raw = options.db_url
        if raw is None:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="statefeed-dev-"))
            raw = f"sqlite:///{Path(folder) / 'dev.db'}"
        db_url = parse_database_url(raw)
        await asyncio.to_thread(upgrade, raw)
        handler = await stack.enter_async_context(handler_running(options))
        api = await stack.enter_async_context(api_running(ApiOptions(
            db_url=db_url, host="127.0.0.1", port=options.api_port)))
        console = await stack.enter_async_context(console_running(ConsoleOptions(
            db_url=db_url, host="127.0.0.1", port=options.console_port)))
        store = Store.open(db_url)
        stack.push_async_callback(store.close)
        http = HttpProcessor(HttpProcessorConfig(handler_url=f"{handler}/"))
        stack.push_async_callback(http.aclose)
        watcher = Watcher(store, http, WatcherConfig(owner_id="dev",
                                                     poll_interval=DEV_POLL_INTERVAL,
                                                     retry_backoff=0.5))
        running = asyncio.create_task(watcher.run())
        announce(f"handler  {handler}/  ({options.app}"
                 f"{', reloads on change' if options.reload else ''})")
        announce(f"api      {api}v1/")
        announce(f"console  {console}")
        announce(f"database {db_url.redacted()}")
        announce("Ctrl-C stops everything")
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            await watcher.stop()
            await running
    return 0
