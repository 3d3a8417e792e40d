"""``GET /v1/partitions/{id}/events``: a partition's live feed as Server-Sent Events.

The request is checked, and the partition found (404 when it is not), before the
stream starts; then the stream sends the events :class:`~processor.feed.hub.FeedHub`
hands its subscriber: gate moves and the end as they are seen, item counts at most
once per ``interval`` milliseconds (the latest, never a backlog), a heartbeat comment
when nothing else was sent for a while, and it closes after the end (or after
``timeout`` seconds, when given: 0 sends what there is now and closes). A
``Last-Event-ID`` whose event was the end is answered 204: nothing more will come,
and an EventSource stops reconnecting.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from processor.api.problems import ApiError, bad_request
from processor.api.views import only, seconds, whole_number
from processor.client.async_client import AsyncClient
from processor.feed.events import (
    END,
    BadEventIdError,
    Event,
    EventId,
    comment,
    retry_field,
)
from processor.feed.hub import FeedBusyError, FeedHub, Subscriber

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_MS = 1000
MIN_INTERVAL_MS = 100
MAX_INTERVAL_MS = 60_000
MAX_TIMEOUT_SECONDS = 86_400.0
RECONNECT_MS = 2000  # the retry: an EventSource waits this long before reconnecting
HEADERS = {"cache-control": "no-store", "x-accel-buffering": "no"}


async def events_route(hub: FeedHub, client: AsyncClient, request: Request,
                       partition_id: str) -> Response:
    """Answer a feed request: 400 for a bad query or ``Last-Event-ID``, 404 for an unknown
    partition, 503 when the feed is full, 204 after the end, else the stream.

    Raises:
        ApiError: 400 or 503, as above.
        PartitionNotFoundError: no partition has this id (the API answers 404).
        DatabaseError: the database failed (503).
    """
    query = request.query_params
    only(query, frozenset({"interval", "timeout"}))
    interval_ms = whole_number(query, "interval", DEFAULT_INTERVAL_MS, low=MIN_INTERVAL_MS,
                               high=MAX_INTERVAL_MS) or DEFAULT_INTERVAL_MS
    lasting = seconds(query, "timeout", -1.0, high=MAX_TIMEOUT_SECONDS)
    last = _last_event_id(request)
    if last is not None and last.ended:
        await client.partition(partition_id)  # 404 when it is gone
        return Response(status_code=204, headers=HEADERS)
    try:
        subscriber, first = await hub.subscribe(client, partition_id, last)
    except FeedBusyError as error:
        raise ApiError(503, "feed_busy", str(error), headers={"retry-after": "5"}) from None
    log.info("action=feed_followed partition=%r resumed=%s", partition_id, last is not None)
    body = _stream(hub, partition_id, subscriber, first, interval_ms / 1000,
                   None if lasting < 0 else lasting)
    return StreamingResponse(body, media_type="text/event-stream", headers=HEADERS)


def _last_event_id(request: Request) -> EventId | None:
    """The ``Last-Event-ID`` header, parsed (``None`` when absent or empty).

    Raises:
        ApiError: 400 when it is not one of the feed's ids.
    """
    raw = request.headers.get("last-event-id", "")
    if not raw:
        return None
    try:
        return EventId.parse(raw)
    except BadEventIdError as error:
        raise bad_request(str(error), field="Last-Event-ID") from None


async def _stream(hub: FeedHub, partition_id: str, subscriber: Subscriber,
                  first: list[Event], interval: float, lasting: float | None
                  ) -> AsyncIterator[bytes]:
    """The bytes of one client's stream; unsubscribes however it ends."""
    heartbeat = hub.settings.heartbeat
    started = last_sent = time.monotonic()
    counts_at = float("-inf")
    try:
        yield retry_field(RECONNECT_MS)
        for event in first:
            yield event.frame()
            if event.kind == END:
                return
        while True:
            while subscriber.queue:
                event = subscriber.queue.popleft()
                yield event.frame()
                last_sent = time.monotonic()
                if event.kind == END:
                    return
            if subscriber.cut_off:
                return  # too slow, or the API is stopping: the client resumes elsewhere
            now = time.monotonic()
            if subscriber.counts is not None and now - counts_at >= interval:
                counts = subscriber.take_counts()
                if counts is not None:
                    yield counts.frame()
                    counts_at = last_sent = now
                continue
            if lasting is not None and now - started >= lasting:
                return
            wait = heartbeat - (now - last_sent)
            if subscriber.counts is not None:
                wait = min(wait, interval - (now - counts_at))
            if lasting is not None:
                wait = min(wait, lasting - (now - started))
            subscriber.wake.clear()
            if wait > 0 and not subscriber.queue and not subscriber.cut_off:
                try:
                    await asyncio.wait_for(subscriber.wake.wait(), wait)
                except TimeoutError:
                    pass
            if time.monotonic() - last_sent >= heartbeat:
                yield comment("keep-alive")
                last_sent = time.monotonic()
    finally:
        hub.unsubscribe(partition_id, subscriber)

