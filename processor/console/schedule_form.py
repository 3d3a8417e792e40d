"""The console's add form for schedules (``GET /schedules/add``) and its POST: what
``processor schedules add NAME (--cron EXPR [--timezone TZ] | --every DURATION)
[--reduce-gates GATES] [--catch-up POLICY] [--no-overlap] --items FILE`` does, with the
items as NDJSON typed or pasted into the form (one item a line, as in an ``--items``
file; the form is at most :data:`~processor.console.forms.MAX_FORM_BYTES`: larger item
sets go through the CLI). Reduce gates are a comma-separated list, as ``--reduce-gates``
takes them: a schedule of a reduce pipeline without them ticks partitions that fail.

The POST follows the rules of the console's other actions: refused on a read-only
console, from another site, or without the session's form token. Everything is checked
before anything is written (by :meth:`~processor.client.schedules.ScheduleClient.add_schedule`,
as for the CLI); a refusal shows the form again, as it was filled in, with one line that
says why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from processor.client.checks import parse_gate_list
from processor.console.flow_page import Console
from processor.console.forms import page_url, see_other
from processor.wire.contract import parse_new_item
from processor.wire.values import MalformedResponseError, decode_json
from watcher.errors import ConfigError, InvalidInputError, ScheduleExistsError
from watcher.records import NewItem
from watcher.rules.durations import parse_duration

CATCH_UP = ("skip", "all", "none")
FIELDS = ("name", "cron", "timezone", "every", "reduce_gates", "catch_up", "no_overlap",
          "items")


def ndjson_items(text: str) -> list[NewItem]:
    """The items of the form's NDJSON: one JSON object a line (``{"id": "a", "data":
    {}}``, as in an ``--items`` file), blank lines skipped. Only the shape is checked
    here; ids, gates and sizes are checked by the client.

    Raises:
        MalformedResponseError: a line is not JSON, or not a new item; the message names
            the line.
    """
    items = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            where = f"items line {number}"
            items.append(parse_new_item(
                decode_json(line.encode("utf-8"), where, unique_keys=True), f"{where}: "))
    return items


def _context(form: dict[str, str], error: str | None = None) -> dict[str, Any]:
    values = {field: form.get(field, "") for field in FIELDS}
    values["catch_up"] = values["catch_up"] or "skip"
    return {"error": error, "form": values, "catch_ups": CATCH_UP}


async def add_form(console: Console, request: Request) -> Response:
    """GET: the empty form."""
    async def page(request: Request) -> Response:
        if console.settings.read_only:
            return console.read_only_refusal(request)
        return console.render(request, "schedule_add.html", **_context({}))
    return await console.guarded(request, page)


async def add_action(console: Console, request: Request) -> Response:
    """POST: check the form, add the schedule, and send the browser to the Schedules page
    (or show the form again with the one line that says why nothing was written)."""
    form = await console.action_form(request, "add", ("add",))
    if isinstance(form, Response):
        return form
    name = form.get("name", "").strip()

    async def act(request: Request) -> Response:
        every = form.get("every", "").strip()
        try:
            items = ndjson_items(form.get("items", ""))
            await console.client.add_schedule(
                name, cron=form.get("cron", "").strip() or None,
                timezone=form.get("timezone", "").strip() or None,
                every=parse_duration("every", every) if every else None, items=items,
                reduce_gates=parse_gate_list(form.get("reduce_gates", ""), "reduce gates"),
                catch_up=form.get("catch_up", "skip"),
                no_overlap=form.get("no_overlap") == "yes")
        except (InvalidInputError, ConfigError, MalformedResponseError) as error:
            status = 409 if isinstance(error, ScheduleExistsError) else 400
            return console.render(request, "schedule_add.html", status,
                                  **_context(form, error=str(error)))
        return see_other(page_url("/schedules", notice="added", name=name))
    return await console.guarded(request, act)


def add_routes(current: Callable[[], Console]) -> list[Route]:
    """The add form and its POST, over the console ``current()`` (mounted before the
    Schedules page's other actions)."""
    async def endpoint(request: Request) -> Response:
        if request.method == "POST":
            return await add_action(current(), request)
        return await add_form(current(), request)

    return [Route("/schedules/add", endpoint, methods=["GET", "POST"])]
