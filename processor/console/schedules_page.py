"""The console's Schedules page (``/schedules``): each schedule with its timing, catch-up
policy, next and last ticks, the partition its last tick created, and the pipeline and
notify URL (masked) its partitions get; with ``pause``, ``resume`` and ``delete`` per
schedule (the last after a confirmation page) and an add form
(:mod:`~processor.console.schedule_form`): the CLI's ``processor schedules`` verbs,
calling the client operations they call. The actions are POSTed as the partition page's
are (same-origin, session token, refused on a read-only console); an unknown schedule
is one line on a 404 page.

:func:`schedules_data` reads and shapes what ``schedules.html`` shows;
:func:`schedules_routes` gives the routes :func:`processor.console.app.create_app` mounts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from processor.client.async_client import AsyncClient
from processor.console.flow_page import Console
from processor.console.forms import page_url, see_other
from processor.console.schedule_form import add_routes
from processor.schedule_views import schedule_dict, timing_text
from processor.views import pipeline_text
from watcher.errors import ScheduleNotFoundError

# Schedules the page shows at most.
SCHEDULES_PAGE = 500
VERBS = ("pause", "resume", "delete")
# What an action did, in the CLI's words (``processor schedules pause`` and the rest).
NOTICES = {
    "added": "schedule {name} added",
    "paused": "schedule {name} paused: no ticks until it is resumed",
    "not-paused": "schedule {name} was paused already",
    "resumed": "schedule {name} resumed from its next tick (the ticks of the pause are "
               "not caught up)",
    "not-resumed": "schedule {name} was running already",
    "deleted": "schedule {name} deleted; the partitions it created stay",
}


@dataclass(frozen=True)
class ScheduleRow:
    """One schedule as the page shows it (times in ISO 8601 UTC, ``-`` for none)."""

    name: str
    when: str
    catch_up: str
    paused: bool
    next_tick: str
    last_tick: str
    last_partition: str | None
    items: int
    pipeline: str  # name@version, or the name alone
    notify: str | None  # its password and query values masked


async def schedules_data(client: AsyncClient) -> dict[str, Any]:
    """What the page shows: the first :data:`SCHEDULES_PAGE` schedules by name.

    Raises:
        DatabaseError: the database failed.
    """
    infos = await client.schedules(SCHEDULES_PAGE + 1)
    rows = []
    for info in infos[:SCHEDULES_PAGE]:
        shown = schedule_dict(info)
        rows.append(ScheduleRow(
            name=info.name, when=timing_text(info),
            catch_up=shown["catch_up"] + (", no overlap" if info.no_overlap else ""),
            paused=shown["paused"], next_tick=shown["next_tick"] or "-",
            last_tick=shown["last_tick"] or "-", last_partition=info.last_partition,
            items=info.item_count,
            pipeline=pipeline_text(info.settings.pipeline, info.settings.pipeline_version),
            notify=shown["notify"]))
    return {"schedules": rows, "more": len(infos) > SCHEDULES_PAGE}


def notice_of(request: Request) -> str | None:
    """The line an action left in the page's address (``?notice=&name=``), or ``None``."""
    code = request.query_params.get("notice") or ""
    return NOTICES[code].format(name=request.query_params.get("name", "")) \
        if code in NOTICES else None


async def guarded_schedule(console: Console, request: Request,
                           page: Callable[[Request], Awaitable[Response]]) -> Response:
    """``page(request)`` guarded as every page is, with an unknown schedule as a 404 page
    that says so in one line."""
    async def checked(request: Request) -> Response:
        try:
            return await page(request)
        except ScheduleNotFoundError as error:
            return console.render(request, "error.html", 404, title="Not found",
                                  message=str(error))
    return await console.guarded(request, checked)


async def schedules_page(console: Console, request: Request) -> Response:
    """The page, with the notice an action left."""
    async def show(request: Request) -> Response:
        return console.render(request, "schedules.html", notice=notice_of(request),
                              **await schedules_data(console.client))
    return await console.guarded(request, show)


async def delete_confirm(console: Console, request: Request) -> Response:
    """GET /schedules/delete?name=: the page that asks before a schedule is deleted."""
    async def page(request: Request) -> Response:
        if console.settings.read_only:
            return console.read_only_refusal(request)
        info = await console.client.schedule(request.query_params.get("name") or "")
        return console.render(request, "schedule_delete.html", info=info,
                              when=timing_text(info))
    return await guarded_schedule(console, request, page)


async def schedule_action(console: Console, request: Request) -> Response:
    """POST /schedules/{pause,resume,delete}: check, act as ``processor schedules VERB``
    does, and send the browser back to the page with what it did."""
    verb = request.path_params["verb"]
    form = await console.action_form(request, verb, VERBS)
    if isinstance(form, Response):
        return form
    name = form.get("name", "")

    async def act(request: Request) -> Response:
        client = console.client
        if verb == "delete":
            await client.delete_schedule(name)
            code = "deleted"
        else:
            changed = await (client.pause_schedule(name) if verb == "pause"
                             else client.resume_schedule(name))
            code = f"{'' if changed else 'not-'}{verb}d"
        return see_other(page_url("/schedules", notice=code, name=name))
    return await guarded_schedule(console, request, act)


def schedules_routes(current: Callable[[], Console]) -> list[Route]:
    """The Schedules page, its add form, its delete confirmation and its actions, over
    the console ``current()``."""
    async def page(request: Request) -> Response:
        return await schedules_page(current(), request)

    async def confirm(request: Request) -> Response:
        return await delete_confirm(current(), request)

    async def action(request: Request) -> Response:
        return await schedule_action(current(), request)

    return [Route("/schedules", page), *add_routes(current),
            Route("/schedules/delete", confirm, methods=["GET"]),
            Route("/schedules/{verb:str}", action, methods=["POST"])]
