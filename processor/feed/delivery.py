"""One follower's share of the feed, in order and paced: the events a
:class:`~processor.feed.hub.FeedHub` hands one subscriber, as the SSE stream (the API's
and the console's, :mod:`processor.feed.stream`) and the client's ``follow`` take them.

Gate moves and the end go out as they are seen; item counts at most once per
``interval`` seconds (the latest, never a backlog). It ends after the end, when the hub
cut the subscriber off (too slow, or the hub closed), or after ``lasting`` seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator

from processor.feed.events import END, Event
from processor.feed.hub import FeedHub, Subscriber

# How often counts may come, in milliseconds (the API's and the console's ``interval``);
# the client takes the same bounds in seconds.
DEFAULT_INTERVAL_MS = 1000
MIN_INTERVAL_MS = 100
MAX_INTERVAL_MS = 60_000


async def deliver(hub: FeedHub, partition_id: str, subscriber: Subscriber,
                  first: list[Event], interval: float, *, lasting: float | None = None,
                  heartbeat: float | None = None) -> AsyncGenerator[Event | None, None]:
    """The events of ``subscriber``: ``first`` (what :meth:`FeedHub.subscribe` returned),
    then what the hub hands it, counts at most once per ``interval`` seconds. With
    ``heartbeat``, ``None`` is yielded whenever that many seconds passed with nothing
    sent (a stream's keep-alive). Unsubscribes however it ends (close it to end it)."""
    started = last_sent = time.monotonic()
    counts_at = float("-inf")
    quiet = float("inf") if heartbeat is None else heartbeat
    try:
        for event in first:
            yield event
            if event.kind == END:
                return
        while True:
            while subscriber.queue:
                event = subscriber.queue.popleft()
                yield event
                last_sent = time.monotonic()
                if event.kind == END:
                    return
            if subscriber.cut_off:
                return  # too slow, or the hub is closing: the follower resumes
            now = time.monotonic()
            if subscriber.counts is not None and now - counts_at >= interval:
                counts = subscriber.take_counts()
                if counts is not None:
                    yield counts
                    counts_at = last_sent = now
                continue
            if lasting is not None and now - started >= lasting:
                return
            wait = quiet - (now - last_sent)
            if subscriber.counts is not None:
                wait = min(wait, interval - (now - counts_at))
            if lasting is not None:
                wait = min(wait, lasting - (now - started))
            subscriber.wake.clear()
            if wait > 0 and not subscriber.queue and not subscriber.cut_off:
                try:
                    await asyncio.wait_for(subscriber.wake.wait(),
                                           None if wait == float("inf") else wait)
                except TimeoutError:
                    pass
            if time.monotonic() - last_sent >= quiet:
                yield None
                last_sent = time.monotonic()
    finally:
        hub.unsubscribe(partition_id, subscriber)
