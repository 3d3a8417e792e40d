"""The console's Notifications page (``/notifications``): how many events wait to be
sent, were delivered (kept a week) and are dead, the pending events whose last try
failed or was left to another processor (with why), and the latest dead events with their
partition, URL (its password and query values masked), attempts and last error; with
a Redeliver per dead event (what ``processor notifications redeliver`` does), POSTed as
the partition page's actions are (same-origin, session token, refused on a read-only
console). The signing secret is never read here.

:func:`notifications_data` reads and shapes what ``notifications.html`` shows;
:func:`notifications_routes` gives the routes :func:`processor.console.app.create_app`
mounts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from processor.client.async_client import AsyncClient
from processor.console.flow_page import Console
from processor.console.forms import see_other
from processor.notify.events import rfc3339
from processor.observe.redact import redact_url

# Dead events the page lists at most, the latest first.
DEAD_SHOWN = 50
# Pending events read (the oldest first) to find those with an error, and shown at most.
PENDING_READ = 200
PENDING_SHOWN = 50
NOTICES = {
    "redelivered": "Event #{seq} will be sent again: it is pending, due now, with its "
                   "attempts counted from zero.",
    "not-redelivered": "Event #{seq} is not dead (sent again already, or gone): nothing "
                       "changed.",
}


class BadEvent(ValueError):
    """A resend form without a whole event number."""


@dataclass(frozen=True)
class DeadRow:
    """One dead event as the page shows it."""

    seq: int
    partition_id: str
    status: str
    target: str  # redacted
    attempts: int
    last_error: str
    ended_at: str
    given_up_at: str


@dataclass(frozen=True)
class WaitingRow:
    """One pending event with an error (its last try failed, or a processor left it to
    another: an internal host without ``--notify-allow-private``)."""

    seq: int
    partition_id: str
    status: str
    target: str  # redacted
    attempts: int
    last_error: str
    ended_at: str


async def notifications_data(client: AsyncClient) -> dict[str, Any]:
    """What the page shows: the outbox's counts, the oldest pending events with an error
    (up to :data:`PENDING_SHOWN`, among the oldest :data:`PENDING_READ` pending) and the
    latest :data:`DEAD_SHOWN` dead events.

    Raises:
        DatabaseError: the database failed.
    """
    counts = await client.notification_counts(delivered=True)
    pending = await client.notifications(state="pending", limit=PENDING_READ)
    waiting = [WaitingRow(seq=event.seq, partition_id=event.partition_id,
                          status=event.status, target=redact_url(event.target),
                          attempts=event.attempts, last_error=event.last_error,
                          ended_at=rfc3339(event.created_at) or "-")
               for event in pending if event.last_error][:PENDING_SHOWN]
    dead = await client.notifications(state="dead", limit=DEAD_SHOWN + 1, newest_first=True)
    rows = [DeadRow(seq=event.seq, partition_id=event.partition_id, status=event.status,
                    target=redact_url(event.target), attempts=event.attempts,
                    last_error=event.last_error or "-",
                    ended_at=rfc3339(event.created_at) or "-",
                    given_up_at=rfc3339(event.updated_at) or "-")
            for event in dead[:DEAD_SHOWN]]
    return {"counts": counts, "dead": rows, "more": len(dead) > DEAD_SHOWN,
            "waiting": waiting}


def event_number(text: str | None) -> int:
    """The event number a resend form names.

    Raises:
        BadEvent: it is not a whole number from 1.
    """
    if text is None or not text.isdecimal() or int(text) < 1 or len(text) > 18:
        raise BadEvent("the form must name a dead event by its number (seq)")
    return int(text)


async def notifications_page(console: Console, request: Request) -> Response:
    """The page, with the notice an action left."""
    async def page(request: Request) -> Response:
        code = request.query_params.get("notice") or ""
        seq = request.query_params.get("seq", "")
        notice = NOTICES[code].format(seq=seq) if code in NOTICES and seq.isdecimal() \
            else None
        return console.render(request, "notifications.html", notice=notice,
                              **await notifications_data(console.client))
    return await console.guarded(request, page)


async def redeliver_action(console: Console, request: Request) -> Response:
    """POST /notifications/redeliver: send one dead event again, and send the browser
    back to the page with what it did."""
    form = await console.action_form(request, "redeliver", ("redeliver",))
    if isinstance(form, Response):
        return form
    try:
        seq = event_number(form.get("seq"))
    except BadEvent as error:
        return console.render(request, "error.html", 400, title="Bad request",
                              message=str(error))

    async def act(request: Request) -> Response:
        done = await console.client.redeliver_notifications([seq])
        return see_other(f"/notifications?notice={'' if done else 'not-'}redelivered"
                         f"&seq={seq}")
    return await console.guarded(request, act)


def notifications_routes(current: Callable[[], Console]) -> list[Route]:
    """The Notifications page and its resend, over the console ``current()``."""
    async def page(request: Request) -> Response:
        return await notifications_page(current(), request)

    async def redeliver(request: Request) -> Response:
        return await redeliver_action(current(), request)

    return [Route("/notifications", page),
            Route("/notifications/redeliver", redeliver, methods=["POST"])]
