"""``processor demo``: the resume pipeline end to end, on a throwaway SQLite database.

It serves the example handler (``handlers/examples/resumes.py``) as two services
under uvicorn on loopback, one a gate (``steps_app``: unpack, extract, classify;
``rank_app``: the rank reduce), runs a watcher that routes each gate to its service
(routes as a routes file gives them, pipeline ``resumes``), and inserts one partition
of one item: an inbox, a zip of resumes (two of them unreadable scans). At gate 0 the
inbox unpacks itself by spawning one item per resume, and each resume is
extracted and classified (the fan-out); gate 1 (rank, a reduce gate) fans in.
It shows progress per gate meanwhile and prints the top candidates from the
partition's result, which the reduce stored. The partition carries on without the unreadable resumes
(``on_item_failure="continue"``), so they are listed as failures instead of
stopping the ranking.

With a console port, the web console serves the demo's database from before the
partition is created (a few seconds before, so a browser can be opened on it)
until Ctrl-C after the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from processor.cli.terminal import SafeConsole
from processor.client.async_client import AsyncClient
from processor.console.server import ConsoleOptions, console_running
from processor.embedded import EmbeddedServer
from processor.http.config import HttpProcessorConfig
from processor.http.routed import RoutedHttpProcessor
from processor.http.routes import Routes, parse_routes
from watcher.config import WatcherConfig
from watcher.records import NewItem, PartitionInfo
from watcher.store import Store
from watcher.store.db.migrate import upgrade
from watcher.store.db.urls import parse_database_url
from watcher.watcher import Watcher

PARTITION = "opening-42"
DEMO_TIMEOUT = 60.0
REFRESH = 0.1
GATE_NAMES = {0: "unpack (spawn) + extract + classify", 1: "rank (reduce: fan-in)"}
INBOX = "inbox"
PIPELINE = "resumes"
# Each gate to a service of its own, as `processor run --routes FILE` reads it.
ROUTES = """
[[pipeline]]
name = "resumes"

[[pipeline.route]]
gate = 0
url = "{steps}/"

[[pipeline.route]]
gate = 1
url = "{rank}/"
"""
UNREADABLE = 2
# With the console: how long the demo waits before creating its partition, so that a
# browser opened on the printed address sees the partition from its start.
CONSOLE_HEAD_START = 3.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _progress(client: AsyncClient, info: PartitionInfo, elapsed: float) -> Table:
    """A table of progress per gate, counted over the items a page at a time."""
    table = Table(title=f"partition {PARTITION}: {elapsed:4.1f} s")
    for column in ("gate", "step", "waiting", "done"):
        table.add_column(column)
    total = failed = 0
    first_error = ""
    waiting: Counter[int] = Counter()
    passed: Counter[int] = Counter()
    async for item in client.iter_items(PARTITION, with_data=False):
        total += 1
        for gate in GATE_NAMES:
            waiting[gate] += item.status == "available" and item.gate == gate
            passed[gate] += item.gate > gate or item.status == "complete"
        if item.status == "failed":
            failed += 1
            first_error = first_error or item.last_error or ""
    for gate, name in GATE_NAMES.items():
        if gate == info.gate and info.reduce is not None and info.status == "available":
            name += " - reducing"
        if gate == 0:
            name += f" - {info.spawned} spawned"
        table.add_row(str(gate), name, str(waiting[gate]), f"{passed[gate]}/{total}")
    if failed:
        table.add_row("-", "failed (skipped)", str(failed), escape(first_error))
    return table


@contextlib.asynccontextmanager
async def _serving(app: Any, port: int) -> AsyncIterator[str]:
    server = EmbeddedServer(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", access_log=False,
                                           lifespan="off"))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait({task}, timeout=5)


def demo_routes(steps_url: str, rank_url: str) -> Routes:
    """The demo's routes: pipeline ``resumes``, gate 0 to the steps service and gate 1
    (its rank reduce) to the rank service, as a routes file would say.

    Raises:
        RoutesError: never for two loopback URLs (the text is the demo's own).
    """
    return parse_routes(ROUTES.format(steps=steps_url, rank=rank_url), source="the demo")


async def run_demo(*, resumes: int = 36, top: int = 5, console: Console | None = None,
                   console_port: int | None = None) -> int:
    """Run the pipeline; returns the exit code (0 when the partition completes).

    With ``console_port`` (0: any free port) the web console serves the demo's
    database on 127.0.0.1 from before the partition is created, and stays open after
    the run until SIGINT or SIGTERM.

    Raises:
        ConfigError: the console's port cannot be bound.
    """
    logging.basicConfig(level=logging.WARNING)
    # The two unreadable resumes fail on purpose, and the demo lists them itself: their
    # item_failed WARNING lines would say it twice.
    logging.getLogger("watcher.dispatch.failures").setLevel(logging.ERROR)
    async with contextlib.AsyncExitStack() as stack:
        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="statefeed-demo-"))
        db_url = f"sqlite:///{Path(folder) / 'demo.db'}"
        await asyncio.to_thread(upgrade, db_url)
        # Markup for the demo's own lines; data is escaped (markup and control characters).
        console = console or SafeConsole(markup=True)
        web = None
        if console_port is not None:
            web = await stack.enter_async_context(console_running(ConsoleOptions(
                db_url=parse_database_url(db_url), port=console_port)))
            console.print(f"[bold]console[/]: {web} (the demo starts in "
                          f"{CONSOLE_HEAD_START:g} s: open it now)", markup=True,
                          highlight=False)
            await asyncio.sleep(CONSOLE_HEAD_START)
        code = await _run_pipeline(db_url, resumes=resumes, top=top, console=console)
        if web is not None:
            console.print(f"[bold]console[/]: {web} stays open on the demo's database; "
                          "Ctrl-C stops it", highlight=False)
            await _until_stopped()
        return code


async def _until_stopped() -> None:
    """Wait for SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


async def _run_pipeline(db_url: str, *, resumes: int, top: int, console: Console) -> int:
    """Rank ``resumes`` resumes on ``db_url`` and print the best ``top``; the exit code."""
    from handlers.examples.resumes import inbox_archive
    from handlers.examples.samples import sample_resumes

    console.print(f"[bold]statefeed demo[/]: one inbox of {resumes} resumes -> gate 0 "
                  f"unpack (spawn) + extract + classify -> gate 1 rank, on {escape(db_url)}")
    from handlers.examples.resumes import rank_app, steps_app

    async with _serving(steps_app, _free_port()) as steps_url, \
            _serving(rank_app, _free_port()) as rank_url, AsyncClient(db_url) as client:
        console.print(f"two services: gate 0 -> {steps_url}/ (unpack, extract, classify), "
                      f"gate 1 -> {rank_url}/reduce (rank)", highlight=False)
        routes = demo_routes(steps_url, rank_url)
        store = Store.open(db_url)
        http = RoutedHttpProcessor(routes, HttpProcessorConfig(handler_url=f"{steps_url}/"))
        watcher = Watcher(store, http, WatcherConfig(
            owner_id="demo", concurrency=16, poll_interval=0.05, lease_duration=5.0,
            pipelines=routes.served()))
        running = asyncio.create_task(watcher.run())
        started = time.monotonic()
        try:
            documents = sample_resumes(resumes, seed=42,
                                       unreadable=min(UNREADABLE, resumes))
            # One item: the fan-out (one item per resume) is the inbox's own step.
            await client.create_partition(
                PARTITION, [NewItem(INBOX, inbox_archive(documents))],
                reduce_gates=[1], on_item_failure="continue", pipeline=PIPELINE)
            watcher.wake()
            info = await client.partition(PARTITION)
            with Live(console=console, refresh_per_second=10, transient=False) as live:
                while info.status == "available" and (
                        time.monotonic() - started < DEMO_TIMEOUT):
                    live.update(await _progress(client, info, time.monotonic() - started))
                    await asyncio.sleep(REFRESH)
                    info = await client.partition(PARTITION)
                live.update(await _progress(client, info, time.monotonic() - started))
        finally:
            await watcher.stop()
            await running
            await http.aclose()
            await store.close()
    elapsed = time.monotonic() - started
    if info.status != "complete":
        console.print(f"[red]partition {PARTITION} ended {info.status} after "
                      f"{elapsed:.1f} s[/] (items: {info.counts})")
        return 1
    ranking = info.result_json()
    if not isinstance(ranking, dict):  # the reduce never ran: no resume reached gate 1
        console.print(f"[red]partition {PARTITION} completed without a ranking[/] "
                      f"(items: {info.counts})")
        return 1
    best = ranking["top"][:top]
    table = Table(title=f"top {len(best)} candidates (from the partition's result)")
    console.line()  # the title apart from the progress table's last border
    columns = ["rank", "name", "role", "years", "score", "tier", "skills"]
    for column in columns:
        table.add_column(column)
    for row in best:
        table.add_row(*(escape(_cell(row[column])) for column in columns))
    console.print(table)
    for failure in ranking["failed"]:
        # The stored error starts with the partition, item, gate and attempt; the line
        # names the resume once and shows what went wrong. Data (ids, a handler's error
        # text) is escaped: Rich would read "[...]" as markup.
        error = str(failure["error"] or "")
        if error.startswith("partition ") and "): " in error:
            error = error.split("): ", 1)[1]
        console.print(f"[yellow]skipped[/] {escape(str(failure['id']))}: {escape(error)}")
    console.print(f"[green]complete[/]: the inbox spawned {info.spawned} resumes; "
                  f"{ranking['ranked']} resumes ranked, {ranking['failed_count']} "
                  f"unreadable, in {elapsed:.2f} s")
    return 0


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    return str(value)
