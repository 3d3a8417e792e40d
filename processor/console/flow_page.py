"""The console's Flow page (``/flow``): each key's limits, pause and live grants (the
slots of its fleet-wide limit each processor holds), handlers blocked by a
Retry-After (and how long ago the last such hold ended), and the pause of everything;
with a pause and resume per key and for everything, POSTed as the partition page's
actions are (same-origin, session token, refused on a read-only console).

:func:`flow_data` reads (through :func:`processor.client.flow_reads.read_flow`) and shapes
what the templates ``flow.html`` and ``_flow.html`` show; :func:`flow_routes` gives the
routes :func:`processor.console.app.create_app` mounts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from processor.client.async_client import AsyncClient
from processor.client.flow_reads import Grant, aware, blocked_for, read_flow
from processor.console.forms import Form, see_other
from processor.console.views.texts import age_text


class ReadOnlySetting(Protocol):
    """The settings of a console these pages read."""

    @property
    def read_only(self) -> bool:
        """Whether the console refuses every write."""
        ...

    @property
    def api_url(self) -> str | None:
        """The ingest API's public base URL (the item page's completion URLs), or
        ``None``."""
        ...


class Console(Protocol):
    """What the Flow page needs of a console (:class:`processor.console.app.Console` is
    one): it renders and guards pages, refuses writes where it must, and reads through
    its client. A protocol, so that the page imports nothing of the app that mounts it."""

    @property
    def client(self) -> AsyncClient:
        """The client the console reads and writes through."""
        ...

    @property
    def settings(self) -> ReadOnlySetting:
        """The console's settings."""
        ...

    def render(self, request: Request, name: str, status_code: int = 200,
               **context: Any) -> Response:
        """The page ``name`` rendered with ``context``."""
        ...

    async def guarded(self, request: Request,
                      page: Callable[[Request], Awaitable[Response]]) -> Response:
        """``page(request)``, with its failures as pages that say what went wrong."""
        ...

    def read_only_refusal(self, request: Request) -> Response:
        """The answer to a write on a read-only console."""
        ...

    async def refuse_cross_site(self, request: Request) -> Response | Form:
        """The refusal of a cross-site or unsigned form, or the form's fields."""
        ...

    async def action_form(self, request: Request, verb: str,
                          verbs: Collection[str]) -> Response | Form:
        """The form of an action's POST, or the page refusing it (an unknown verb, a
        read-only console, another site)."""
        ...

# Rows the page shows at most (each key's grants are one read).
FLOW_PAGE = 200
VERBS = ("pause-key", "resume-key", "pause-all", "resume-all")
NOTICES = {
    "pause-key": "Paused key {key}: each holder starts no new call of its partitions from "
                 "its next poll.",
    "not-pause-key": "Key {key} is paused already.",
    "resume-key": "Resumed key {key}: its partitions are leased again within a lease cycle.",
    "not-resume-key": "Key {key} was not paused.",
    "pause-all": "Paused everything: no processor starts a new call from its next poll.",
    "not-pause-all": "Everything is paused already.",
    "resume-all": "Resumed everything: work is leased again within a lease cycle.",
    "not-resume-all": "Everything was not paused.",
}


@dataclass(frozen=True)
class KeyRow:
    """One key or handler as the Flow page shows it."""

    scope: str
    name: str
    limit: str
    rate: str
    paused: bool
    paused_for: str
    blocked: str
    granted: int
    grants: tuple[Grant, ...]
    # How long ago the last Retry-After hold ended ("12 s"), once it has: holds are
    # short, and an item that keeps answering Retry-After shows as holds again and again.
    held_last: str = ""


async def flow_data(client: AsyncClient) -> dict[str, Any]:
    """What the Flow page shows: the keys and handlers with controls or grants, and
    whether (and for how long) everything is paused.

    Raises:
        DatabaseError: the database failed.
    """
    listing = await read_flow(client, grants=True, limit=FLOW_PAGE)
    now = listing.now.replace(tzinfo=None)
    rows = []
    for row in listing.rows:
        control = row.control
        blocked = blocked_for(control, listing.now)
        until = aware(control.blocked_until)
        until = None if until is None else until.replace(tzinfo=None)
        rows.append(KeyRow(
            scope=control.scope, name=control.name,
            limit="default" if control.max_inflight is None else f"{control.max_inflight:,}",
            rate="default" if control.rate_limit is None else f"{control.rate_limit:g}/s",
            paused=control.paused_at is not None,
            paused_for=age_text(control.paused_at, now),
            blocked=f"{blocked:.1f} s" if blocked else "", granted=row.granted,
            grants=row.grants,
            held_last=age_text(until, now) if until is not None and not blocked else ""))
    return {"keys": [row for row in rows if row.scope == "key"],
            "handlers": [row for row in rows if row.scope != "key"],
            "fleet_paused": listing.fleet_paused_at is not None,
            "fleet_paused_for": age_text(listing.fleet_paused_at, now),
            "more": listing.more}


async def flow_page(console: Console, request: Request, template: str) -> Response:
    """The page (``flow.html``) or its live part (``_flow.html``)."""
    async def page(request: Request) -> Response:
        code = request.query_params.get("notice") or ""
        notice = NOTICES.get(code, "").format(key=repr(request.query_params.get("key", "")))
        return console.render(request, template, notice=notice or None,
                              **await flow_data(console.client))
    return await console.guarded(request, page)


async def flow_action(console: Console, request: Request) -> Response:
    """POST /flow/{pause-key,resume-key,pause-all,resume-all}: check, act, and send the
    browser back to the Flow page with what it did."""
    verb = request.path_params["verb"]
    form = await console.action_form(request, verb, VERBS)
    if isinstance(form, Response):
        return form
    key = form.get("key", "")

    async def act(request: Request) -> Response:
        client = console.client
        if verb == "pause-key":
            changed = await client.pause_key(key)
        elif verb == "resume-key":
            changed = await client.resume_key(key)
        else:
            changed = await (client.pause_all() if verb == "pause-all" else client.resume_all())
        params = f"notice={'' if changed else 'not-'}{verb}"
        if verb.endswith("-key"):
            from urllib.parse import quote

            params += f"&key={quote(key, safe='')}"
        return see_other(f"/flow?{params}")
    return await console.guarded(request, act)


def flow_routes(current: Callable[[], Console]) -> list[Route]:
    """The Flow page, its live part and its actions, over the console ``current()``."""
    async def page(request: Request) -> Response:
        return await flow_page(current(), request, "flow.html")

    async def live(request: Request) -> Response:
        return await flow_page(current(), request, "_flow.html")

    async def action(request: Request) -> Response:
        return await flow_action(current(), request)

    return [Route("/flow", page), Route("/live/flow", live),
            Route("/flow/{verb:str}", action, methods=["POST"])]
