"""The ingest API's flow-control routes, the client's verbs over HTTP
(:class:`~processor.client.flow.FlowClient`):

=======  =====================================  =======================================
GET      ``/v1/keys``                           a page of keys with a limit, pause or block
POST     ``/v1/keys/{key}/limits``              set a key's limits across the fleet
POST     ``/v1/keys/{key}/pause``               pause every partition of a key
POST     ``/v1/keys/{key}/resume``              lift a key's pause
GET      ``/v1/fleet``                          whether everything is paused
POST     ``/v1/fleet/pause``                    pause everything
POST     ``/v1/fleet/resume``                   lift the pause of everything
=======  =====================================  =======================================

Each handler takes the API (:class:`~processor.api.routes.IngestApi`), the request
and the key in the path (``""`` where there is none).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from processor.client.async_client import AsyncClient

from starlette.requests import Request
from starlette.responses import Response

from processor.api.bodies import media_type, read_whole
from processor.api.dispatch import KEY, Handler, answer
from processor.api.problems import bad_request, unsupported_media
from processor.api.upload import JSON_TYPES, Limits, json_document
from processor.api.views import only, page_limit, timestamp
from processor.client.flow import (
    MAX_CONTROLS_PAGE,
    checked_inflight_limit,
    checked_key_name,
    checked_rate,
)
from watcher.models import FlowScope
from watcher.reports import FlowControlInfo


class IngestApi(Protocol):
    """What these routes need of the API (:class:`processor.api.routes.IngestApi` is
    one): its client and its limits. A protocol, so this module imports nothing of the
    routes module that mounts it."""

    @property
    def client(self) -> AsyncClient:
        """The client the API reads and writes through."""
        ...

    @property
    def limits(self) -> Limits:
        """The API's size limits."""
        ...

log = logging.getLogger(__name__)

LIMIT_FIELDS = frozenset({"max_inflight", "rate_limit", "define"})


def key_view(control: FlowControlInfo) -> dict[str, Any]:
    """A key's flow controls as the API shows them."""
    return {"key": control.name, "max_inflight": control.max_inflight,
            "rate_limit": control.rate_limit, "paused": control.paused_at is not None,
            "paused_at": timestamp(control.paused_at),
            "blocked_until": timestamp(control.blocked_until)}


async def list_keys(api: IngestApi, request: Request, _: str) -> Response:
    query = request.query_params
    only(query, frozenset({"limit", "after"}))
    limit = page_limit(query, MAX_CONTROLS_PAGE)
    after = query.get("after")
    rows = await api.client.flow_controls(
        FlowScope.KEY.value, limit=min(limit + 1, MAX_CONTROLS_PAGE),
        after=None if after is None else (FlowScope.KEY.value, checked_key_name(after)))
    page = rows[:limit]
    return answer(200, {"keys": [key_view(row) for row in page],
                        "next_cursor": page[-1].name if len(rows) > limit else None})


async def set_key_limits(api: IngestApi, request: Request, key: str) -> Response:
    only(request.query_params, frozenset())
    if media_type(request) not in JSON_TYPES:
        raise unsupported_media(request.headers.get("content-type"),
                                example='{"max_inflight": 4}')
    document = json_document(await read_whole(request, api.limits.max_body_bytes),
                             LIMIT_FIELDS)
    define = document.get("define", False)
    if type(define) is not bool:
        raise bad_request("'define' must be true or false", field="define")
    if "max_inflight" not in document and "rate_limit" not in document:
        raise bad_request("give 'max_inflight' and/or 'rate_limit' (null lifts a limit); "
                          "nothing was written", field="max_inflight")
    # Both are checked before the first write: the first fails only for an unknown key,
    # and then nothing was written.
    shown: dict[str, Any] = {"key": key}
    if "max_inflight" in document:
        shown["max_inflight"] = checked_inflight_limit(document["max_inflight"])
    if "rate_limit" in document:
        shown["rate_limit"] = checked_rate(document["rate_limit"])
    if "max_inflight" in shown:
        await api.client.set_key_limit(key, shown["max_inflight"], define=define)
    if "rate_limit" in shown:
        await api.client.set_key_rate(key, shown["rate_limit"], define=define)
    log.info("action=api_key_limits key=%r max_inflight=%s rate_limit=%s", key,
             shown.get("max_inflight", "-"), shown.get("rate_limit", "-"))
    return answer(200, shown)


async def pause_key(api: IngestApi, request: Request, key: str) -> Response:
    only(request.query_params, frozenset())
    changed = await api.client.pause_key(key)
    log.info("action=api_pause_key key=%r changed=%s", key, changed)
    return answer(200, {"key": key, "paused": changed})


async def resume_key(api: IngestApi, request: Request, key: str) -> Response:
    only(request.query_params, frozenset())
    changed = await api.client.resume_key(key)
    log.info("action=api_resume_key key=%r changed=%s", key, changed)
    return answer(200, {"key": key, "resumed": changed})


async def _fleet_paused_at(api: IngestApi) -> str | None:
    rows = await api.client.flow_controls(FlowScope.FLEET.value, limit=1)
    return timestamp(rows[0].paused_at) if rows else None


async def read_fleet(api: IngestApi, request: Request, _: str) -> Response:
    only(request.query_params, frozenset())
    paused_at = await _fleet_paused_at(api)
    return answer(200, {"paused": paused_at is not None, "paused_at": paused_at})


async def pause_fleet(api: IngestApi, request: Request, _: str) -> Response:
    only(request.query_params, frozenset())
    changed = await api.client.pause_all()
    log.info("action=api_pause_all changed=%s", changed)
    return answer(200, {"paused": changed, "paused_at": await _fleet_paused_at(api)})


async def resume_fleet(api: IngestApi, request: Request, _: str) -> Response:
    only(request.query_params, frozenset())
    changed = await api.client.resume_all()
    log.info("action=api_resume_all changed=%s", changed)
    return answer(200, {"resumed": changed, "paused_at": await _fleet_paused_at(api)})


FLOW_ROUTES: dict[tuple[str, ...], dict[str, Handler]] = {
    ("v1", "keys"): {"GET": list_keys},
    ("v1", "keys", KEY, "limits"): {"POST": set_key_limits},
    ("v1", "keys", KEY, "pause"): {"POST": pause_key},
    ("v1", "keys", KEY, "resume"): {"POST": resume_key},
    ("v1", "fleet"): {"GET": read_fleet},
    ("v1", "fleet", "pause"): {"POST": pause_fleet},
    ("v1", "fleet", "resume"): {"POST": resume_fleet},
}
