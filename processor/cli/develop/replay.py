"""``processor replay PARTITION ITEM --to URL [--apply]``: send an item's call to a
handler again and show its answer beside the stored item (:mod:`processor.http.replay`
rebuilds and sends the call; this module prints it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from processor.cli.common import (
    DEFAULT_DB_URL,
    DbUrl,
    JsonOption,
    TablePrefix,
    app,
    data_console,
    database_url,
    say,
    say_json,
)

if TYPE_CHECKING:
    from rich.text import Text

    from processor.http.replay import ReplayReport

# How many characters of data each side of the comparison shows (--json shows it whole).
SHOWN_DATA_CHARS = 2000
# Headers whose values are secrets: named, never printed.
_SECRET_HEADERS = frozenset({"authorization", "x-completion-token", "cookie",
                             "proxy-authorization"})


@app.command()
def replay(
    partition_id: Annotated[str, typer.Argument(help="The item's partition.")],
    item_id: Annotated[str, typer.Argument(help="The item's id.")],
    to: Annotated[str, typer.Option(
        "--to", help="The handler to send the call to, such as http://127.0.0.1:8000/ "
                     "(one under a debugger).", show_default=False)],
    apply: Annotated[bool, typer.Option(
        "--apply", help="Write the answer as a processor would, only if the item has not "
                        "moved since it was read (nothing is written otherwise).")] = False,
    header: Annotated[list[str] | None, typer.Option(
        "--header", help="An extra request header 'Name: value' (repeatable), as "
                         "`processor run --handler-header`.", show_default=False)] = None,
    request_timeout: Annotated[float, typer.Option(
        "--timeout", min=0.1, help="Seconds the handler may take to answer (a debugger's "
                                   "breakpoint counts).")] = 300.0,
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    as_json: JsonOption = False,
) -> None:
    """Send an item's call to a handler again (the same body, headers, Idempotency-Key,
    gate and attempt as the processor's, rebuilt from the stored item; a new completion
    token) and show the answer beside the stored item. --apply writes it, as a
    processor would, while the item is still at the version read."""
    import asyncio

    from processor.client.async_client import AsyncClient
    from processor.http.config import parse_header
    from processor.http.replay import check_replay_url, replay_item

    headers = dict(parse_header(spec) for spec in header or [])
    check_replay_url(to)
    url = database_url(db_url, table_prefix)

    async def run() -> ReplayReport:
        async with AsyncClient(url, table_prefix) as client:
            return await replay_item(client, partition_id, item_id, to, headers=headers,
                                     request_timeout=request_timeout, apply=apply)

    report = asyncio.run(run())
    if as_json:
        say_json(report_document(report, to), indent=2, ensure_ascii=False)
        return
    print_report(report, to)


def report_document(report: ReplayReport, url: str) -> dict[str, object]:
    """``--json``: the call (headers without secrets), the answer, the stored item and
    what applying writes (or wrote)."""
    from processor.http.replay import answer_fields
    from processor.observe.redact import redact_url
    from processor.views import item_detail

    write = report.write
    return {
        "to": redact_url(url), "call": {
            "which": "last" if report.call.last else "next", "what": report.call.what,
            "headers": shown_headers(report.call.headers)},
        "answer": answer_fields(report.answer), "stored": item_detail(report.item),
        "would_write": None if write is None else {
            "status": write.status,
            "gate": report.item.gate if write.gate is None else write.gate,
            "attempts": write.attempts, "last_error": write.last_error,
            "data_bytes": None if write.data is None else len(write.data),
            "spawn": [new.id for new in write.spawn]},
        "unwritten": report.unwritten, "applied": report.applied is not None,
        "version": report.item.version,
    }


def shown_headers(headers: dict[str, str]) -> dict[str, str]:
    """``headers`` to print: secret values replaced by ``(hidden)``."""
    return {name: "(hidden)" if name.lower() in _SECRET_HEADERS else value
            for name, value in headers.items()}


def _cell(value: str) -> Text:
    """A table cell of several lines: each line's control characters escaped (a data line
    stays one line), the lines kept apart."""
    from rich.text import Text

    from processor.observe.safe_text import escape_controls

    return Text("\n".join(escape_controls(line) for line in value.split("\n")))


def print_report(report: ReplayReport, url: str) -> None:
    """The replay as text: which call went where, its headers, the HTTP answer, a table of
    the stored item beside what the answer writes, and whether it was written. Every
    text passes through the safe console (control characters escaped, no markup)."""
    from rich.table import Table

    from processor.http.replay import comparison
    from processor.observe.redact import redact_url

    item, call = report.item, report.call
    say(f"replayed item {item.id!r} of partition {item.partition_id!r} to {redact_url(url)}")
    say(f"the call: {call.what}")
    for name, value in shown_headers(call.headers).items():
        say(f"  {name}: {value}")
    reply = report.answer.reply
    body = "(over the size limit)" if reply.body is None else (
        reply.body.decode("utf-8", "backslashreplace") or "(empty)")
    say(f"answer: HTTP {reply.status}")
    say(f"  {body[:SHOWN_DATA_CHARS]}")
    console = data_console()
    if report.write is None:
        say(f"not written: {report.unwritten}")
        return
    table = Table("", "stored", "after this answer" if report.applied is None else "written")
    for field, stored, after in comparison(item, report.write, data_limit=SHOWN_DATA_CHARS):
        table.add_row(field, _cell(stored), _cell(after))
    console.print(table)
    if report.applied is not None:
        say(f"written: the item is {report.applied.status} at gate {report.applied.gate} "
            f"(version {report.applied.version})")
    else:
        say(f"not written: --apply writes this answer while the item is still at version "
            f"{item.version}")
