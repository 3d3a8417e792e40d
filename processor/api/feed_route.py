"""``GET /v1/partitions/{id}/events``: a partition's live feed on the ingest API.

The request is checked here, with the API's errors: 400 for a bad query or
``Last-Event-ID``, 404 for an unknown partition (before the stream starts), 503 when
the feed is full; then :func:`processor.feed.stream.feed_answer` answers it (204 after
the end, else the stream).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from processor.api.problems import ApiError, bad_request
from processor.api.views import only, seconds, whole_number
from processor.client.async_client import AsyncClient
from processor.feed.delivery import DEFAULT_INTERVAL_MS, MAX_INTERVAL_MS, MIN_INTERVAL_MS
from processor.feed.events import BadEventIdError
from processor.feed.hub import FeedBusyError, FeedHub
from processor.feed.stream import MAX_TIMEOUT_SECONDS, feed_answer, last_event_id


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
    try:
        last = last_event_id(request.headers)
    except BadEventIdError as error:
        raise bad_request(str(error), field="Last-Event-ID") from None
    try:
        return await feed_answer(hub, client, partition_id, last, interval=interval_ms / 1000,
                                 lasting=None if lasting < 0 else lasting, where="api")
    except FeedBusyError as error:
        raise ApiError(503, "feed_busy", str(error), headers={"retry-after": "5"}) from None
