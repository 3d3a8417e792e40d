"""Follow a partition live from Python: the events of the live feed (``state``,
``gate``, ``counts``, ``result``, ``end``), with the same ids and payloads as the
ingest API's Server-Sent Events (``GET /v1/partitions/{id}/events``), read from the
database directly.

:class:`FeedClient` is a part of :class:`processor.AsyncClient`, :class:`SyncFeed` of
:class:`processor.Client`. Each client runs a :class:`~processor.feed.hub.FeedHub` of
its own, started by its first ``follow``: one poller for all its follows, reading
every followed partition in one batched statement per tick (and its items per gate in
another), exactly as the API's hub does; the events come from the same pure functions
(:mod:`processor.feed.events`).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import math
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Iterator
from dataclasses import replace
from typing import Any, TypeVar

from sqlalchemy.exc import SQLAlchemyError

from processor.client.checks import check_id
from processor.feed.delivery import (
    DEFAULT_INTERVAL_MS,
    MAX_INTERVAL_MS,
    MIN_INTERVAL_MS,
    deliver,
)
from processor.feed.events import END, BadEventIdError, Event, EventId
from processor.feed.hub import FeedHub, FeedSettings, Subscriber, read_snapshots
from watcher.errors import DatabaseError, InvalidInputError, PartitionNotFoundError
from watcher.store import Store

T = TypeVar("T")

DEFAULT_FOLLOW_INTERVAL = DEFAULT_INTERVAL_MS / 1000
MIN_FOLLOW_INTERVAL = MIN_INTERVAL_MS / 1000
MAX_FOLLOW_INTERVAL = MAX_INTERVAL_MS / 1000


def check_interval(interval: object) -> float:
    """``interval`` (seconds between two ``counts`` events) as a float.

    Raises:
        InvalidInputError: it is not a number from 0.1 to 60.
    """
    if (isinstance(interval, bool) or not isinstance(interval, int | float)
            or not math.isfinite(interval)
            or not MIN_FOLLOW_INTERVAL <= interval <= MAX_FOLLOW_INTERVAL):
        raise InvalidInputError(
            f"interval must be a number of seconds from {MIN_FOLLOW_INTERVAL:g} to "
            f"{MAX_FOLLOW_INTERVAL:g} (how often counts may come), got {interval!r:.40}")
    return float(interval)


def check_after(after: object) -> EventId | None:
    """``after`` (an event's id, or its text) as an :class:`EventId`; ``None`` stays.

    Raises:
        InvalidInputError: it is not an id the feed gives.
    """
    if after is None or isinstance(after, EventId):
        return after
    try:
        if not isinstance(after, str):
            raise BadEventIdError(after)
        return EventId.parse(after)
    except BadEventIdError:
        raise InvalidInputError(
            f"after {after!r:.60} is not an id of the live feed (VERSION:GATE or "
            "VERSION:GATE:TAG, as an event's id is); pass None to start afresh") from None


class FeedClient:
    """Follow partitions live (a part of :class:`processor.AsyncClient`)."""

    store: Store
    feed_settings: FeedSettings
    _feed: FeedHub | None = None

    def database_error(self, error: SQLAlchemyError) -> DatabaseError:
        raise NotImplementedError  # AsyncClient's

    def _feed_hub(self) -> FeedHub:
        if self._feed is None:
            self._feed = FeedHub(self.feed_settings)
        return self._feed

    async def _close_feed(self) -> None:
        """End the follows in progress and stop the poller (the client is closing)."""
        if self._feed is not None:
            await self._feed.close()

    async def watch(self, partition_id: str, *, interval: float = DEFAULT_FOLLOW_INTERVAL,
                     after: EventId | str | None = None) -> AsyncGenerator[Event, None]:
        """The live feed of ``partition_id``, event by event, until its end: an async
        iterator of :class:`~processor.feed.events.Event` (``kind``: ``state``,
        ``gate``, ``counts``, ``result``, ``end``; ``id``; ``data``: the JSON payload
        the API's Server-Sent Events carry, docs/how-to/live-feed.md). It stops after
        the ``end`` event (the partition is complete, failed, cancelled or deleted).

        A fresh follow begins with ``state``; gate moves come as they are seen, item
        counts at most once per ``interval`` seconds (0.1 to 60; the latest, never a
        backlog). The client's hub polls every ``poll_interval`` seconds of its
        ``feed`` settings (:class:`~processor.feed.hub.FeedSettings`, 0.5 by default),
        for all of the client's follows at once.

        ``after`` (an event's ``id``, or its text) resumes after that event as the
        API's ``Last-Event-ID`` does: the gate moves seen since, then the latest
        counts, then the result and end if it has ended; after the ``end`` itself,
        nothing. Gate moves are replayed exactly when this client followed the
        partition within the last ``feed.linger`` seconds (30 by default; its hub
        remembers them); otherwise one ``gate`` event with ``"gap": true`` stands for
        the moves from the gate of ``after`` to the gate now. A follower that falls
        ``feed.queue_size`` events behind is resumed that way by itself: exactly, unless
        the partition ended meanwhile (then with a gap).

        Raises:
            InvalidInputError: a bad partition id, ``interval`` or ``after``.
            PartitionNotFoundError: no partition has this id.
            FeedBusyError: this client follows ``feed.max_clients`` partitions at once
                already, or it was closed.
            DatabaseError: the database failed.
        """
        check_id("partition", partition_id)
        pace = check_interval(interval)
        last = check_after(after)
        hub = self._feed_hub()
        if last is not None and last.ended:
            if partition_id not in await read_snapshots(self, [partition_id]):
                raise PartitionNotFoundError(partition_id)
            return
        while True:  # once, unless the hub cut this follower off: then it resumes
            subscriber, first = await hub.subscribe(self, partition_id, last)
            events = _own_events(hub, partition_id, subscriber, first, pace)
            async with contextlib.aclosing(events):
                async for event in events:
                    last = event.id
                    yield event
                    if event.kind == END:
                        return


async def _own_events(hub: FeedHub, partition_id: str, subscriber: Subscriber,
                      first: list[Event], interval: float) -> AsyncGenerator[Event, None]:
    """The events :func:`~processor.feed.delivery.deliver` hands one follower, each with
    data of its own (the hub shares one event among its followers)."""
    async with contextlib.aclosing(deliver(hub, partition_id, subscriber, first,
                                           interval)) as events:
        async for event in events:
            if event is not None:
                yield replace(event, data=copy.deepcopy(dict(event.data)))


class SyncFeed:
    """:class:`FeedClient`'s ``follow`` for :class:`processor.Client`."""

    _loop: asyncio.AbstractEventLoop

    @property
    def _feeds(self) -> FeedClient:
        return self._async  # type: ignore[attr-defined]  # Client's

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError  # Client's

    def watch(self, partition_id: str, *, interval: float = DEFAULT_FOLLOW_INTERVAL,
               after: EventId | str | None = None) -> Iterator[Event]:
        """See :meth:`FeedClient.watch`: the same events, as a plain iterator (each
        ``next`` waits for the next event). Leaving the loop early stops following."""
        stream = self._feeds.watch(partition_id, interval=interval, after=after)
        try:
            while True:
                try:
                    event = self._run(_next(stream))
                except StopAsyncIteration:
                    return
                yield event
        finally:
            if not self._loop.is_closed():
                self._run(stream.aclose())


async def _next(stream: AsyncIterator[Event]) -> Event:
    return await anext(stream)
