"""The live feed's hub: one poller for every partition someone follows, and the
subscribers it fans out to.

However many clients follow however many partitions, one task polls: each tick
reads the version, gate and status of every watched partition in one batched
statement (:meth:`~watcher.store.leases.LeasesStore.partition_states`) and their
items per gate in another
(:meth:`~watcher.store.partitions.PartitionsStore.items_gate_counts`), then hands
each subscriber what changed; the result and last error of a partition that ended
are read once, for all its followers. A client costs no database read of its own
beyond the one that checks its partition exists (and none when someone already
follows it).

Memory is bounded per subscriber: gate moves and the end go into a queue of
:attr:`FeedSettings.queue_size` events; counts are not queued but kept as the
latest only, so a slow client skips intermediate counts. A client so slow that its
queue fills is cut off (its stream ends), and reconnecting with ``Last-Event-ID``
replays what it missed from the watch's journal of gate moves. A watch with no
subscriber left is kept :attr:`FeedSettings.linger` seconds, so that a client that
reconnects soon is replayed exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Protocol

from sqlalchemy.exc import SQLAlchemyError

from processor.feed.events import (
    DELETED,
    Event,
    EventId,
    Snapshot,
    counts_event,
    end_events,
    gate_event,
    state_event,
)
from watcher.errors import ConfigError, DatabaseError, PartitionNotFoundError, StatefeedError
from watcher.outages import OutageLatch
from watcher.store import Store

log = logging.getLogger(__name__)

JOURNAL_SIZE = 1000  # gate moves a watch remembers, for clients that resume


@dataclass(frozen=True)
class FeedSettings:
    """How the feed runs: seconds between polls (``poll_interval``), between heartbeat
    comments (``heartbeat``), and that a watch no one follows is kept (``linger``);
    the most clients at once (``max_clients``) and events queued per client
    (``queue_size``).

    Raises:
        ConfigError: a value is out of its range.
    """

    poll_interval: float = 0.5
    heartbeat: float = 15.0
    linger: float = 30.0
    max_clients: int = 1000
    queue_size: int = 64

    def __post_init__(self) -> None:
        for name, low, high in (("poll_interval", 0.01, 60.0), ("heartbeat", 0.05, 3600.0),
                                ("linger", 0.0, 3600.0)):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not low <= value <= high:
                raise ConfigError(f"feed {name} must be from {low:g} to {high:g} seconds, "
                                  f"got {value!r}")
        for name, low, high in (("max_clients", 1, 100_000), ("queue_size", 4, 10_000)):
            value = getattr(self, name)
            if type(value) is not int or not low <= value <= high:
                raise ConfigError(f"feed {name} must be from {low} to {high}, got {value!r}")


class FeedBusyError(StatefeedError):
    """The feed follows as many clients as it may (:attr:`FeedSettings.max_clients`), or
    it is closed (its API, console or client is stopping)."""


class FeedSource(Protocol):
    """What the hub reads through: a store, and the one readable error for its failures
    (:class:`processor.AsyncClient` is one; the hub never imports the client)."""

    @property
    def store(self) -> Store: ...

    def database_error(self, error: SQLAlchemyError) -> DatabaseError: ...


@dataclass(frozen=True, slots=True)
class GateMove:
    """A gate move a watch saw: at ``version``, from ``from_gate`` to ``to_gate``."""

    version: int
    from_gate: int
    to_gate: int


class Subscriber:
    """One client's share of a watch: its queue of gate moves and ends, and the latest
    counts not yet sent."""

    def __init__(self, queue_size: int) -> None:
        self.queue: deque[Event] = deque()
        self.queue_size = queue_size
        self.counts: Event | None = None
        self.cut_off = False  # its queue overflowed: its stream ends, it resumes
        self.wake = asyncio.Event()

    def push(self, event: Event) -> None:
        """Queue ``event``; a full queue cuts the subscriber off instead (never grows)."""
        if len(self.queue) >= self.queue_size:
            self.cut_off = True
        else:
            self.queue.append(event)
        self.wake.set()

    def offer_counts(self, event: Event) -> None:
        """Keep the counts ``event`` as the one to send next (replacing an older one)."""
        self.counts = event
        self.wake.set()

    def take_counts(self) -> Event | None:
        """The counts to send, if any are waiting (then none are)."""
        event, self.counts = self.counts, None
        return event


@dataclass
class Watch:
    """One followed partition: its latest snapshot, the gate moves seen since the
    watch began (``origin``: its version and gate then), and its subscribers."""

    snapshot: Snapshot
    origin: EventId
    journal: deque[GateMove] = field(default_factory=lambda: deque(maxlen=JOURNAL_SIZE))
    subscribers: set[Subscriber] = field(default_factory=set)
    counts_sequence: int = 0
    idle_since: float | None = None  # time.monotonic() when its last subscriber left

    def replay(self, last: EventId) -> list[Event]:
        """The gate moves a client that last had ``last`` has not seen, oldest first. When
        ``last`` is older than the watch and names another gate than the watch began
        at, one move stands for those the watch never saw (``gap``)."""
        events = []
        if last.version < self.origin.version and last.gate != self.origin.gate:
            events.append(gate_event(self.origin.version, last.gate, self.origin.gate,
                                     gap=True))
        events.extend(gate_event(move.version, move.from_gate, move.to_gate)
                      for move in self.journal if move.version > last.version)
        return events


class FeedHub:
    """The feed's watches and their one poller (see the module's docstring)."""

    def __init__(self, settings: FeedSettings | None = None) -> None:
        self.settings = settings or FeedSettings()
        self.watches: dict[str, Watch] = {}
        self.ticks = 0  # polls begun: each is one batched read of every watch
        self.poller_starts = 0
        self._source: FeedSource | None = None
        self._poller: asyncio.Task[None] | None = None
        self._closed = False
        self._outage = OutageLatch()  # one WARNING when the polls fail, one INFO after

    @property
    def subscribers(self) -> int:
        return sum(len(watch.subscribers) for watch in self.watches.values())

    @property
    def closed(self) -> bool:
        """The hub was closed: it follows nothing more."""
        return self._closed

    async def subscribe(self, source: FeedSource, partition_id: str,
                        last: EventId | None) -> tuple[Subscriber, list[Event]]:
        """Follow ``partition_id``: a new subscriber, and the events to send it first (on
        a fresh start, the partition's state; on a resume, the gate moves after
        ``last``; then the result and end if it is finished).

        Raises:
            PartitionNotFoundError: no partition has this id.
            FeedBusyError: the feed follows :attr:`FeedSettings.max_clients` clients.
            DatabaseError: the database failed.
        """
        if self._closed:
            raise FeedBusyError("the feed is closed: its API, console or client is stopping")
        if self.subscribers >= self.settings.max_clients:
            raise FeedBusyError(f"the feed follows {self.settings.max_clients} clients "
                                "already; try again later")
        self._source = source
        watch = self.watches.get(partition_id)
        if watch is None:
            snapshot = (await read_snapshots(source, [partition_id])).get(partition_id)
            if snapshot is None:
                raise PartitionNotFoundError(partition_id)
            watch = self.watches.setdefault(partition_id, Watch(snapshot, snapshot.event_id()))
        snapshot = watch.snapshot
        first = [state_event(snapshot)] if last is None else watch.replay(last)
        if last is not None:
            first.append(counts_event(snapshot, watch.counts_sequence))
        subscriber = Subscriber(self.settings.queue_size)
        if snapshot.finished:
            first.extend(end_events(snapshot))
            if not watch.subscribers:
                self.watches.pop(partition_id, None)
            return subscriber, first
        watch.subscribers.add(subscriber)
        watch.idle_since = None
        self._start_poller()
        return subscriber, first

    def unsubscribe(self, partition_id: str, subscriber: Subscriber) -> None:
        """``subscriber`` has gone; its watch lingers a while if it was the last."""
        watch = self.watches.get(partition_id)
        if watch is not None and subscriber in watch.subscribers:
            watch.subscribers.discard(subscriber)
            if not watch.subscribers:
                watch.idle_since = time.monotonic()

    async def close(self) -> None:
        """Stop polling and end every subscriber's stream (its API, console or client
        is stopping)."""
        self._closed = True
        for watch in self.watches.values():
            for subscriber in watch.subscribers:
                subscriber.cut_off = True
                subscriber.wake.set()
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None

    def _start_poller(self) -> None:
        if self._poller is None or self._poller.done():
            self.poller_starts += 1
            self._poller = asyncio.create_task(self._poll(), name="statefeed-feed-poller")

    async def _poll(self) -> None:
        """Poll while any partition is watched; ends when none is."""
        while not self._closed:
            await asyncio.sleep(self.settings.poll_interval)
            self._forget_idle()
            if not self.watches or self._source is None:
                return
            ids = list(self.watches)
            self.ticks += 1
            try:
                snapshots = await read_snapshots(self._source, ids)
            except StatefeedError as error:  # the database failed: try again next tick
                if self._outage.fail():
                    log.warning("action=feed_poll_failed watched=%d error=%s", len(ids), error)
                continue
            if self._outage.recover():
                log.info("action=feed_poll_recovered watched=%d", len(ids))
            for partition_id in ids:
                watch = self.watches.get(partition_id)
                if watch is not None:
                    self._observe(partition_id, watch, snapshots.get(partition_id))

    def _forget_idle(self) -> None:
        now = time.monotonic()
        for partition_id, watch in list(self.watches.items()):
            if (not watch.subscribers and watch.idle_since is not None
                    and now - watch.idle_since >= self.settings.linger):
                del self.watches[partition_id]

    def _observe(self, partition_id: str, watch: Watch, seen: Snapshot | None) -> None:
        """Hand the subscribers of ``watch`` what changed since its last snapshot."""
        before = watch.snapshot
        if seen is None:  # deleted while followed
            seen = Snapshot(partition_id, DELETED, before.gate, before.version, before.gates)
        events: list[Event] = []
        if seen.gate != before.gate:
            move = GateMove(seen.version, before.gate, seen.gate)
            watch.journal.append(move)
            events.append(gate_event(move.version, move.from_gate, move.to_gate))
        counts = None
        if seen.gates != before.gates:
            watch.counts_sequence += 1
            counts = counts_event(seen, watch.counts_sequence)
        watch.snapshot = seen
        if seen.finished:
            events.extend(end_events(seen))
            del self.watches[partition_id]  # a later client reads it afresh
        for subscriber in list(watch.subscribers):
            if counts is not None:
                subscriber.offer_counts(counts)
            for event in events:
                subscriber.push(event)
            if subscriber.cut_off:  # its stream ends (or never began): it holds nothing
                watch.subscribers.discard(subscriber)


async def read_snapshots(source: FeedSource, ids: list[str]) -> dict[str, Snapshot]:
    """The snapshots of the partitions ``ids`` that exist: two batched reads (the hub's
    poll, and its first read of a partition), and a third for each one that ended.

    Raises:
        DatabaseError: the database failed.
    """
    store = source.store
    try:
        states = await store.partition_states(ids)
        gates = await store.items_gate_counts(list(states)) if states else {}
        snapshots = {partition_id: Snapshot(partition_id, state.status, state.gate,
                                            state.version, gates.get(partition_id, {}))
                     for partition_id, state in states.items()}
        for partition_id, snapshot in snapshots.items():
            if snapshot.finished:  # its result and error: read once, at its end
                info = await store.partition_get(partition_id)
                if info is not None:
                    snapshots[partition_id] = replace(
                        snapshot, result=info.result, last_error=info.last_error)
    except SQLAlchemyError as error:
        raise source.database_error(error) from None
    return snapshots
