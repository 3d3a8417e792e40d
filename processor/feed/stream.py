"""A partition's live feed as a Server-Sent Events answer: what the ingest API's
``GET /v1/partitions/{id}/events`` (:mod:`processor.api.feed_route`) and the console's
``/live/partition/events`` send, once each has checked the request its own way.

The stream sends the events :class:`~processor.feed.hub.FeedHub` hands its subscriber
(:func:`~processor.feed.delivery.deliver`): gate moves and the end as they are seen,
item counts at most once per ``interval``, a heartbeat comment when nothing else was
sent for a while, and it closes after the end (or after ``lasting`` seconds, when
given: 0 sends what there is now and closes). A ``Last-Event-ID`` whose event was the
end is answered 204: nothing more will come, and an EventSource stops reconnecting.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Mapping

from starlette.responses import Response, StreamingResponse

from processor.feed.delivery import deliver
from processor.feed.events import Event, EventId, comment, retry_field
from processor.feed.hub import FeedHub, FeedSource, Subscriber, read_snapshots
from watcher.errors import PartitionNotFoundError

log = logging.getLogger(__name__)

RECONNECT_MS = 2000  # the retry: an EventSource waits this long before reconnecting
HEADERS = {"cache-control": "no-store", "x-accel-buffering": "no"}
MAX_TIMEOUT_SECONDS = 86_400.0


def last_event_id(headers: Mapping[str, str]) -> EventId | None:
    """The request's ``Last-Event-ID``, parsed (``None`` when absent or empty).

    Raises:
        BadEventIdError: it is not one of the feed's ids.
    """
    raw = headers.get("last-event-id", "")
    return EventId.parse(raw) if raw else None


async def feed_answer(hub: FeedHub, source: FeedSource, partition_id: str,
                      last: EventId | None, *, interval: float, lasting: float | None,
                      where: str) -> Response:
    """The answer to a checked feed request: 204 when ``last`` was the end, else the
    stream of ``partition_id`` from ``last`` (``None``: from its state now). ``where``
    names the server in the log line (``api``, ``console``).

    Raises:
        PartitionNotFoundError: no partition has this id.
        FeedBusyError: the feed follows as many clients as it may, or is closed.
        DatabaseError: the database failed.
    """
    if last is not None and last.ended:
        if partition_id not in await read_snapshots(source, [partition_id]):
            raise PartitionNotFoundError(partition_id)
        return Response(status_code=204, headers=HEADERS)
    subscriber, first = await hub.subscribe(source, partition_id, last)
    log.info("action=feed_followed partition=%r resumed=%s via=%s", partition_id,
             last is not None, where)
    body = _stream(hub, partition_id, subscriber, first, interval, lasting)
    return StreamingResponse(body, media_type="text/event-stream", headers=HEADERS)


async def _stream(hub: FeedHub, partition_id: str, subscriber: Subscriber,
                  first: list[Event], interval: float, lasting: float | None
                  ) -> AsyncIterator[bytes]:
    """The bytes of one client's stream; unsubscribes however it ends."""
    events = deliver(hub, partition_id, subscriber, first, interval, lasting=lasting,
                     heartbeat=hub.settings.heartbeat)
    try:
        yield retry_field(RECONNECT_MS)
        async with contextlib.aclosing(events):
            async for event in events:
                yield comment("keep-alive") if event is None else event.frame()
    finally:  # also when it ends before the first event was asked for
        hub.unsubscribe(partition_id, subscriber)
