"""The console's Schedules page (``/schedules``): each schedule with its timing, catch-up
policy, next and last ticks, the partition its last tick created, and the pipeline and
notify URL (masked) its partitions get. Read-only: the
verbs are the CLI's, the client's and the API's.

:func:`schedules_data` reads and shapes what ``schedules.html`` shows;
:func:`schedules_routes` gives the route :func:`processor.console.app.create_app` mounts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from processor.client.async_client import AsyncClient
from processor.schedule_views import schedule_dict, timing_text
from processor.views import pipeline_text

# Schedules the page shows at most.
SCHEDULES_PAGE = 500


class Console(Protocol):
    """What the Schedules page needs of a console (:class:`processor.console.app.Console`
    is one); a protocol, so that the page imports nothing of the app that mounts it."""

    @property
    def client(self) -> AsyncClient:
        """The client the console reads through."""
        ...

    def render(self, request: Request, name: str, status_code: int = 200,
               **context: Any) -> Response:
        """The page ``name`` rendered with ``context``."""
        ...

    async def guarded(self, request: Request,
                      page: Callable[[Request], Awaitable[Response]]) -> Response:
        """``page(request)``, with its failures as pages that say what went wrong."""
        ...


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


def schedules_routes(current: Callable[[], Console]) -> list[Route]:
    """The Schedules page over the console ``current()``."""
    async def page(request: Request) -> Response:
        console = current()

        async def show(request: Request) -> Response:
            return console.render(request, "schedules.html",
                                  **await schedules_data(console.client))
        return await console.guarded(request, show)

    return [Route("/schedules", page)]
