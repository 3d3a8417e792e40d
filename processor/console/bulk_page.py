"""The partitions list's bulk actions (``POST /partitions/bulk``): retry or cancel the
partitions an operator ticked, each with the client operation the partition page's
button (and the CLI's verb) calls, and back to the list with one line that says what
they did.

The POST follows the rules of the console's other actions: refused on a read-only
console, from another site, or without the session's form token. Each partition is
acted on alone, so one that is gone or finished already is counted as not acted on
and the others still are. Every action is logged (``action=console_bulk``, the verb,
the partition and what came of it); statefeed has no table of operator actions to
store them in.

:func:`bulk_ids` and :func:`bulk_notice` decide (pure); :func:`bulk_routes` gives the
route :func:`processor.console.app.create_app` mounts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from processor.console.flow_page import Console
from processor.console.forms import page_url, see_other
from watcher.errors import InvalidInputError, PartitionNotFoundError

log = logging.getLogger(__name__)

VERBS = ("retry", "cancel")
# Partitions one bulk action takes at most: a page of the list.
MAX_BULK = 50


def bulk_ids(values: Sequence[str], limit: int = MAX_BULK) -> list[str]:
    """The partition ids of a bulk form's ticked boxes: in order, each once, blanks left
    out.

    Raises:
        InvalidInputError: more than ``limit`` ids (a page of the list at most).
    """
    ids = list(dict.fromkeys(value for value in values if value))
    if len(ids) > limit:
        raise InvalidInputError(f"a bulk action takes at most {limit} partitions (a page "
                                f"of the list), got {len(ids)}")
    return ids


@dataclass(frozen=True, slots=True)
class BulkOutcome:
    """What a bulk action did: of the ``asked`` partitions, how many it ``acted`` on, how
    many had nothing to do (``unchanged``: nothing to retry, or finished already), and
    how many are ``gone``."""

    verb: str
    asked: int
    acted: int
    unchanged: int
    gone: int


NOTICES = {
    "retry": "Retried {acted} of {asked} selected partition(s): their failed items run "
             "again, a stopped one re-opened.",
    "cancel": "Cancelled {acted} of {asked} selected partition(s): no processor "
              "dispatches their items any more. Retry resumes them.",
}


def bulk_notice(params: Mapping[str, str]) -> str | None:
    """The line the list shows after a bulk action, from the address it was sent to
    (``bulk=VERB&asked=&acted=&unchanged=&gone=``); ``None`` for anything else (a
    hand-edited address shows nothing)."""
    verb = params.get("bulk", "")
    if verb == "none":
        return "Nothing selected: tick the partitions to act on first."
    try:
        numbers = {name: int(params.get(name, "")) for name in
                   ("asked", "acted", "unchanged", "gone")}
    except ValueError:
        return None
    if verb not in NOTICES or min(numbers.values()) < 0:
        return None
    text = NOTICES[verb].format(**numbers)
    if numbers["unchanged"]:
        text += (f" {numbers['unchanged']} had nothing to "
                 f"{'retry' if verb == 'retry' else 'cancel'}.")
    if numbers["gone"]:
        text += f" {numbers['gone']} no longer exist."
    return text


async def bulk_action(console: Console, request: Request) -> Response:
    """POST /partitions/bulk: check, act on each ticked partition, and send the browser
    back to the list (its filters kept) with what was done."""
    form = await console.action_form(request, "bulk", ("bulk",))
    if isinstance(form, Response):
        return form
    verb = form.get("verb", "")
    back = {name: form.get(name, "") for name in ("status", "prefix")}

    async def act(request: Request) -> Response:
        if verb not in VERBS:
            raise InvalidInputError(f"unknown bulk action {verb!r}; use one of "
                                    f"{', '.join(VERBS)}")
        ids = bulk_ids(form.every("id"))
        if not ids:
            return see_other(page_url("/partitions", bulk="none", **back))
        acted = unchanged = gone = 0
        for partition_id in ids:
            try:
                done = bool(await console.client.retry_failed(partition_id)
                            if verb == "retry" else await console.client.cancel(partition_id))
            except PartitionNotFoundError:
                gone += 1
                outcome = "gone"
            else:
                acted, unchanged = acted + done, unchanged + (not done)
                outcome = "done" if done else "unchanged"
            log.info("action=console_bulk verb=%s partition=%s outcome=%s client=%s", verb,
                     partition_id, outcome, request.client.host if request.client else "-")
        report = BulkOutcome(verb, len(ids), acted, unchanged, gone)
        return see_other(page_url("/partitions", bulk=verb, asked=str(report.asked),
                                  acted=str(report.acted), unchanged=str(report.unchanged),
                                  gone=str(report.gone), **back))
    return await console.guarded(request, act)


def bulk_routes(current: Callable[[], Console]) -> list[Route]:
    """The bulk action's route, over the console ``current()``."""
    async def endpoint(request: Request) -> Response:
        return await bulk_action(current(), request)

    return [Route("/partitions/bulk", endpoint, methods=["POST"])]
