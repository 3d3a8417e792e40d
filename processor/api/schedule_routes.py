"""The ingest API's schedule routes, mounted in front of the partition routes
(:func:`mount_schedules`):

=======  ==================================  ============================================
GET      ``/v1/schedules``                   the schedules by name (``?limit=&after=``)
PUT      ``/v1/schedules/{name}``            add one (JSON: cron or every, items, settings)
GET      ``/v1/schedules/{name}``            read one: timing, settings, next and last ticks
DELETE   ``/v1/schedules/{name}``            delete one (its partitions stay)
POST     ``/v1/schedules/{name}/pause``      pause it
POST     ``/v1/schedules/{name}/resume``     resume it from its next tick
=======  ==================================  ============================================

Requests pass the API's gate (its token and loopback rules) before they get here;
errors have the API's one shape.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote, unquote_to_bytes

from starlette.requests import Request
from starlette.responses import Response

from processor.api.bodies import media_type, read_whole
from processor.api.dispatch import error_response, statefeed_answer
from processor.api.problems import ApiError, bad_request, from_statefeed, unsupported_media
from processor.api.routes import IngestApi, answer
from processor.api.upload import JSON_TYPES, json_document, json_items
from processor.api.views import only, whole_number
from processor.client.schedules import MAX_SCHEDULES_PAGE, check_schedule_name
from processor.schedule_views import schedule_dict
from watcher.errors import InvalidInputError, ScheduleExistsError, ScheduleNotFoundError

log = logging.getLogger(__name__)

PREFIX = "/v1/schedules"
ADD_FIELDS = frozenset({"cron", "timezone", "every", "catch_up", "no_overlap", "items",
                        "reduce_gates", "on_item_failure", "key", "priority", "notify",
                        "pipeline", "pipeline_version"})
# The fields a refused setting is named by, in the order a message is searched for them.
TARGET_FIELDS = ("notify", "pipeline_version", "pipeline")
DEFAULT_LIMIT = 1000

Route = Callable[["ScheduleRoutes", Request, str], Awaitable[Response]]
# (method, path template) of every route here, as the OpenAPI document names them.
SCHEDULE_ROUTES = frozenset({
    ("GET", PREFIX), ("PUT", PREFIX + "/{name}"), ("GET", PREFIX + "/{name}"),
    ("DELETE", PREFIX + "/{name}"), ("POST", PREFIX + "/{name}/pause"),
    ("POST", PREFIX + "/{name}/resume")})


def _problem(error: Exception) -> ApiError | None:
    """The answer for a schedule's error (404, 409) or any other statefeed error."""
    if isinstance(error, ScheduleNotFoundError):
        return ApiError(404, "schedule_not_found", str(error), "name")
    if isinstance(error, ScheduleExistsError):
        return ApiError(409, "schedule_exists", str(error), "name")
    if isinstance(error, Exception):
        return statefeed_answer(error)
    return None


class ScheduleRoutes:
    """The schedule routes over the API's client; other paths go on to ``app``."""

    def __init__(self, app: Any, api: IngestApi) -> None:
        self.app = app
        self.api = api

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        raw_path = ""
        if scope["type"] == "http":
            raw_path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
            raw_path = raw_path.split("?")[0]
        if raw_path != PREFIX and not raw_path.startswith(PREFIX + "/"):
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            response = await self._answer(request, raw_path[len(PREFIX):])
        except ApiError as error:
            response = error_response(error)
        except Exception as error:
            known = _problem(error)
            if known is None:
                log.exception("action=api_error method=%s path=%r", request.method, raw_path)
                known = ApiError(500, "internal_error", "the API failed; its log says why")
            response = error_response(known)
        await response(scope, receive, send)

    async def _answer(self, request: Request, rest: str) -> Response:
        segments = rest.split("/")[1:]
        handlers: dict[str, Route]
        if not segments:
            handlers, name = {"GET": ScheduleRoutes.listing}, ""
        elif len(segments) == 1:
            handlers, name = {"PUT": ScheduleRoutes.add, "GET": ScheduleRoutes.read,
                              "DELETE": ScheduleRoutes.delete}, segments[0]
        elif len(segments) == 2 and segments[1] in ("pause", "resume"):
            handlers = {"POST": ScheduleRoutes.pause if segments[1] == "pause"
                        else ScheduleRoutes.resume}
            name = segments[0]
        else:
            raise ApiError(404, "not_found", f"no route {PREFIX + rest!r}: see "
                           "/v1/openapi.json for the routes")
        if request.method not in handlers:
            allowed = ", ".join(sorted(handlers))
            refusal = error_response(ApiError(
                405, "method_not_allowed",
                f"{request.method} is not allowed here; this route takes {allowed}"))
            refusal.headers["allow"] = allowed
            return refusal
        if segments:
            name = self._name(name)
        return await handlers[request.method](self, request, name)

    @staticmethod
    def _name(raw: str) -> str:
        try:
            return check_schedule_name(unquote_to_bytes(raw).decode())
        except (UnicodeDecodeError, InvalidInputError) as error:
            message = (str(error) if isinstance(error, InvalidInputError)
                       else "the schedule name is not UTF-8 once percent-decoded")
            raise ApiError(422, "invalid_input", message, "name") from None

    async def listing(self, request: Request, name: str) -> Response:
        query = request.query_params
        only(query, frozenset({"limit", "after"}))
        limit = whole_number(query, "limit", DEFAULT_LIMIT, low=1,
                             high=MAX_SCHEDULES_PAGE) or DEFAULT_LIMIT
        infos = await self.api.client.schedules(limit, after=query.get("after"))
        cursor = infos[-1].name if len(infos) == limit else None
        return answer(200, {"schedules": [schedule_dict(info) for info in infos],
                            "next_cursor": cursor})

    async def add(self, request: Request, name: str) -> Response:
        only(request.query_params, frozenset())
        limits = self.api.limits
        if media_type(request) not in JSON_TYPES:
            raise unsupported_media(request.headers.get("content-type"),
                                    example='{"cron": "0 3 * * *"}')
        body = await read_whole(request, limits.max_body_bytes)
        document = json_document(body, ADD_FIELDS)
        for field, kinds in (("cron", (str,)), ("timezone", (str,)), ("every", (int, float)),
                             ("catch_up", (str,)), ("no_overlap", (bool,)),
                             ("on_item_failure", (str,)), ("priority", (int,)),
                             ("notify", (str,)), ("pipeline", (str,)),
                             ("pipeline_version", (str,))):
            value = document.get(field)
            if value is not None and (not isinstance(value, kinds) or (
                    isinstance(value, bool) and bool not in kinds)):
                raise bad_request(f"'{field}' has the wrong type; see the ScheduleRequest "
                                  "schema", field=field)
        items = json_items(f"{name}/<tick>", document.get("items"), limits, allow_empty=True)
        priority = document.get("priority")
        try:
            info = await self.api.client.add_schedule(
                name, cron=document.get("cron"), timezone=document.get("timezone"),
                every=document.get("every"), items=items,
                reduce_gates=document.get("reduce_gates") or (),
                on_item_failure=document.get("on_item_failure") or "fail",
                priority=0 if priority is None else priority, key=document.get("key"),
                catch_up=document.get("catch_up") or "skip",
                no_overlap=document.get("no_overlap") is True, notify=document.get("notify"),
                pipeline=document.get("pipeline"),
                pipeline_version=document.get("pipeline_version"))
        except InvalidInputError as error:
            text = str(error)
            named = next((name for name in TARGET_FIELDS
                          if text.startswith(f"{name} ") or f"': {name} " in text), None)
            if named is None:
                raise
            raise from_statefeed(error, field=named) from None
        log.info("action=api_schedule_added schedule=%r", name)
        return answer(201, schedule_dict(info),
                      ("location", f"{PREFIX}/{quote(name, safe='')}"))

    async def read(self, request: Request, name: str) -> Response:
        only(request.query_params, frozenset())
        return answer(200, schedule_dict(await self.api.client.schedule(name)))

    async def delete(self, request: Request, name: str) -> Response:
        only(request.query_params, frozenset())
        await self.api.client.delete_schedule(name)
        log.info("action=api_schedule_deleted schedule=%r", name)
        return answer(200, {"name": name, "deleted": True})

    async def pause(self, request: Request, name: str) -> Response:
        only(request.query_params, frozenset())
        changed = await self.api.client.pause_schedule(name)
        return answer(200, {"name": name, "paused": changed,
                            "schedule": schedule_dict(await self.api.client.schedule(name))})

    async def resume(self, request: Request, name: str) -> Response:
        only(request.query_params, frozenset())
        changed = await self.api.client.resume_schedule(name)
        return answer(200, {"name": name, "resumed": changed,
                            "schedule": schedule_dict(await self.api.client.schedule(name))})


def mount_schedules(app: Any, api: IngestApi) -> ScheduleRoutes:
    """``app`` (the partition routes over ``api``) with the schedule routes in front."""
    return ScheduleRoutes(app, api)
