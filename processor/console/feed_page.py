"""``/live/partition/events?id=...``: the partition page's live feed, the ingest API's
Server-Sent Events (:mod:`processor.feed.stream`) served by the console.

It passes the console's guard like every page (the loopback ``Host`` rule, and beyond
loopback the session cookie or ``Authorization: Bearer``; 401 without), and is a read,
so a read-only console serves it too. The console runs one
:class:`~processor.feed.hub.FeedHub`: one poller for every page following every
partition. The page's script (``static/console.js``) follows it with ``EventSource``,
drawing the per-gate bars, the counts and the status as events come, and stops at the
end. Errors before the stream starts are the console's: 400 for a bad ``interval`` or
``Last-Event-ID``, 404 for an unknown partition, 503 when the feed is full or the
database failed.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from processor.console.flow_page import Console
from processor.console.reads import BadRequest
from processor.feed.delivery import DEFAULT_INTERVAL_MS, MAX_INTERVAL_MS, MIN_INTERVAL_MS
from processor.feed.events import BadEventIdError
from processor.feed.hub import FeedBusyError, FeedHub
from processor.feed.stream import feed_answer, last_event_id

FEED_PATH = "/live/partition/events"


def interval_of(raw: str | None) -> float:
    """The ``interval`` parameter (milliseconds between two ``counts`` events, as the
    API takes it) in seconds; absent: the API's default.

    Raises:
        BadRequest: it is not a whole number from 100 to 60000.
    """
    if raw is None:
        return DEFAULT_INTERVAL_MS / 1000
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 6
            and MIN_INTERVAL_MS <= int(raw) <= MAX_INTERVAL_MS):
        raise BadRequest(f"interval must be a whole number of milliseconds from "
                         f"{MIN_INTERVAL_MS} to {MAX_INTERVAL_MS}, got {raw[:20]!r}")
    return int(raw) / 1000


def feed_routes(current: Callable[[], Console], hub: FeedHub) -> list[Route]:
    """The route of the partition page's live feed, on ``hub``."""

    async def events(request: Request) -> Response:
        console = current()

        async def answer(request: Request) -> Response:
            partition_id = request.query_params.get("id") or ""
            interval = interval_of(request.query_params.get("interval"))
            try:
                last = last_event_id(request.headers)
            except BadEventIdError as error:
                raise BadRequest(str(error)) from None
            try:
                return await feed_answer(hub, console.client, partition_id, last,
                                         interval=interval, lasting=None, where="console")
            except FeedBusyError as error:
                refused = console.render(request, "_error.html", 503, title="Busy",
                                         message=str(error))
                refused.headers["retry-after"] = "5"
                return refused

        return await console.guarded(request, answer)

    return [Route(FEED_PATH, events)]
