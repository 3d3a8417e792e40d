"""The item page's "Replay to…" form: ``POST /item/replay`` sends the item's call to a
handler URL (:func:`processor.http.replay.replay_item`, as ``processor replay`` does)
and answers the item page with the answer beside the stored item; its "Replay and
apply" button writes the answer, only while the item is at the version the page showed.

An action like the page's others: a POST from a page of this console with the session's
CSRF token, refused on a read-only console (:meth:`Console.action_form`). The console's
server makes the call, so whoever may use the console may have it POST an item's data to
any http(s) URL: the same trust as its other actions, which write items.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from processor.console.flow_page import Console
from processor.console.item_page import item_data
from processor.http.replay import (
    ReplayError,
    ReplayReport,
    comparison,
    replay_item,
)
from processor.observe.redact import redact_url
from watcher.errors import AnswerRefusedError, InvalidInputError, ItemChangedError

# What the page shows of each side's data before cutting it.
SHOWN_DATA_CHARS = 4000
# How long the console waits for the handler (a breakpoint may hold it).
REPLAY_TIMEOUT = 120.0
_SECRET_HEADERS = frozenset({"authorization", "x-completion-token"})


@dataclass(frozen=True, slots=True)
class ReplayView:
    """A replay as the item page shows it: where it went, which call, its headers (the
    token hidden), the HTTP status and body, the comparison rows, and whether it was
    written (or why it was not)."""

    url: str
    what: str
    headers: list[tuple[str, str]]
    status: int
    body: str
    rows: list[tuple[str, str, str]]
    written: str
    applied: bool


def replay_view(report: ReplayReport, url: str) -> ReplayView:
    """The page's view of ``report`` (plain texts: the template escapes them)."""
    reply = report.answer.reply
    body = ("(over the size limit)" if reply.body is None
            else reply.body.decode("utf-8", "replace")[:SHOWN_DATA_CHARS] or "(empty)")
    rows = ([] if report.write is None
            else comparison(report.item, report.write, data_limit=SHOWN_DATA_CHARS))
    if report.applied is not None:
        written = (f"Written: the item is {report.applied.status} at gate "
                   f"{report.applied.gate} (version {report.applied.version}).")
    elif report.unwritten:
        written = f"Not written: {report.unwritten}."
    else:
        written = ("Not written. \"Replay and apply\" sends the call again and writes that "
                   f"answer while the item is still at version {report.item.version}.")
    headers = [(name, "(hidden)" if name.lower() in _SECRET_HEADERS else value)
               for name, value in report.call.headers.items()]
    return ReplayView(redact_url(url), report.call.what, headers, reply.status, body, rows,
                      written, report.applied is not None)


async def replay_action(console: Console, request: Request, form: Mapping[str, str]
                        ) -> Response:
    """POST /item/replay: replay the item's call to the form's ``url`` and answer the item
    page with the answer (``apply=yes``: written, guarded by the form's ``version``).
    A bad URL, a handler that does not answer, an item that moved and a refused write
    are said on the page, in one line; nothing is written then."""
    partition_id, item_id = form.get("partition", ""), form.get("id", "")
    url = form.get("url", "").strip()
    apply = form.get("apply") == "yes"
    query = {"partition": partition_id, "id": item_id}
    try:
        version = int(form["version"]) if form.get("version") else None
    except ValueError:
        raise InvalidInputError("the form's version must be a whole number") from None
    view, problem = None, None
    try:
        report = await replay_item(console.client, partition_id, item_id, url,
                                   request_timeout=REPLAY_TIMEOUT, apply=apply,
                                   version=version)
        view = replay_view(report, url)
    except (ReplayError, ItemChangedError, AnswerRefusedError) as error:
        problem = str(error)
    values = await item_data(console.client, query)
    values.update(replay=view, replay_problem=problem, replay_url=url)
    response = console.render(request, "item.html", 200 if problem is None else 409,
                              **values)
    response.headers["cache-control"] = "no-store"
    return response


def replay_routes(current: Callable[[], Console]) -> list[Route]:
    """The replay form's POST, over the console ``current()`` (mounted before the item
    page's other actions, whose ``/item/{verb}`` would take it)."""
    async def endpoint(request: Request) -> Response:
        console = current()
        form = await console.action_form(request, "replay", ("replay",))
        if isinstance(form, Response):
            return form
        return await console.guarded(request, lambda request: replay_action(console, request,
                                                                            form))

    return [Route("/item/replay", endpoint, methods=["POST"])]
