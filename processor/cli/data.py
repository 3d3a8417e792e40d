"""The verbs that show data: status, result and items."""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

# Only light modules at the top: `processor --help` and the one-line errors must not wait for
# SQLAlchemy, SQLModel or the HTTP clients; each verb imports what it uses.

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.table import Table

    from processor import PartitionInfo
    from watcher.store.db.urls import DatabaseURL
from processor.cli.common import (
    DEFAULT_DB_URL,
    DEFAULT_ITEMS_LIMIT,
    DEFAULT_STATUS_LIMIT,
    DEFAULT_WATCH_INTERVAL,
    EXIT_NO_RESULT,
    DbUrl,
    JsonOption,
    TablePrefix,
    app,
    data_console,
    database_url,
    fail,
    say,
    say_json,
)


@app.command()
def status(
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")
                       ] = False,
    limit: Annotated[int, typer.Option(help="Show at most this many partitions.")
                     ] = DEFAULT_STATUS_LIMIT,
    only: Annotated[str, typer.Option("--status", help="Only partitions with this status: "
                                      "available, complete, failed, cancelled or deleting.")
                    ] = "",
    watch: Annotated[bool, typer.Option("--watch", help="Redraw the table every --interval "
                                        "seconds until Ctrl-C.")] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between the "
                                            "redraws of --watch.")] = DEFAULT_WATCH_INTERVAL,
) -> None:
    """Show partitions with their status, gate, owner and item counts (and, once a step
    spawned items, how many; once one has a key, a priority or a pause, its flow:
    "paused acme +2"), and a line for each place where open partitions wait that no
    live processor serves; with --watch, again and again until Ctrl-C."""
    from processor.client.flow_reads import handler_hold_lines
    from processor.client.sync_client import Client
    from processor.views import partition_row, unserved_line, waiting_row, waiting_text
    from watcher.rules.checks import check_seconds
    from watcher.rules.served.places import served

    if watch and as_json:
        raise fail("--watch redraws the table; leave out --json (or poll `status --json`)")
    check_seconds("--interval", interval)
    url = database_url(db_url, table_prefix)
    with Client(url, table_prefix) as client:
        def read() -> list[PartitionInfo]:
            return list(client.partitions(only or None, limit=limit))

        def fleet_paused() -> datetime.datetime | None:
            fleet = client.flow_controls("fleet", limit=1)
            return fleet[0].paused_at if fleet else None

        def holds() -> list[str]:
            """The handlers held by a Retry-After, and the places no processor serves
            (when open partitions are listed)."""
            places = client.unserved_places() if only in ("", "available") else []
            return (handler_hold_lines(client.flow_controls("handler"), client.now())
                    + [unserved_line(place) for place in places])

        if watch:
            _watch(lambda: _partitions_view(read(), url, only, every=interval,
                                            paused=fleet_paused(), holds=holds()), interval)
            return
        infos = read()
        paused = None if as_json else fleet_paused()
        held = [] if as_json else holds()
        parked = client.waits_summary([info.id for info in infos
                                       if info.counts.get("waiting")])
        outbox = {} if as_json else client.notification_counts()
        fleet = [processor.serves for processor in client.processors()] if as_json else []
    if as_json:
        typer.echo(json.dumps([{**partition_row(info), "waiting": waiting_row(parked.get(
            info.id)), "unserved": info.status == "available" and not served(
                info.pipeline, info.pipeline_version, info.gate, fleet)}
            for info in infos], indent=2))
        return
    data_console().print(_partitions_view(infos, url, only, paused=paused, holds=held))
    for info in infos:
        if info.id in parked:
            say(f"{info.id}: {waiting_text(parked[info.id])}")
    if outbox.get("pending") or outbox.get("dead"):
        from processor.cli.notifications import counts_line

        say(f"notifications: {counts_line(outbox)}; `processor notifications list` shows "
            "them")


def _partitions_view(infos: list[PartitionInfo], url: DatabaseURL, only: str, *,
                     every: float | None = None,
                     paused: datetime.datetime | None = None,
                     holds: list[str] | None = None) -> RenderableType:
    """The table of ``status``, and a line when it is empty; above it, a line when
    everything is paused (``paused``: since when), and below it a line per handler held
    by a ``Retry-After`` and per place no live processor serves (``holds``); with
    ``every``, the time it was read and how to stop. Long ids and owners fold over
    lines, never cut: two ids that differ only at the end stay apart on a narrow
    terminal, and an id stays whole while the other columns fit beside it, the owner,
    the counts and the flow folding first (:func:`id_column_width`)."""
    from rich.table import Table

    from processor.views import flow_text, pipeline_text, step_text

    table = Table(title=f"statefeed partitions in {url.redacted()}"
                  + (f" ({only})" if only else ""))
    if every is not None:
        now = datetime.datetime.now().strftime("%H:%M:%S")
        table.caption = f"read at {now}, every {every:g} s; Ctrl-C stops"
    # The spawned and flow columns only when some partition has them: a narrow terminal
    # keeps the ids whole.
    spawning = any(info.spawned for info in infos)
    flowing = any(flow_text(info) != "-" for info in infos)
    piped = any(info.pipeline != "default" or info.pipeline_version for info in infos)
    # Only the ids, owners, counts and flows give up width (they fold or wrap); the short
    # cells keep theirs.
    table.add_column("partition", overflow="fold")
    for column in ("status", "gate", "owner", "items", *(("spawned",) if spawning else ()),
                   *(("flow",) if flowing else ()), *(("pipeline",) if piped else ())):
        table.add_column(column, overflow="fold", no_wrap=column not in (
            "owner", "items", "flow"), justify="right" if column == "spawned" else "left")
    for info in infos:
        step = step_text(info)
        table.add_row(info.id, info.status, f"{info.gate} {step}" if step != "-" else
                      str(info.gate), info.owner or "-", items_cell(info.counts),
                      *((str(info.spawned),) if spawning else ()),
                      *((flow_text(info),) if flowing else ()),
                      *((pipeline_text(info.pipeline, info.pipeline_version),) if piped else ()))
    return _narrowed(table, infos, paused, only, holds or [])


def _narrowed(table: Table, infos: list[PartitionInfo], paused: datetime.datetime | None,
              only: str, holds: list[str]) -> RenderableType:
    """``table`` with its id column held at a readable width when the terminal is too
    narrow for the whole table (Rich would squeeze it to a few characters), under the
    fleet's pause line and over the "none" line."""
    from rich.cells import cell_len
    from rich.console import Group
    from rich.text import Text

    from processor.cli.terminal import id_column_width
    from processor.views import utc_text

    console = data_console()
    longest = max((cell_len(info.id) for info in infos), default=0)
    natural = console.measure(table, options=console.options.update_width(100_000))
    if infos and natural.maximum > console.width:
        others = table.columns[1:]
        fixed = [max(cell_len(str(column.header)), *(cell_len(str(cell))
                                                      for cell in column.cells))
                 for column in others if column.no_wrap]
        table.columns[0].width = id_column_width(
            console.width, longest, fixed, sum(1 for column in others if not column.no_wrap))
    parts: list[RenderableType] = []
    if paused is not None:
        parts.append(Text(f"everything is paused since {utc_text(paused)}: no processor "
                          "starts a call; `processor resume --all` lifts it"))
    parts.append(table)
    if not infos:
        parts.append(Text(f"no {only} partitions" if only else "no partitions yet"))
    parts += [Text(line, style="yellow") for line in holds]  # holds, places not served
    return parts[0] if len(parts) == 1 else Group(*parts)


def items_cell(counts: dict[str, int]) -> str:
    """A partition's item counts for the status table: ``"3 available, 5 complete"``
    (the statuses it has, ``waiting`` and ``skipped`` too; ``"none"`` when empty)."""
    return ", ".join(f"{counts[status]} {status}" for status in (
        "available", "waiting", "complete", "failed", "skipped") if counts.get(status)
    ) or "none"


def _watch(render: Callable[[], RenderableType], interval: float) -> None:
    """Show ``render()`` every ``interval`` seconds until Ctrl-C (SIGINT), which ends it
    quietly once the read under way (if any) is done (:class:`~processor.cli.watching.CtrlC`).
    On a terminal the view is redrawn in place (rich's Live); into a file or a pipe,
    each one is printed after the last.

    Raises what ``render`` raises (a database error ends the watch).
    """
    from rich.live import Live

    from processor.cli.watching import CtrlC

    console = data_console()
    try:
        with CtrlC() as ctrl_c:
            if not console.is_terminal:
                while True:
                    view = render()
                    if ctrl_c.stopped:
                        return
                    console.print(view)
                    if ctrl_c.sleep(interval):
                        return
            with Live(render(), console=console, auto_refresh=False) as live:
                while not ctrl_c.sleep(interval):
                    view = render()
                    if ctrl_c.stopped:
                        return
                    live.update(view, refresh=True)
    except KeyboardInterrupt:  # a second Ctrl-C
        return


@app.command()
def result(
    partition_id: Annotated[str, typer.Argument(help="The partition whose result to print.")],
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
) -> None:
    """Print a partition's result (what its reduce stored): JSON pretty-printed, other
    bytes as they are."""
    from processor.client.sync_client import Client

    url = database_url(db_url, table_prefix)
    with Client(url, table_prefix) as client:
        info = client.partition(partition_id)
    if info.result is None:
        raise fail(f"partition {partition_id!r} has no result yet (it is {info.status} at gate "
                   f"{info.gate}; a reduce gate stores one)", EXIT_NO_RESULT)
    try:
        say_json(json.loads(info.result), indent=2, ensure_ascii=False)
    except ValueError:
        if sys.stdout.isatty():  # shown, not obeyed: escapes, and bytes as \x..
            say(info.result.decode("utf-8", errors="backslashreplace"))
            return
        sys.stdout.buffer.write(info.result)
        sys.stdout.buffer.flush()


@app.command()
def items(
    partition_id: Annotated[str, typer.Argument(
        help="The partition's id (leave it out with --find).")] = "",
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    status: Annotated[str, typer.Option("--status", help="Only items with this status: "
                                        "available, waiting, complete, failed or skipped.")] = "",
    gate: Annotated[int | None, typer.Option("--gate", help="Only items at this gate.")
                    ] = None,
    limit: Annotated[int, typer.Option(help="Show at most this many items (a page).")
                     ] = DEFAULT_ITEMS_LIMIT,
    after: Annotated[str, typer.Option("--after", help="Start after this item id (the "
                                       "cursor the page before printed).")] = "",
    as_json: JsonOption = False,
    show: Annotated[str, typer.Option("--show", metavar="ITEM_ID", help="Show this one "
                                      "item: its data (JSON pretty-printed, other bytes in "
                                      "hex), parent and error history.")] = "",
    show_all: Annotated[bool, typer.Option("--all", help="With --show, print the data "
                                           "whole, however long.")] = False,
    find: Annotated[str, typer.Option("--find", metavar="ITEM_ID", help="List the "
                                      "partitions holding an item with this id (no "
                                      "partition argument).")] = "",
) -> None:
    """Show a partition's items in id order: id, status, gate, attempts, last error and,
    for spawned items, the item that spawned them (their parent).

    One page at a time; the last line says how to read the next one. With --show ITEM_ID,
    one item whole; with --find ITEM_ID, the partitions holding that id.
    """
    import shlex

    from processor.client.sync_client import Client
    from processor.views import error_after_context, error_cell, item_row

    if find:
        if partition_id or show:
            raise fail("--find looks in every partition: give no partition id and no --show")
        _find_item(find, db_url, table_prefix, limit, as_json)
        return
    if not partition_id:
        raise fail("give a partition id (processor items PARTITION_ID), or --find ITEM_ID")
    if show:
        _show_item(partition_id, show, db_url, table_prefix, as_json, show_all)
        return
    if show_all:
        raise fail("--all goes with --show ITEM_ID")
    url = database_url(db_url, table_prefix)
    with Client(url, table_prefix) as client:
        page = client.items(partition_id, status=status or None, gate=gate, limit=limit,
                            after=after or None, with_data=False)
    if as_json:
        typer.echo(json.dumps({"partition": partition_id,
                               "items": [item_row(item) for item in page],
                               "next_cursor": page.next_cursor}, indent=2))
        return
    from rich.table import Table

    table = Table(title=f"items of partition {partition_id!r}")
    # The parent column only when an item of the page was spawned.
    spawned = any(item.parent is not None for item in page)
    for column in ("item", "status", "gate", "attempts", *(("parent",) if spawned else ()),
                   "last error"):
        table.add_column(column, justify="right" if column in ("gate", "attempts") else "left",
                         overflow="fold")
    for item in page:
        table.add_row(item.id, item.status, str(item.gate), str(item.attempts),
                      *((item.parent or "-",) if spawned else ()),
                      error_cell(error_after_context(item)))
    data_console(soft_wrap=True).print(table)
    if not page:
        say("no items" + (" match" if status or gate is not None or after else ""))
    if page.next_cursor is not None:
        where = " ".join(shlex.quote(part) for part in (
            partition_id, *(("--status", status) if status else ()),
            *(("--gate", str(gate)) if gate is not None else ()),
            "--limit", str(limit), "--after", page.next_cursor))
        say(f"more: processor items {where}")


# How much of an item's data `items --show` prints without --all (characters).
SHOW_DATA_CHARS = 4000


def _show_item(partition_id: str, item_id: str, db_url: str, table_prefix: str,
               as_json: bool, show_all: bool) -> None:
    """Print one item (``items PARTITION --show ITEM``): text, or JSON with the data whole.

    Raises:
        typer.Exit: the partition holds no such item (one line, exit code 2).
    """
    from processor.client.sync_client import Client
    from processor.views import item_detail, item_lines
    from watcher.errors import ItemNotFoundError

    url = database_url(db_url, table_prefix)
    with Client(url, table_prefix) as client:
        try:
            info = client.item(partition_id, item_id)
        except ItemNotFoundError:
            raise fail(f"partition {partition_id!r} has no item {item_id!r}; list its items "
                       f"with `processor items {partition_id}`, or look for the id in every "
                       f"partition with `processor items --find {item_id}`") from None
    if as_json:
        say_json(item_detail(info), indent=2, ensure_ascii=False)
        return
    for line in item_lines(info, data_limit=None if show_all else SHOW_DATA_CHARS):
        say(line)


def _find_item(item_id: str, db_url: str, table_prefix: str, limit: int,
               as_json: bool) -> None:
    """Print the partitions holding an item with this id (``items --find ITEM``)."""
    from processor.client.items import MAX_FIND_LIMIT
    from processor.client.sync_client import Client
    from processor.views import error_after_context, error_cell, item_row

    url = database_url(db_url, table_prefix)
    with Client(url, table_prefix) as client:
        found = client.find_items(item_id, limit=min(limit, MAX_FIND_LIMIT))
    if as_json:
        typer.echo(json.dumps([{"partition": item.partition_id, **item_row(item)}
                               for item in found], indent=2))
        return
    if not found:
        say(f"no partition holds an item {item_id!r}")
        return
    from rich.table import Table

    table = Table(title=f"partitions holding item {item_id!r}")
    for column in ("partition", "status", "gate", "attempts", "last error"):
        table.add_column(column, justify="right" if column in ("gate", "attempts") else "left",
                         overflow="fold")
    for item in found:
        table.add_row(item.partition_id, item.status, str(item.gate), str(item.attempts),
                      error_cell(error_after_context(item)))
    data_console(soft_wrap=True).print(table)
    if len(found) == limit:
        say(f"(the first {limit}; --limit shows more)")
