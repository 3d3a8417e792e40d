"""The console's item page (``/item?partition=P&id=I``) and the search by item id: what
they read from the client, with the query checked first, and how an item's data and
error history are shown (plain values; the templates escape every text).

A waiting item's page has the operator's actions: Complete and Fail (by item, never
by token), and "Show completion URL", which mints an operator token for the wait
(:meth:`~processor.client.waits.WaitsClient.operator_token`) and shows it once, as a
URL, in the answer to that POST: never in a GET address, never logged, never cached
(every console answer is ``Cache-Control: no-store``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from processor.client.async_client import AsyncClient
from processor.console.flow_page import Console
from processor.console.forms import see_other
from processor.console.views.texts import age_text
from processor.console.views.timeline_view import UNKNOWN
from processor.views import attempts_text
from processor.wire.completions import completion_from_form
from watcher.errors import (
    AlreadyCompletedError,
    CompletionRefusedError,
    ConfigError,
    InvalidInputError,
    WaitNotFoundError,
)
from watcher.records import ErrorEntry, ItemInfo

# How much of an item's data the page shows before "show all": characters of JSON or
# text, bytes of a hex dump. "Show all" shows up to ``ALL_BYTES`` (``processor items
# --show`` prints the rest).
PREVIEW_CHARS = 20_000
PREVIEW_BYTES = 1024
ALL_BYTES = 1 << 20
HEX_ROW = 16
# Partitions the search lists for one item id.
FOUND_LIMIT = 20
# The ingest API's completion route (processor.api.completions).
COMPLETIONS_PATH = "/v1/completions/"


def check_api_url(api_url: str | None) -> str | None:
    """``api_url`` (the ingest API's public base URL) without a trailing ``/``, or
    ``None`` when not given.

    Raises:
        ConfigError: it is not an http(s) URL with a host, or has a query or fragment.
    """
    if not api_url:
        return None
    try:
        parts = urlsplit(api_url.strip())
        host = parts.hostname
    except ValueError:
        host = None
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not host or \
            parts.query or parts.fragment:
        raise ConfigError("--api-url must be the ingest API's public base URL, such as "
                          "https://api.example.com (http or https, no query)")
    return api_url.strip().rstrip("/")


# The console's option for the API's address, as an operator sets it: the page names it
# wherever it cannot show a whole completion URL.
API_URL_SETTING = "--api-url (or PROCESSOR_CONSOLE_API_URL)"


def completion_url(api_url: str | None, token: str) -> str:
    """Where ``token`` completes its wait: the API's URL when the console knows it,
    else the route's path alone (the page says to put the API's address before it)."""
    return f"{(api_url or '').rstrip('/')}{COMPLETIONS_PATH}{quote(token, safe='')}"


@dataclass(frozen=True, slots=True)
class CompletionLink:
    """What the item page shows after "Show completion URL": the ``value`` to copy, its
    ``label`` (a URL, or only a path while the console does not know the ingest API's
    address), and ``note``: what to do with a path, and what to set so that the
    console shows whole URLs (empty for a whole URL)."""

    value: str
    label: str
    note: str

    @property
    def is_url(self) -> bool:
        """Whether :attr:`value` is a whole URL (else a path on the API's address)."""
        return not self.note


def completion_link(api_url: str | None, token: str) -> CompletionLink:
    """The completion URL of ``token`` as the item page shows it: whole when the console
    knows the API's public base URL (``api_url``); else the path, labelled as a path,
    with a note saying to put the API's address before it and which option to set."""
    value = completion_url(api_url, token)
    if api_url:
        return CompletionLink(value, "Completion URL", "")
    return CompletionLink(value, "Completion path (not a whole URL)",
                          "This console does not know the ingest API's address, so this is "
                          "only the path: put the API's public base URL before it (such as "
                          f"https://api.example.com{COMPLETIONS_PATH}…). Start the console "
                          f"with {API_URL_SETTING} set to that URL to show whole URLs here.")


@dataclass(frozen=True, slots=True)
class DataPreview:
    """An item's data as the page shows it: ``text`` (indented JSON, or a hex dump),
    its ``kind`` (``JSON`` or ``hex``), its size in bytes, and whether it was cut."""

    text: str
    kind: str
    size: int
    truncated: bool


def data_preview(data: bytes, *, show_all: bool = False) -> DataPreview:
    """How the item page shows ``data``: indented JSON when it is JSON, else a hex dump
    (offset, bytes); cut to :data:`PREVIEW_CHARS` / :data:`PREVIEW_BYTES`, or with
    ``show_all`` to :data:`ALL_BYTES` of data."""
    limit_bytes = ALL_BYTES if show_all else PREVIEW_BYTES
    try:
        text = json.dumps(json.loads(data), indent=2, ensure_ascii=False)
    except ValueError:  # not JSON (UnicodeDecodeError is a ValueError too)
        shown = data[:limit_bytes]
        rows = (f"{offset:08x}  {shown[offset:offset + HEX_ROW].hex(' ')}"
                for offset in range(0, len(shown), HEX_ROW))
        return DataPreview("\n".join(rows), "hex", len(data), len(data) > len(shown))
    limit_chars = ALL_BYTES if show_all else PREVIEW_CHARS
    return DataPreview(text[:limit_chars], "JSON", len(data), len(text) > limit_chars)


@dataclass(frozen=True, slots=True)
class HistoryRow:
    """One failed attempt as the item page lists it."""

    at: str
    ago: str
    attempt: int
    gate: int
    error: str


def history_rows(entries: tuple[ErrorEntry, ...], now: datetime) -> list[HistoryRow]:
    """The error history, the latest first, with times by the database clock (UTC)."""
    return [HistoryRow(entry.at.strftime("%Y-%m-%d %H:%M:%S UTC"), age_text(entry.at, now),
                       entry.attempt, entry.gate, entry.error) for entry in reversed(entries)]


class ItemQueryError(Exception):
    """The item page's query names no partition or no item; the message says so."""


async def item_data(client: AsyncClient, query: Mapping[str, str]) -> dict[str, Any]:
    """The item page's values: the item with its data shown (``all=1``: all of it, up
    to :data:`ALL_BYTES`), its error history and its partition's id.

    Raises:
        ItemQueryError: no partition or no item id in the query.
        InvalidInputError: an id that is not a valid id.
        PartitionNotFoundError: no partition has this id.
        ItemNotFoundError: the partition holds no item with this id.
    """
    partition_id, item_id = query.get("partition") or "", query.get("id") or ""
    if not partition_id or not item_id:
        raise ItemQueryError("name an item: /item?partition=...&id=...")
    item: ItemInfo = await client.item(partition_id, item_id)
    now = await client.now()
    show_all = query.get("all") == "1"
    return {
        "item": item, "attempts": attempts_text(item),
        "data": data_preview(item.data, show_all=show_all),
        "show_all": show_all, "history": history_rows(item.error_history, now),
        "retry_at": UNKNOWN if item.retry_at is None or item.status != "available"
        else ("now" if item.retry_at <= now else f"in {age_text(now, item.retry_at)}"),
        "deadline": None if item.retry_at is None or item.status != "waiting" else (
            item.retry_at.strftime("%Y-%m-%d %H:%M:%S UTC"),
            "passed" if item.retry_at <= now else f"in {age_text(now, item.retry_at)}"),
        "notice": ITEM_NOTICES.get(query.get("notice") or ""),
        "completion": None, "api_known": False, "api_url_setting": API_URL_SETTING,
        "replay": None, "replay_problem": None, "replay_url": "",
    }


# What the item page says after an action (the query names the case, never the text).
ITEM_NOTICES = {
    "completed": "Completed: the wait is over and the item went on as the answer says.",
    "waits-again": "Completed, and the answer parked the item again: its new wait's "
                   "completion URL is under \"Show completion URL\".",
    "failed": "Failed: the item recorded the error.",
    "already-completed": "Not done: the item is not waiting; its wait was over already "
                         "(completed with its token, timed out, retried or cancelled). "
                         "Nothing was written.",
    "not-waiting": "Not done: the partition has no such item.",
}


async def show_completion_url(console: Console, request: Request,
                              form: Mapping[str, str]) -> Response:
    """POST /item/completion-url: mint an operator token for the waiting item's wait
    and answer the item page with its completion URL, once (the previous operator
    token stops working). The answer is the page itself, not a redirect, so the
    token is in no address; it is never logged."""
    partition_id, item_id = form.get("partition", ""), form.get("id", "")
    query = {"partition": partition_id, "id": item_id}
    try:
        token = await console.client.operator_token(partition_id, item_id)
    except AlreadyCompletedError:
        return see_other("/item?" + urlencode({**query, "notice": "already-completed"}))
    except WaitNotFoundError:
        return see_other("/item?" + urlencode({**query, "notice": "not-waiting"}))
    values = await item_data(console.client, query)
    values.update(completion=completion_link(console.settings.api_url, token),
                  api_known=console.settings.api_url is not None)
    response = console.render(request, "item.html", **values)
    response.headers["cache-control"] = "no-store"
    return response


async def item_action(console: Console, request: Request) -> Response:
    """POST /item/{complete,fail}: complete a waiting item's wait by its partition and id
    (never by token), exactly once, and send the browser back to the item page with
    what happened. ``complete`` takes what a completion says (``gate``, ``done``,
    ``data``: :func:`processor.wire.completions.completion_from_form`); ``fail`` takes a
    ``message`` and ``no_retry`` (``yes``)."""
    verb = request.path_params["verb"]
    form = await console.action_form(request, verb, ("complete", "fail", "completion-url"))
    if isinstance(form, Response):
        return form
    if verb == "completion-url":
        return await console.guarded(
            request, lambda request: show_completion_url(console, request, form))
    partition_id, item_id = form.get("partition", ""), form.get("id", "")

    async def act(request: Request) -> Response:
        def back(notice: str) -> Response:
            return see_other("/item?" + urlencode({"partition": partition_id, "id": item_id,
                                                   "notice": notice}))
        try:
            if verb == "complete":
                # The form's gate, done and data, read as every completion is.
                done = await console.client.complete_item_answer(
                    partition_id, item_id, completion_from_form(form))
                return back("completed" if done.completion_token is None else "waits-again")
            message = form.get("message", "").strip() or "failed by an operator"
            await console.client.complete_item(partition_id, item_id, error=message,
                                               no_retry=form.get("no_retry") == "yes")
            return back("failed")
        except AlreadyCompletedError:
            return back("already-completed")
        except WaitNotFoundError:
            return back("not-waiting")
        except CompletionRefusedError as error:
            return console.render(request, "error.html", 400, title="Bad request",
                                  message=str(error))
    return await console.guarded(request, act)


def item_routes(current: Any) -> list[Route]:
    """The item page's actions, over the console ``current()``."""
    async def action(request: Request) -> Response:
        return await item_action(current(), request)

    return [Route("/item/{verb:str}", action, methods=["POST"])]


async def items_found(client: AsyncClient, text: str) -> list[ItemInfo]:
    """The items whose id is exactly ``text``, one per partition (at most
    :data:`FOUND_LIMIT`); none when ``text`` cannot be an item id."""
    if not text:
        return []
    try:
        return await client.find_items(text, limit=FOUND_LIMIT)
    except InvalidInputError:
        return []
