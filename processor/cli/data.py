"""The verbs that show data: status, result and items."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

# Only light modules at the top: `processor --help` and the one-line errors must not wait for
# SQLAlchemy, SQLModel or the HTTP clients; each verb imports what it uses.

if TYPE_CHECKING:
    from rich.console import RenderableType

    from processor import PartitionInfo
    from watcher.dburl import DatabaseURL
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
    "paused acme +2"); with --watch, again and again until Ctrl-C."""
    from processor.client import Client
    from processor.flow_reads import handler_hold_lines
    from processor.views import partition_row
    from watcher.checks import check_seconds

    if watch and as_json:
        raise fail("--watch redraws the table; leave out --json (or poll `status --json`)")
    check_seconds("--interval", interval)
    url = database_url(db_url, table_prefix)
    with Client(url, table_prefix) as client:
        def read() -> list[PartitionInfo]:
            return list(client.partitions(only or None, limit=limit))

        def holds() -> list[str]:
            return handler_hold_lines(client.flow_controls("handler"), client.now())

        if watch:
            _watch(lambda: _partitions_view(read(), url, only, every=interval,
                                            holds=holds()), interval)
            return
        infos = read()
        held = [] if as_json else holds()
    if as_json:
        typer.echo(json.dumps([partition_row(info) for info in infos], indent=2))
        return
    data_console().print(_partitions_view(infos, url, only, holds=held))


def _partitions_view(infos: list[PartitionInfo], url: DatabaseURL, only: str, *,
                     every: float | None = None, holds: list[str] | None = None
                     ) -> RenderableType:
    """The table of ``status``, and a line when it is empty; with ``every``, the time it
    was read and how to stop. Long ids and owners fold over lines, never cut: two ids
    that differ only at the end stay apart on a narrow terminal."""
    import datetime

    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from processor.views import flow_text, step_text

    table = Table(title=f"statefeed partitions in {url.redacted()}"
                  + (f" ({only})" if only else ""))
    if every is not None:
        now = datetime.datetime.now().strftime("%H:%M:%S")
        table.caption = f"read at {now}, every {every:g} s; Ctrl-C stops"
    # The spawned and flow columns only when some partition has them: a narrow terminal
    # keeps the ids whole.
    spawning = any(info.spawned for info in infos)
    flowing = any(flow_text(info) != "-" for info in infos)
    for column in ("partition", "status", "gate", "step", "owner", "available", "complete",
                   "failed", *(("spawned",) if spawning else ()),
                   *(("flow",) if flowing else ())):
        # Only the ids and owners give up width (they fold); the short cells keep theirs.
        folds = column in ("partition", "owner", "flow")
        table.add_column(column, overflow="fold", no_wrap=not folds, justify="right" if column in (
            "gate", "available", "complete", "failed", "spawned") else "left")
    for info in infos:
        counts = info.counts
        table.add_row(info.id, info.status, str(info.gate), step_text(info), info.owner or "-",
                      *(str(counts.get(s, 0)) for s in ("available", "complete", "failed")),
                      *((str(info.spawned),) if spawning else ()),
                      *((flow_text(info),) if flowing else ()))
    below = [] if infos else [Text(f"no {only} partitions" if only else "no partitions yet")]
    below += [Text(line, style="yellow") for line in holds or ()]  # Retry-After holds
    return Group(table, *below) if below else table


def _watch(render: Callable[[], RenderableType], interval: float) -> None:
    """Show ``render()`` every ``interval`` seconds until Ctrl-C (SIGINT), which ends it
    quietly. On a terminal the view is redrawn in place (rich's Live); into a file or
    a pipe, each one is printed after the last.

    Raises what ``render`` raises (a database error ends the watch).
    """
    from rich.live import Live

    console = data_console()
    try:
        if not console.is_terminal:
            while True:
                console.print(render())
                time.sleep(interval)
        with Live(render(), console=console, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                live.update(render(), refresh=True)
    except KeyboardInterrupt:
        return


@app.command()
def result(
    partition_id: Annotated[str, typer.Argument(help="The partition whose result to print.")],
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
) -> None:
    """Print a partition's result (what its reduce stored): JSON pretty-printed, other
    bytes as they are."""
    from processor.client import Client

    url = database_url(db_url, table_prefix)
    with Client(url, table_prefix) as client:
        info = client.partition(partition_id)
    if info.result is None:
        raise fail(f"partition {partition_id!r} has no result yet (it is {info.status} at gate "
                   f"{info.gate}; a reduce gate stores one)", EXIT_NO_RESULT)
    try:
        typer.echo(json.dumps(json.loads(info.result), indent=2, ensure_ascii=False))
    except ValueError:
        sys.stdout.buffer.write(info.result)
        sys.stdout.buffer.flush()


@app.command()
def items(
    partition_id: Annotated[str, typer.Argument(
        help="The partition's id (leave it out with --find).")] = "",
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    status: Annotated[str, typer.Option("--status", help="Only items with this status: "
                                        "available, complete or failed.")] = "",
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

    from processor.client import Client
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
        typer.echo("no items" + (" match" if status or gate is not None or after else ""))
    if page.next_cursor is not None:
        where = " ".join(shlex.quote(part) for part in (
            partition_id, *(("--status", status) if status else ()),
            *(("--gate", str(gate)) if gate is not None else ()),
            "--limit", str(limit), "--after", page.next_cursor))
        typer.echo(f"more: processor items {where}")


# How much of an item's data `items --show` prints without --all (characters).
SHOW_DATA_CHARS = 4000


def _show_item(partition_id: str, item_id: str, db_url: str, table_prefix: str,
               as_json: bool, show_all: bool) -> None:
    """Print one item (``items PARTITION --show ITEM``): text, or JSON with the data whole.

    Raises:
        typer.Exit: the partition holds no such item (one line, exit code 2).
    """
    from processor.client import Client
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
        typer.echo(json.dumps(item_detail(info), indent=2, ensure_ascii=False))
        return
    for line in item_lines(info, data_limit=None if show_all else SHOW_DATA_CHARS):
        typer.echo(line)


def _find_item(item_id: str, db_url: str, table_prefix: str, limit: int,
               as_json: bool) -> None:
    """Print the partitions holding an item with this id (``items --find ITEM``)."""
    from processor.client import Client
    from processor.client_items import MAX_FIND_LIMIT
    from processor.views import error_after_context, error_cell, item_row

    url = database_url(db_url, table_prefix)
    with Client(url, table_prefix) as client:
        found = client.find_items(item_id, limit=min(limit, MAX_FIND_LIMIT))
    if as_json:
        typer.echo(json.dumps([{"partition": item.partition_id, **item_row(item)}
                               for item in found], indent=2))
        return
    if not found:
        typer.echo(f"no partition holds an item {item_id!r}")
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
        typer.echo(f"(the first {limit}; --limit shows more)")
