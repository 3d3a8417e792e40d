"""The console's web application: Starlette routes over one :class:`AsyncClient`, pages
rendered by Jinja2 templates (autoescaped), and the fragments the pages poll.

Pages: ``/`` (overview), ``/partitions`` (the list, with filters and paging, and the
items whose id is the search text), ``/partition?id=...`` (one partition: gates, its
timeline, reduce, result, items) and ``/item?partition=...&id=...`` (one item: data,
error history), ``/flow`` (keys' limits, pauses and grants,
:mod:`~processor.console.flow_page`), ``/schedules`` (next and last ticks; pause, resume,
delete, add: :mod:`~processor.console.schedules_page`), and ``/notifications`` (the
outbox's counts and its dead events, with a redeliver each,
:mod:`~processor.console.notifications_page`). Each page has a ``/live/...`` twin that
renders only its changing part; the page's script fetches it every refresh and patches
the page in place (the partition page follows its live feed too,
``/live/partition/events``: :mod:`~processor.console.feed_page`). Actions are POSTs to
``/partition/retry``, ``/partition/cancel``, ``/partition/pause``,
``/partition/resume`` and ``/partition/delete`` (the last after a confirmation
page), each calling the client operation the CLI's verb calls. Ids travel as query
parameters, so any id (slashes, spaces, markup) has an address.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from importlib.resources import files
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from processor.client.async_client import AsyncClient
from processor.console.bulk_page import bulk_notice, bulk_routes
from processor.console.feed_page import feed_routes
from processor.console.flow_page import flow_routes
from processor.console.forms import MAX_FORM_BYTES, Form, count_param, page_url
from processor.console.forms import read_form as _form
from processor.console.forms import see_other as _see
from processor.console.item_page import ItemQueryError, item_data, item_routes, items_found
from processor.console.notifications_page import notifications_routes
from processor.console.reads import BadRequest, list_data, overview_data, partition_data
from processor.console.replay_page import replay_routes
from processor.console.rewind_page import rewind_routes
from processor.console.schedules_page import schedules_routes
from processor.console.security import (
    Access,
    Guard,
    Keys,
    Receive,
    Scope,
    Send,
    local_path,
    same_origin,
    token_matches,
)
from processor.console.settings import REFRESH_MS, ConsoleSettings, settings_for
from processor.console.views import pages
from processor.console.views.leases_view import lease_of
from processor.feed.hub import FeedHub
from watcher.errors import (
    DatabaseError,
    InvalidInputError,
    ItemNotFoundError,
    PartitionLeasedError,
    PartitionNotFoundError,
)

log = logging.getLogger(__name__)

# The settings live in processor.console.settings; callers import them from here too.
__all__ = ["REFRESH_MS", "Console", "ConsoleSettings", "create_app", "settings_for",
           "templates"]

def templates() -> Environment:
    """The Jinja2 environment of the console's templates: every value is HTML-escaped."""
    env = Environment(loader=PackageLoader("processor.console", "templates"),
                      autoescape=True, undefined=StrictUndefined, trim_blocks=True,
                      lstrip_blocks=True)
    env.globals["url"] = page_url
    env.filters["number"] = lambda value: f"{value:,}"
    return env


class Console:
    """The routes of one console, over ``client``."""

    def __init__(self, settings: ConsoleSettings, client: AsyncClient) -> None:
        self.settings = settings
        self.client = client
        self.env = templates()
        database = settings.db_url.dialect
        self.database = database + (f" · prefix {settings.table_prefix}"
                                    if settings.table_prefix else "")

    # -- rendering -----------------------------------------------------------

    def render(self, request: Request, name: str, status_code: int = 200,
               **context: Any) -> HTMLResponse:
        access: Access | None = request.scope.get("state", {}).get("access")
        context.setdefault("signed_out", False)
        html = self.env.get_template(name).render(
            read_only=self.settings.read_only, csrf=access.csrf if access else "",
            database=self.database, refresh_ms=self.settings.refresh_ms,
            path=request.url.path, **context)
        return HTMLResponse(html, status_code=status_code)

    async def guarded(self, request: Request,
                      page: Callable[[Request], Awaitable[Response]]) -> Response:
        """``page(request)``, with a bad parameter as 400, an unknown partition or item
        as 404 and a database failure as 503, each on a page that says so (without the
        URL). A live fragment's failure is a fragment too, which the page shows in place."""
        template = "_error.html" if request.url.path.startswith("/live/") else "error.html"
        try:
            return await page(request)
        except (PartitionNotFoundError, ItemNotFoundError) as error:
            return self.render(request, template, 404, title="Not found", message=str(error))
        except (BadRequest, ItemQueryError, InvalidInputError) as error:
            return self.render(request, template, 400, title="Bad request",
                               message=str(error))
        except DatabaseError as error:
            log.warning("action=console_database_error error=%s", error)
            return self.render(request, template, 503, title="Database unavailable",
                               message="The database did not answer; the console's log "
                               "says why. The page tries again by itself.")

    # -- pages ----------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        async def page(request: Request) -> Response:
            return self.render(request, "overview.html", **await overview_data(self.client))
        return await self.guarded(request, page)

    async def overview_live(self, request: Request) -> Response:
        async def page(request: Request) -> Response:
            return self.render(request, "_overview.html", **await overview_data(self.client))
        return await self.guarded(request, page)

    async def partitions(self, request: Request) -> Response:
        async def page(request: Request) -> Response:
            notice = pages.notice_text(request.query_params.get("notice"),
                                       id=request.query_params.get("id", ""),
                                       count=count_param(request.query_params.get("count"))
                                       ) or bulk_notice(request.query_params)
            found = await items_found(self.client, request.query_params.get("prefix", ""))
            return self.render(request, "partitions.html", notice=notice, found=found,
                               **await list_data(self.client, request.query_params))
        return await self.guarded(request, page)

    async def partitions_live(self, request: Request) -> Response:
        async def page(request: Request) -> Response:
            data = await list_data(self.client, request.query_params)
            return self.render(request, "_partitions.html", **data)
        return await self.guarded(request, page)

    async def partition(self, request: Request) -> Response:
        async def page(request: Request) -> Response:
            data = await partition_data(self.client, request.query_params)
            code = request.query_params.get("notice")
            notice = (pages.retry_notice(data["info"].id, request.query_params)
                      if code == "retried" else
                      pages.notice_text(code, status=data["info"].status,
                                        count=count_param(request.query_params.get("count"))))
            return self.render(request, "partition.html", notice=notice, **data)
        return await self.guarded(request, page)

    async def partition_live(self, request: Request) -> Response:
        async def page(request: Request) -> Response:
            data = await partition_data(self.client, request.query_params)
            return self.render(request, "_partition.html", **data)
        return await self.guarded(request, page)

    async def item(self, request: Request) -> Response:
        async def page(request: Request) -> Response:
            values = await item_data(self.client, request.query_params)
            values["api_known"] = self.settings.api_url is not None
            return self.render(request, "item.html", **values)
        return await self.guarded(request, page)

    async def delete_confirm(self, request: Request) -> Response:
        async def page(request: Request) -> Response:
            if self.settings.read_only:
                return self.read_only_refusal(request)
            partition_id = request.query_params.get("id") or ""
            info = await self.client.partition(partition_id)
            now = await self.client.now()
            return self.render(request, "delete.html", info=info,
                               lease=lease_of(info, now), error=None, force=False,
                               total=sum(info.counts.values()))
        return await self.guarded(request, page)

    # -- actions ----------------------------------------------------------------

    async def action(self, request: Request) -> Response:
        """POST /partition/{retry,cancel,delete,pause,resume}: check, act, and send the
        browser on."""
        verb = request.path_params["verb"]
        form = await self.action_form(request, verb,
                                      ("retry", "cancel", "delete", "pause", "resume"))
        if isinstance(form, Response):
            return form
        partition_id = form.get("id", "")

        async def act(request: Request) -> Response:
            if verb == "retry":
                report = await self.client.retry_failed(partition_id)
                return _see(page_url("/partition", id=partition_id, notice="retried",
                                     **pages.retry_notice_params(report)))
            if verb == "cancel":
                cancelled = await self.client.cancel(partition_id)
                return _see(page_url("/partition", id=partition_id,
                                     notice="cancelled" if cancelled else "not-cancelled"))
            if verb in ("pause", "resume"):
                changed = await getattr(self.client, verb)(partition_id)
                return _see(page_url("/partition", id=partition_id,
                                     notice=f"{'' if changed else 'not-'}{verb}d"))
            force = form.get("force") == "yes"
            try:
                deleted = await self.client.delete_partition(partition_id, force=force)
            except PartitionLeasedError as error:
                info = await self.client.partition(partition_id)
                now = await self.client.now()
                return self.render(request, "delete.html", 409, info=info,
                                   lease=lease_of(info, now), error=str(error),
                                   force=True, total=sum(info.counts.values()))
            return _see(page_url("/partitions", notice="deleted", id=partition_id,
                                 count=deleted))
        return await self.guarded(request, act)

    async def action_form(self, request: Request, verb: str,
                          verbs: Collection[str]) -> Response | Form:
        """The form of an action's POST, or the page refusing it: 404 for a verb not in
        ``verbs``, 403 on a read-only console or from another site."""
        if verb not in verbs:
            return self.render(request, "error.html", 404, title="Not found",
                               message="There is no such action.")
        if self.settings.read_only:
            return self.read_only_refusal(request)
        return await self.refuse_cross_site(request)

    async def refuse_cross_site(self, request: Request) -> Response | Form:
        """The form of a POST from a page of this console, or the 403 refusing it."""
        if not same_origin(request.headers.get("origin"), request.headers.get("referer"),
                           request.headers.get("host", "")):
            return self.render(request, "error.html", 403, title="Refused",
                               message="This request did not come from a page of this "
                               "console (cross-site requests are refused).")
        form = await _form(request)
        if form is None:
            return self.render(request, "error.html", 400, title="Bad request",
                               message="Send the form as application/x-www-form-urlencoded, "
                               f"at most {MAX_FORM_BYTES} bytes.")
        access: Access | None = request.scope.get("state", {}).get("access")
        if access is None or not request.app.state.keys.csrf_matches(access.session,
                                                                     form.get("csrf")):
            return self.render(request, "error.html", 403, title="Refused",
                               message="The form's session token is missing or stale: "
                               "reload the page and try again.")
        return form

    def read_only_refusal(self, request: Request) -> Response:
        return self.render(request, "error.html", 403, title="Read-only",
                           message="This console is read-only: it shows partitions but "
                           "does not retry, cancel, pause or delete them.")

    # -- signing in ------------------------------------------------------------

    async def login(self, request: Request) -> Response:
        """GET shows the token form; POST checks the token and starts a session."""
        token = self.settings.token
        target = local_path(request.query_params.get("next"))
        if token is None:
            return RedirectResponse("/", status_code=303)
        if request.method == "GET":
            return self.render(request, "login.html", 200, next=target, error=None,
                               signed_out=True)
        if not same_origin(request.headers.get("origin"), request.headers.get("referer"),
                           request.headers.get("host", "")):
            return self.render(request, "login.html", 403, next=target, signed_out=True,
                               error="Cross-site sign-in refused.")
        form: dict[str, str] = await _form(request) or {}
        target = local_path(form.get("next"))
        if not token_matches(form.get("token"), token):
            return self.render(request, "login.html", 401, next=target, signed_out=True,
                               error="That is not this console's token.")
        response = _see(target)
        response.headers.append("set-cookie",
                                request.app.state.guard.sign_in_cookie(request.scope))
        return response

    async def unauthorised(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The 401 answer to a request without the token: the sign-in form."""
        request = Request(scope, receive)
        target = page_url(request.url.path, **dict(request.query_params))
        if request.url.path.startswith("/live/") or request.method != "GET":
            target = "/"
        response = self.render(request, "login.html", 401, next=local_path(target),
                               error=None, signed_out=True)
        response.headers["www-authenticate"] = 'Bearer realm="statefeed console"'
        await response(scope, receive, send)


async def _no_icon(request: Request) -> Response:
    return Response(status_code=204)


def create_app(settings: ConsoleSettings, client: AsyncClient | None = None,
               feed: FeedHub | None = None) -> Any:
    """The console as an ASGI application, guarded (see :mod:`processor.console.security`).

    Without ``client`` it opens its own on ``settings.db_url`` when it starts and closes
    it when it stops; a given client is left open. ``feed``: the live feed's hub (one of
    its own when not given).
    """
    keys = Keys(settings.token)
    holder: dict[str, AsyncClient] = {}
    console: Console | None = None

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if client is None:
            opened = AsyncClient(settings.db_url, settings.table_prefix,
                                 notify_default=settings.notify_default)
            holder["client"] = opened
            try:
                yield
            finally:
                await opened.close()
        else:
            yield

    def current() -> Console:
        nonlocal console
        if console is None:
            console = Console(settings, client or holder["client"])
        return console

    def route(name: str) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return await getattr(current(), name)(request)
        return endpoint

    static = str(files("processor.console") / "static")
    app = Starlette(routes=[
        Route("/", route("overview")),
        Route("/partitions", route("partitions")),
        *bulk_routes(current),
        Route("/partition", route("partition")),
        Route("/item", route("item")),
        *replay_routes(current), *item_routes(current), *rewind_routes(current),
        Route("/partition/delete", route("delete_confirm"), methods=["GET"]),
        Route("/partition/{verb:str}", route("action"), methods=["POST"]),
        Route("/live/overview", route("overview_live")),
        Route("/live/partitions", route("partitions_live")),
        Route("/live/partition", route("partition_live")),
        *feed_routes(current, feed or FeedHub()),
        *flow_routes(current),
        *schedules_routes(current),
        *notifications_routes(current),
        Route("/login", route("login"), methods=["GET", "POST"]),
        Route("/favicon.ico", _no_icon),
        Mount("/static", StaticFiles(directory=static), name="static"),
    ], lifespan=lifespan)

    async def unauthorised(scope: Scope, receive: Receive, send: Send) -> None:
        await current().unauthorised(scope, receive, send)

    guard = Guard(app, keys=keys, loopback_only=settings.loopback_only, port=settings.port,
                  unauthorised=unauthorised)
    app.state.keys = keys
    app.state.guard = guard
    return guard
