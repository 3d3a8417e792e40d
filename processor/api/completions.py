"""The completion routes of ``processor api``: the outside world completes a waiting item.

=======  ===========================================  ================================
POST     ``/v1/completions/{token}``                  complete the wait (the answer as
                                                      JSON, as a handler would answer)
POST     ``/v1/completions/{token}/heartbeat``        move its deadline (``{"timeout"}``)
=======  ===========================================  ================================

The token is the whole capability: these routes need no API token, so a token can go
in an e-mail link or to a third party's webhook. A completion applies exactly once
(:meth:`watcher.store.Store.wait_complete`); any other use of the token answers 409
``already_completed`` and writes nothing; an unknown or malformed token answers 404 and
says nothing else. Bad input answers 400 naming the field, writes nothing, and leaves
the token usable. The token never appears in a log line or an answer.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar
from urllib.parse import unquote

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from processor.api.bodies import read_whole
from processor.api.client_rate import ClientRate, GuessCharge, retry_after
from processor.api.problems import ApiError, bad_request
from processor.wire.completions import decode_completion, json_object
from watcher.errors import AlreadyCompletedError, CompletionRefusedError, WaitNotFoundError
from watcher.rules.spawn import SpawnConflictError
from watcher.store.waits import CompletedWait
from watcher.waits import token_well_formed

if TYPE_CHECKING:
    from processor.api.routes import IngestApi

log = logging.getLogger(__name__)

T = TypeVar("T")

PREFIX: Final = "/v1/completions/"
# The routes as the OpenAPI document names them.
COMPLETION_ROUTES: Final = frozenset({("POST", "/v1/completions/{token}"),
                                      ("POST", "/v1/completions/{token}/heartbeat")})
# A heartbeat or an answer without items is small; its own bound, below the API's.
MAX_HEARTBEAT_BYTES: Final = 4096
# A token is made with its call, but its wait is written only with the answer that
# parks: an outside system may answer before that. A well-formed unknown token is
# looked up again for this long (seconds) before the API says 404 with Retry-After.
NOT_YET_GRACE: Final = 2.0
NOT_YET_STEP: Final = 0.1
RETRY_AFTER_SECONDS: Final = 2


def is_completion_path(raw_path: str) -> bool:
    """Whether ``raw_path`` is one of the completion routes (which need no API token)."""
    return raw_path.startswith(PREFIX)


class CompletionRoutes:
    """ASGI: answers the completion routes itself and hands every other request to
    ``app`` (the API's :class:`~processor.api.routes.Dispatch`), whose error shape and
    handling of unexpected errors it shares."""

    def __init__(self, app: Any, api: IngestApi) -> None:
        self.app = app
        self.api = api
        self.rate = ClientRate(api.limits.completions_per_minute)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw_path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
        raw_path = raw_path.split("?")[0]
        if not is_completion_path(raw_path):
            await self.app(scope, receive, send)
            return
        from processor.api.dispatch import error_response, statefeed_answer

        client = scope.get("client")
        address = str(client[0]) if client else ""
        charge = GuessCharge(self.rate, address)
        try:
            wait = self.rate.exhausted(address)
            if wait:
                raise too_many(wait)
            response = await answer_completion(self.api, Request(scope, receive), raw_path,
                                               charge)
        except ApiError as error:
            response = error_response(error)
            if isinstance(error, NotYetFound):
                response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
        except ClientDisconnect:
            charge.settle(refused=False)
            return
        except Exception as error:
            known = statefeed_answer(error)
            if known is None:
                # The path holds the token: the log line names the route only.
                log.exception("action=api_error method=%s route=completions",
                              scope["method"])
                known = ApiError(500, "internal_error", "the API failed; its log says why")
            response = error_response(known)
        # A guess, or a token no wait has, counts (spent at its first miss already, when
        # it was looked up); a request that found its wait after all costs nothing.
        charge.settle(refused=response.status_code == 404)
        await response(scope, receive, send)


def too_many(wait: float) -> ApiError:
    """The answer to a client whose bucket of refused lookups is empty for ``wait`` s."""
    return ApiError(429, "too_many_requests", "too many refused completion tokens from "
                    "this address; try again after Retry-After seconds",
                    headers={"retry-after": retry_after(wait)})


def not_found() -> ApiError:
    """The answer for an unknown or malformed token, or a path under the prefix that no
    route has: it says nothing about any wait."""
    return ApiError(404, "not_found", "no wait has this completion token")


class NotYetFound(ApiError):
    """A 404 that comes with ``Retry-After``: see :func:`not_yet_found`."""


def not_yet_found() -> ApiError:
    """The answer for a well-formed token no wait had within :data:`NOT_YET_GRACE`: maybe
    unknown, maybe made by a call whose parking answer is not written yet. Nothing was
    written; ``Retry-After`` says when trying again may find it."""
    return NotYetFound(404, "not_found",
                       "no wait has this completion token (yet: a wait is written when its "
                       "handler's answer is; nothing was written, so retrying later is safe)")


async def _patiently(attempt: Callable[[], Awaitable[T]], token: str,
                     charge: GuessCharge) -> T:
    """``attempt()``, tried again every :data:`NOT_YET_STEP` seconds while no wait has the
    well-formed ``token``, up to :data:`NOT_YET_GRACE` seconds: the outside system
    may complete a wait before the answer that parks it is written.

    The first miss spends the request's ``charge`` before any wait, so that guesses sent
    at once are counted as they arrive, not as their 404s go out seconds later; when
    the client's bucket is empty the request is refused then.

    Raises:
        ApiError: 404 when no wait had the token (with ``Retry-After`` when it is
            well-formed); 429 with ``Retry-After`` when its first miss found the
            client's bucket of refused lookups empty.
    """
    if not token_well_formed(token):
        raise not_found()
    give_up = time.monotonic() + NOT_YET_GRACE
    while True:
        try:
            return await attempt()
        except WaitNotFoundError:
            wait = charge.spend()
            if wait:
                raise too_many(wait) from None
            if time.monotonic() >= give_up:
                raise not_yet_found() from None
        await asyncio.sleep(NOT_YET_STEP)


async def answer_completion(api: IngestApi, request: Request, raw_path: str,
                            charge: GuessCharge) -> Response:
    """Route and answer one request under ``/v1/completions/``; a lookup that misses
    spends ``charge`` (:func:`_patiently`).

    Raises:
        ApiError: 404, 405, 400 or 413 as the module says; 409 for a used token; 429
            when a lookup missed and the client's bucket of refused lookups is empty.
    """
    token, _, rest = raw_path[len(PREFIX):].partition("/")
    token = unquote(token)
    if rest not in ("", "heartbeat"):
        raise not_found()
    if request.method != "POST":
        raise ApiError(405, "method_not_allowed",
                       f"{request.method} is not allowed here; this route takes POST",
                       headers={"allow": "POST"})
    store = api.client.store
    try:
        if rest == "heartbeat":
            document = _heartbeat(await read_whole(request, MAX_HEARTBEAT_BYTES))
            unknown = sorted(set(document) - {"timeout"})
            if unknown or "timeout" not in document:
                raise bad_request("a heartbeat's body is {\"timeout\": seconds}",
                                  field=unknown[0] if unknown else "timeout")
            deadline = await _patiently(
                lambda: store.wait_heartbeat(token, document["timeout"]), token, charge)
            return JSONResponse({"deadline": deadline.isoformat() + "Z"}, 200)
        body = await read_whole(request, api.limits.max_body_bytes)
        try:
            answer = decode_completion(body)
        except CompletionRefusedError as error:
            raise bad_request(str(error), field=error.field) from None
        # The client's path (its span links to the parking call's; its log line).
        done = await _patiently(lambda: api.client.complete_answer(
            token, answer, max_data_bytes=api.limits.max_item_bytes), token, charge)
    except WaitNotFoundError:
        raise not_found() from None
    except AlreadyCompletedError as error:
        raise ApiError(409, "already_completed", str(error)) from None
    except CompletionRefusedError as error:
        raise bad_request(str(error), field=error.field) from None
    except SpawnConflictError as error:
        raise bad_request(str(error), field="spawn") from None
    mark_span(done)
    return JSONResponse(completed_view(done), 200)


def mark_span(done: CompletedWait) -> None:
    """Name the completed item on the current span, when an instrumented API has one
    (its attributes: ``statefeed.partition``, ``statefeed.item``, ``statefeed.gate``,
    ``statefeed.status``; never the token). Without OpenTelemetry loaded, nothing."""
    if "opentelemetry.trace" not in sys.modules:
        return
    from opentelemetry import trace

    trace.get_current_span().set_attributes({
        "statefeed.partition": done.partition_id, "statefeed.item": done.item_id,
        "statefeed.gate": done.gate, "statefeed.status": done.status})


def completed_view(done: CompletedWait) -> dict[str, Any]:
    """The 200 answer of a completion: the item's new state, and the new token when
    the answer parked it again."""
    view: dict[str, Any] = {"partition_id": done.partition_id, "item_id": done.item_id,
                            "status": done.status, "gate": done.gate,
                            "attempts": done.attempts, "last_error": done.last_error}
    if done.completion_token is not None:
        view["completion_token"] = done.completion_token
    return view


def _heartbeat(body: bytes) -> dict[str, Any]:
    """A heartbeat's body as a JSON object (an empty body is ``{}``), read as strictly
    as a completion's (no key twice).

    Raises:
        ApiError: 400 when it is not a JSON object, naming a repeated key.
    """
    try:
        document = json_object(body)
    except CompletionRefusedError as error:
        raise bad_request(str(error), field=error.field) from None
    if not isinstance(document, dict):
        raise bad_request("the body must be a JSON object such as {\"timeout\": 3600}",
                          field="body")
    return document
