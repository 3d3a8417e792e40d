"""The ingest API's notification routes, the client's verbs over HTTP
(:class:`~processor.client.notifications.NotificationsClient`):

=======  ================================  ==================================================
GET      ``/v1/notifications``             events and counts (``?state=&partition=&after=``)
POST     ``/v1/notifications/redeliver``   send dead events again (``{"seqs": [..]}``)
=======  ================================  ==================================================

An event is shown as ``processor notifications list --json`` prints it
(:func:`processor.notify.events.event_row`): its URL with the password and query values
masked, never its body, and never the signing secret, which the API does not have.
Each handler takes the API (:class:`~processor.api.routes.IngestApi`), the request and
``""`` (these paths name nothing).
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from processor.api.bodies import media_type, read_whole
from processor.api.dispatch import Handler, answer
from processor.api.flow_routes import IngestApi
from processor.api.problems import bad_request, unsupported_media
from processor.api.upload import JSON_TYPES, json_document
from processor.api.views import only, page_limit, whole_number
from processor.client.checks import check_id
from processor.client.notifications import MAX_PAGE, MAX_SEQ, check_seqs, check_state
from processor.notify.events import event_row
from watcher.errors import InvalidInputError

log = logging.getLogger(__name__)

LIST_PARAMETERS = frozenset({"state", "partition", "after", "limit"})
REDELIVER_FIELDS = frozenset({"seqs"})


def _filter(check: Any, value: str | None, name: str) -> Any:
    """``value`` as ``check`` takes it (``None`` stays ``None``).

    Raises:
        ApiError: 400 naming the query parameter ``name`` when ``check`` refuses it.
    """
    if value is None:
        return None
    try:
        return check(value)
    except InvalidInputError as error:
        raise bad_request(f"{error}; nothing was read", field=name) from None


async def list_notifications(api: IngestApi, request: Request, _: str) -> Response:
    query = request.query_params
    only(query, LIST_PARAMETERS)
    state = _filter(check_state, query.get("state"), "state")
    partition_id = _filter(lambda value: check_id("partition", value),
                           query.get("partition"), "partition")
    after = whole_number(query, "after", None, low=0, high=MAX_SEQ)
    limit = page_limit(query, MAX_PAGE)
    events = await api.client.notifications(state=state, partition_id=partition_id,
                                            after=after, limit=limit)
    counts = await api.client.notification_counts()
    return answer(200, {"events": [event_row(event) for event in events], "counts": counts,
                        "next_cursor": events[-1].seq if len(events) == limit else None})


async def redeliver_notifications(api: IngestApi, request: Request, _: str) -> Response:
    only(request.query_params, frozenset())
    if media_type(request) not in JSON_TYPES:
        raise unsupported_media(request.headers.get("content-type"), example='{"seqs": [12]}')
    document = json_document(await read_whole(request, api.limits.max_body_bytes),
                             REDELIVER_FIELDS)
    if "seqs" not in document:
        raise bad_request('the body needs \'seqs\', the dead events\' numbers, such as '
                          '{"seqs": [12]}; nothing was changed', field="seqs")
    try:
        seqs = check_seqs(document["seqs"])
    except InvalidInputError as error:
        raise bad_request(f"'seqs': {error}; nothing was changed", field="seqs") from None
    if len(seqs) > MAX_PAGE:
        raise bad_request(f"'seqs' has {len(seqs)} numbers; send at most {MAX_PAGE} a "
                          "request (a page of the list); nothing was changed", field="seqs")
    redelivered = await api.client.redeliver_notifications(seqs)
    log.info("action=api_notifications_redelivered asked=%d redelivered=%d", len(seqs),
             redelivered)
    return answer(200, {"redelivered": redelivered, "requested": len(seqs)})


NOTIFICATION_ROUTES: dict[tuple[str, ...], dict[str, Handler]] = {
    ("v1", "notifications"): {"GET": list_notifications},
    ("v1", "notifications", "redeliver"): {"POST": redeliver_notifications},
}
