"""Routing the ingest API's requests: a raw path to its route and the id in it, one
refusal for a query parameter given twice, and every error in the one error shape.

The route table is :mod:`processor.api.routes`'s; this module knows only its form:
templates of path segments, where ``{id}`` (a partition) or ``{key}`` (a concurrency
key) stands for one percent-encoded segment, each with its handlers by method.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import unquote_to_bytes

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from processor.api.problems import ApiError, bad_request, from_statefeed
from processor.client.checks import check_id
from processor.client.flow import checked_key_name
from watcher.errors import InvalidInputError, StatefeedError

log = logging.getLogger(__name__)

PARTITION = "{id}"
KEY = "{key}"
STATIC_METHODS = frozenset({"GET", "HEAD"})
OPENAPI_PATH = ("v1", "openapi.json")
HEALTH_PATH = ("healthz",)
STATIC_ROUTES = {OPENAPI_PATH, HEALTH_PATH}

Handler = Callable[[Any, Request, str], Awaitable[Response]]
Routes = Mapping[tuple[str, ...], Mapping[str, Handler]]


def answer(status: int, document: dict[str, Any], *headers: tuple[str, str]) -> Response:
    """A JSON answer."""
    return JSONResponse(document, status, headers=dict(headers))


def error_response(error: ApiError) -> Response:
    """The answer of an error, in the one error shape. A database that failed is logged
    too (one WARNING per answer, its message free of secrets), so that the operator
    sees what callers are told."""
    if error.code == "database_unavailable":
        log.warning("action=api_database_unavailable status=%d error=%s", error.status,
                    " ".join(error.message.split()))
    return Response(error.body(), error.status, media_type="application/json",
                    headers=error.headers or None)


def _path_value(placeholder: str, segment: str) -> str:
    """The id or key a path segment names, percent-decoded and checked.

    Raises:
        ApiError: 400 when it is not UTF-8 once decoded, 422 when the rules refuse it.
    """
    field = "partition_id" if placeholder == PARTITION else "key"
    try:
        value = unquote_to_bytes(segment).decode()
    except UnicodeDecodeError:
        raise bad_request(f"the {'partition id' if field == 'partition_id' else 'key'} is "
                          "not UTF-8 once percent-decoded", field=field) from None
    try:
        return (check_id("partition", value) if placeholder == PARTITION
                else checked_key_name(value))
    except InvalidInputError as error:
        raise from_statefeed(error, field=field) from None


def resolve(raw_path: str, routes: Routes) -> tuple[tuple[str, ...], str]:
    """The route template a raw (still percent-encoded) path matches, and the partition
    id or key in it (``""`` for routes without one).

    Raises:
        ApiError: 404 for a path no route has; 400 or 422 for an id or key that is not
            UTF-8 or that the rules refuse.
    """
    segments = tuple(raw_path.split("/")[1:])
    if segments in STATIC_ROUTES or segments in routes:
        return segments, ""
    if len(segments) >= 3:
        for placeholder in (PARTITION, KEY):
            template = (*segments[:2], placeholder, *segments[3:])
            if template in routes:
                return template, _path_value(placeholder, segments[2])
    raise ApiError(404, "not_found", f"no route {raw_path!r}: see /v1/openapi.json for the "
                   "routes")


def refuse_repeated_parameters(request: Request) -> None:
    """Refuse a query parameter given more than once: which one counts is not obvious.

    Raises:
        ApiError: 400 naming the parameter.
    """
    seen: set[str] = set()
    for name, _ in request.query_params.multi_items():
        if name in seen:
            raise bad_request(f"query parameter {name!r} is given more than once; give it "
                              "once", field=name)
        seen.add(name)


def statefeed_answer(error: Exception) -> ApiError | None:
    """The answer for one of statefeed's errors; ``None`` for any other error, and for
    one of statefeed's that has no answer (an internal error: 500)."""
    if not isinstance(error, StatefeedError):
        return None
    try:
        return from_statefeed(error)
    except StatefeedError:
        return None


class Router:
    """The ASGI app of a route table over one API object: resolves each request, runs
    its handler, and turns every error into the one error shape (an unexpected one
    into a 500 that is logged, never a traceback in the answer). ``api`` has
    ``lifespan(app)``, an async context manager, and ``openapi()``, the document."""

    def __init__(self, api: Any, routes: Routes) -> None:
        self.api = api
        self.routes = routes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        raw_path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
        try:
            response = await self._answer(request, raw_path.split("?")[0])
        except ClientDisconnect:
            log.info("action=api_request_abandoned method=%s path=%r: the client went away "
                     "before the body ended; nothing was written", scope["method"], raw_path)
            return
        await response(scope, receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        await receive()  # lifespan.startup
        try:
            async with self.api.lifespan(None):
                await send({"type": "lifespan.startup.complete"})
                await receive()  # lifespan.shutdown
        except Exception as error:
            log.exception("action=api_start_failed")
            await send({"type": "lifespan.startup.failed", "message": str(error)})
            return
        await send({"type": "lifespan.shutdown.complete"})

    async def _answer(self, request: Request, raw_path: str) -> Response:
        try:
            template, captured = resolve(raw_path, self.routes)
            method = request.method
            if template == HEALTH_PATH and method in STATIC_METHODS:
                return answer(200, {"status": "ok"})
            if template == OPENAPI_PATH and method in STATIC_METHODS:
                return Response(self.api.openapi(), media_type="application/json")
            handlers = self.routes.get(template, {})
            if method not in handlers:
                allowed = ", ".join(sorted(handlers or STATIC_METHODS))
                refusal = error_response(ApiError(
                    405, "method_not_allowed",
                    f"{method} is not allowed here; this route takes {allowed}"))
                refusal.headers["allow"] = allowed  # RFC 9110: a 405 says what is allowed
                return refusal
            refuse_repeated_parameters(request)
            return await handlers[method](self.api, request, captured)
        except ApiError as error:
            return error_response(error)
        except ClientDisconnect:
            raise
        except Exception as error:
            known = statefeed_answer(error)
            if known is not None:
                return error_response(known)
            log.exception("action=api_error method=%s path=%r", request.method, raw_path)
            return error_response(ApiError(500, "internal_error",
                                           "the API failed; its log says why"))
