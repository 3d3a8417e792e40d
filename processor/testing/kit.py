"""The test kit: a handler app, served on loopback in this event loop, driven by a real
engine (a :class:`~watcher.Watcher` with the service's HTTP processor) on a throwaway
SQLite database whose clock the test holds.

The store's statements take the time from a :class:`~watcher.store.db.clock.FixedClock`
shared by the engine and the kit's client, so everything the database times (waits'
deadlines, heartbeats, ``not_before``, ``start_at``, snoozes, retries' backoffs, leases)
moves only when the test moves it (:meth:`HandlerKit.advance`). The engine runs only
while a ``run_*`` call drives a partition; it stops, letting its leases go, before the
call returns, so the clock never jumps under a lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

from processor.client.async_client import AsyncClient
from processor.embedded import listen, serving
from processor.handler_check import Finding
from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from processor.testing.calls import CallsTwice, CountedProcessor
from processor.testing.database import fresh_database
from processor.testing.progress import Snapshot, describe, idle
from processor.wire.completions import read_completion
from watcher.config import WatcherConfig
from watcher.errors import StatefeedError
from watcher.records import ItemInfo, NewItem, PartitionInfo
from watcher.store import Store
from watcher.store.db.clock import FixedClock
from watcher.store.waits import CompletedWait
from watcher.watcher import Watcher

# The engine's settings in the kit. Retries' backoffs are stored times (the database
# clock: the kit moves it past them), but a reduce's retry and the outage probe wait on
# this host's clock: short, so they cost no noticeable wall time either.
KIT_CONFIG: dict[str, Any] = {"owner_id": "testkit", "poll_interval": 0.05,
                              "lease_duration": 10.0, "retry_backoff": 0.05,
                              "retry_backoff_max": 0.2, "result_linger": 0.0,
                              "shutdown_timeout": 5.0}
# How long a run_* call drives a partition, at most, unless told (wall seconds).
DEFAULT_TIMEOUT = 10.0
# How long a partition with due items may see nothing happen (no call, no write) before
# the kit says so (a handler's Retry-After, a pause, a flow limit hold them).
DEFAULT_QUIET = 2.0
# How often the kit reads the partition while the engine drives it.
POLL = 0.02


class KitError(StatefeedError, AssertionError):
    """A test kit's run did not get where it was asked to; the message says where the
    partition stopped. An ``AssertionError``, so pytest shows it as a failed check."""


class NotIdempotentError(KitError):
    """In calls-twice mode, a call's two copies were answered differently."""

    def __init__(self, findings: Sequence[Finding]) -> None:
        self.findings = list(findings)
        super().__init__("the handler answered the same call differently (same "
                         "Idempotency-Key):\n" + "\n".join(f.line() for f in findings))


@dataclass(frozen=True)
class History:
    """A partition and every item of it (with its data and error history)."""

    partition: PartitionInfo
    items: dict[str, ItemInfo]

    def statuses(self) -> dict[str, str]:
        """Item id -> status."""
        return {item_id: item.status for item_id, item in self.items.items()}

    def errors(self) -> dict[str, list[str]]:
        """Item id -> its errors, the oldest first, for the items that failed at all."""
        return {item_id: [entry.error for entry in item.error_history]
                for item_id, item in self.items.items() if item.error_history}


def _items(items: Sequence[NewItem] | Mapping[str, Any]) -> list[NewItem]:
    """``NewItem`` values as given, or ``{id: data}``: bytes as they are, a string as
    UTF-8, anything else as its JSON."""
    if not isinstance(items, Mapping):
        return list(items)
    return [NewItem(item_id, data if isinstance(data, bytes) else
                    data.encode() if isinstance(data, str) else
                    json.dumps(data, separators=(",", ":")).encode())
            for item_id, data in items.items()]


class HandlerKit:
    """Runs ``app`` (an ASGI handler app, e.g. ``handlers.app(...)``) against a real
    engine for a test; use it as ``async with HandlerKit(app) as kit:``.

    ``calls_twice``: every item's call is sent twice with the same Idempotency-Key, the
    copies shuffled by ``seed``; leaving the block raises :class:`NotIdempotentError`
    when any two copies were answered differently (:attr:`findings`). ``start``: the
    clock's first time (naive UTC; now, to the second, by default). ``config``: engine
    settings to change (:class:`~watcher.WatcherConfig` fields, e.g. ``max_retries``,
    ``wait_timeout_policy``). ``folder``: where the database goes (a temporary folder,
    removed at the end, by default). ``timeout``: how long a ``run_*`` call drives a
    partition at most (wall seconds).
    """

    def __init__(self, app: Any, *, calls_twice: bool = False, seed: int = 0,
                 start: datetime | None = None, config: Mapping[str, Any] | None = None,
                 folder: Path | None = None, timeout: float = DEFAULT_TIMEOUT,
                 quiet: float = DEFAULT_QUIET) -> None:
        self.app = app
        self.calls_twice = calls_twice
        self.seed = seed
        self.clock = FixedClock(start or datetime.now(UTC).replace(tzinfo=None,
                                                                   microsecond=0))
        self.config = WatcherConfig(**{**KIT_CONFIG, **(config or {})})
        self.timeout = timeout
        self.quiet = quiet
        self._folder = folder
        self._stack = contextlib.AsyncExitStack()
        self.url = ""
        self.db_url = ""
        self._client: AsyncClient | None = None
        self._store: Store | None = None
        self._processor: CountedProcessor | None = None

    async def __aenter__(self) -> HandlerKit:
        stack = self._stack
        try:
            folder = self._folder or Path(stack.enter_context(
                tempfile.TemporaryDirectory(prefix="statefeed-kit-")))
            self.db_url = await fresh_database(folder / f"kit-{id(self):x}.db")
            sock = listen("127.0.0.1", 0)
            port = sock.getsockname()[1]
            await stack.enter_async_context(serving(self.app, sock, what="the handler app",
                                                    lifespan="auto"))
            self.url = f"http://127.0.0.1:{port}/"
            http = HttpProcessor(HttpProcessorConfig(handler_url=self.url), call_tracer=None)
            stack.push_async_callback(http.aclose)
            self._processor = (CallsTwice(http, self.seed) if self.calls_twice
                               else CountedProcessor(http))
            self._store = Store.open(self.db_url, clock=self.clock)
            stack.push_async_callback(self._store.close)
            self._client = AsyncClient(self.db_url, clock=self.clock)
            stack.push_async_callback(self._client.close)
        except BaseException:
            await stack.aclose()
            raise
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        await self._stack.aclose()
        if kind is None and self.findings:
            raise NotIdempotentError(self.findings)

    @property
    def client(self) -> AsyncClient:
        """The kit's client (:class:`processor.AsyncClient`), on the kit's clock."""
        if self._client is None:
            raise RuntimeError("the kit is not open: use it as `async with HandlerKit(app)`")
        return self._client

    @property
    def findings(self) -> list[Finding]:
        """In calls-twice mode, the calls whose copies were answered differently."""
        return self._processor.findings if isinstance(self._processor, CallsTwice) else []

    def now(self) -> datetime:
        """The database clock's time (naive UTC)."""
        return self.clock.reading()

    def advance(self, *, seconds: float = 0, minutes: float = 0, hours: float = 0,
                days: float = 0) -> datetime:
        """Move the database clock on; returns the new time. Takes no wall time: the
        next ``run_*`` call finds what fell due (deadlines, delays) and drives it."""
        return self.clock.advance(timedelta(days=days, hours=hours, minutes=minutes,
                                            seconds=seconds).total_seconds())

    async def create(self, partition_id: str, items: Sequence[NewItem] | Mapping[str, Any],
                     **settings: Any) -> None:
        """Create a partition: ``items`` as ``NewItem`` values or ``{id: data}`` (bytes,
        text, or a value stored as its JSON); ``settings`` as
        :meth:`processor.AsyncClient.create_partition` takes them (``reduce_gates``,
        ``on_item_failure``, ``quorum``, ...).

        Raises:
            What :meth:`~processor.AsyncClient.create_partition` raises.
        """
        await self.client.create_partition(partition_id, _items(items), **settings)

    async def complete(self, partition_id: str, item_id: str,
                       answer: Mapping[str, Any]) -> CompletedWait:
        """Complete the wait of the parked item ``item_id`` with ``answer``, the JSON a
        handler (or ``POST /v1/completions/{token}``) would answer: ``{"gate": 1}``,
        ``{"done": True, "data": {...}}``, ``{"error": "declined", "no_retry": True}``.

        Raises:
            CompletionRefusedError: the answer is malformed or cannot apply.
            AlreadyCompletedError: the item is not waiting.
            WaitNotFoundError: no such item.
        """
        return await self.client.complete_item_answer(partition_id, item_id,
                                                      read_completion(dict(answer)))

    async def history(self, partition_id: str) -> History:
        """The partition and all its items, each with its status, gate, attempts, data
        and error history.

        Raises:
            PartitionNotFoundError: no such partition.
        """
        partition = await self.client.partition(partition_id)
        items = {item.id: item async for item in self.client.iter_items(partition_id)}
        return History(partition, items)

    async def run_until_done(self, partition_id: str, *, timeout: float | None = None,  # noqa: ASYNC109
                             skip_delays: bool = True) -> PartitionInfo:
        """Drive the partition until it ends (complete, failed or cancelled); returns it.
        ``skip_delays``: when nothing but a delay (a backoff, a snooze, a
        ``not_before``) holds it, and no wait's deadline comes first, the clock moves to
        the delay's end. A wait's deadline is never passed: :meth:`advance` does that.

        Raises:
            KitError: it became idle first (parked items, or a delay not skipped), or
                ``timeout`` wall seconds passed; the message says where it stopped.
        """
        return await self._drive(partition_id, lambda s: s.ended, "it ended", timeout,
                                 skip_delays, idle_ends=False)

    async def run_to_gate(self, partition_id: str, gate: int, *,
                          timeout: float | None = None,  # noqa: ASYNC109
                          skip_delays: bool = True) -> PartitionInfo:
        """Drive the partition until its gate is ``gate`` or later; returns it.

        Raises:
            KitError: as :meth:`run_until_done`, or it ended below ``gate``.
        """
        return await self._drive(partition_id, lambda s: s.partition.gate >= gate,
                                 f"it reached gate {gate}", timeout, skip_delays,
                                 idle_ends=False)

    async def run_until_idle(self, partition_id: str, *, timeout: float | None = None,  # noqa: ASYNC109
                             skip_delays: bool = True) -> PartitionInfo:
        """Drive the partition until it ends or nothing more can happen to it without
        the clock moving or a completion (its items parked); returns it.

        Raises:
            KitError: ``timeout`` wall seconds passed.
        """
        return await self._drive(partition_id, lambda s: s.ended, "it ended or idled",
                                 timeout, skip_delays, idle_ends=True)

    async def _drive(self, partition_id: str, reached: Callable[[Snapshot], bool],
                     goal: str, timeout: float | None, skip_delays: bool,  # noqa: ASYNC109
                     *, idle_ends: bool) -> PartitionInfo:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            snapshot, how = await self._run_engine(partition_id, reached, deadline, goal)
            if how == "reached":
                return snapshot.partition
            state = idle(snapshot, self.now())
            if skip_delays and state is not None and state.skippable and state.next_due:
                self.clock.set(state.next_due)
                continue
            if idle_ends:
                return snapshot.partition
            why = ("it ended" if snapshot.ended else "it is idle" if state is not None
                   else f"nothing happened for {self.quiet:g} s though items are due "
                        "(a handler's Retry-After, a pause or a flow limit holds them; "
                        "advance the clock past a Retry-After)")
            raise KitError(f"stopped before {goal}: {why}: "
                           f"{describe(snapshot, self.now())}")

    async def _snapshot(self, partition_id: str) -> Snapshot:
        client = self.client
        partition = await client.partition(partition_id)
        items = tuple([item async for item in client.iter_items(partition_id,
                                                                with_data=False)])
        return Snapshot(partition, items)

    async def _run_engine(self, partition_id: str, reached: Callable[[Snapshot], bool],
                          deadline: float, goal: str) -> tuple[Snapshot, str]:
        """Run a watcher until the partition is ``reached``, ends, idles or stays quiet;
        the watcher is stopped (its leases let go) before this returns.

        Raises:
            KitError: the deadline passed first.
        """
        assert self._store is not None and self._processor is not None
        processor = self._processor
        watcher = Watcher(self._store, processor, self.config, tracer=None)
        task = asyncio.create_task(watcher.run(), name=f"testkit-{partition_id}")
        try:
            previous: Snapshot | None = None
            changed = time.monotonic()
            while True:
                if task.done():
                    task.result()
                    raise KitError("the engine stopped by itself")
                snapshot = await self._snapshot(partition_id)
                if reached(snapshot):
                    return snapshot, "reached"
                if snapshot.ended:
                    return snapshot, "ended"
                quiet = processor.in_flight == 0 and snapshot == previous
                if quiet and idle(snapshot, self.now()) is not None:
                    return snapshot, "idle"
                now = time.monotonic()
                if not quiet:
                    changed = now
                elif now - changed > self.quiet:
                    return snapshot, "quiet"
                if now > deadline:
                    raise KitError(f"still running when the deadline passed, before "
                                   f"{goal}: {describe(snapshot, self.now())}")
                previous = snapshot
                await asyncio.sleep(POLL)
        finally:
            await watcher.stop()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def handler_kit(app: Any, **options: Any) -> HandlerKit:
    """``async with handler_kit(app) as kit:``: a :class:`HandlerKit` (same options)."""
    return HandlerKit(app, **options)
