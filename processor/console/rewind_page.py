"""The console's rewind: a form (``GET /partition/rewind?id=``) that moves a partition back
to a gate, as ``processor rewind`` does, and its POST.

The form carries the partition's version as the page read it, so a rewind never acts on
a partition that changed since the operator looked (the client refuses it, and the form
shows why). Its POST follows the rules of the console's other actions: refused on a
read-only console, from another site, or without the session's form token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from processor.console.flow_page import Console
from processor.console.forms import see_other
from watcher.errors import InvalidInputError
from watcher.records import PartitionInfo


def form_values(form: dict[str, str]) -> tuple[int, bool, list[str] | None, int | None]:
    """The gate, failed-only, the named items (one id a line; ``None``: none named) and the
    version of a rewind form.

    Raises:
        InvalidInputError: the gate or the version is not a whole number.
    """
    try:
        gate = int(form.get("gate", "").strip())
    except ValueError:
        raise InvalidInputError("the gate must be a whole number from 0") from None
    version_text = form.get("version", "").strip()
    try:
        version = int(version_text) if version_text else None
    except ValueError:
        raise InvalidInputError("the form's version is not a number: reload the page") from None
    named = [line.strip() for line in form.get("items", "").splitlines() if line.strip()]
    return gate, form.get("failed_only") == "yes", named or None, version


def _context(info: PartitionInfo, **values: Any) -> dict[str, Any]:
    return {"info": info, "error": None, "gate": info.gate, "failed_only": False,
            "items": "", **values}


async def rewind_form(console: Console, request: Request) -> Response:
    """GET: the form, for the partition ``?id=`` as it is now."""
    async def page(request: Request) -> Response:
        if console.settings.read_only:
            return console.read_only_refusal(request)
        info = await console.client.partition(request.query_params.get("id") or "")
        return console.render(request, "rewind.html", **_context(info))
    return await console.guarded(request, page)


async def rewind_action(console: Console, request: Request) -> Response:
    """POST: check the form, rewind, and send the browser to the partition (or show the
    form again with the one line that says why nothing was written)."""
    form = await console.action_form(request, "rewind", ("rewind",))
    if isinstance(form, Response):
        return form
    partition_id = form.get("id", "")

    async def act(request: Request) -> Response:
        info = await console.client.partition(partition_id)
        try:
            gate, failed_only, named, version = form_values(form)
            report = await console.client.rewind(partition_id, gate, failed_only=failed_only,
                                                 items=named, version=version)
        except InvalidInputError as error:  # GateError, an unknown item, a stale version
            return console.render(request, "rewind.html", 409, **_context(
                info, error=str(error), gate=form.get("gate", ""),
                failed_only=form.get("failed_only") == "yes", items=form.get("items", "")))
        return see_other("/partition?" + urlencode({
            "id": partition_id, "notice": "rewound", "count": report.items_reset}))
    return await console.guarded(request, act)


def rewind_routes(current: Callable[[], Console]) -> list[Route]:
    """The rewind form and its POST, over the console ``current()`` (mounted before the
    console's other partition actions)."""
    async def endpoint(request: Request) -> Response:
        if request.method == "POST":
            return await rewind_action(current(), request)
        return await rewind_form(current(), request)

    return [Route("/partition/rewind", endpoint, methods=["GET", "POST"])]
