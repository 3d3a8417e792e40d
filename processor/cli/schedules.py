"""``processor schedules``: add, list, show, pause, resume and delete schedules, each of
which creates the partition ``NAME/<tick time>`` at every tick (the processors tick them).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

# Only light modules at the top: `processor --help` must not wait for SQLAlchemy.
from processor.cli.common import (
    DEFAULT_DB_URL,
    DbUrl,
    JsonOption,
    TablePrefix,
    app,
    data_console,
    env_name,
    say,
    say_json,
    with_client,
)
from processor.cli.produce import ITEMS_HELP, MaxItemBytes
from watcher.config import DEFAULT_MAX_ITEM_BYTES

if TYPE_CHECKING:
    from processor.client.async_client import AsyncClient

T = TypeVar("T")

schedules_app = typer.Typer(
    help="Schedules: create the partition NAME/<tick time> at each tick of a cron expression "
    "or an interval, once across the fleet, while processors run.",
    no_args_is_help=True, rich_markup_mode=None)
app.add_typer(schedules_app, name="schedules")

NameArgument = Annotated[str, typer.Argument(help="The schedule's name.")]


@schedules_app.command("add")
def add(
    name: NameArgument,
    cron: Annotated[str, typer.Option("--cron", show_default=False,
                                      help="A cron expression of five fields: minute hour "
                                      "day-of-month month day-of-week, such as '0 3 * * *'.")
                    ] = "",
    timezone: Annotated[str, typer.Option("--timezone", show_default=False,
                                          help="The IANA time zone the cron expression is "
                                          "read in (UTC by default): Europe/Berlin.")] = "",
    every: Annotated[str, typer.Option("--every", show_default=False,
                                       help="Instead of --cron: a tick every DURATION from "
                                       "now, 1s at least: 90s, 15m, 1h.")] = "",
    items_file: Annotated[str, typer.Option("--items", envvar=env_name("ITEMS"),
                                            show_default=False,
                                            help=ITEMS_HELP + " Every tick's partition gets "
                                            "them. Without it: empty partitions.")] = "",
    reduce_gates: Annotated[str, typer.Option("--reduce-gates",
                                              help="Gates whose step is one reduce call "
                                              "over the whole gate, comma-separated: 1,3.")
                            ] = "",
    on_item_failure: Annotated[str, typer.Option("--on-item-failure",
                                                 help="fail or continue, as for create.")
                               ] = "fail",
    key: Annotated[str, typer.Option("--key", show_default=False,
                                     help="The partitions' concurrency key.")] = "",
    priority: Annotated[int, typer.Option("--priority", help="From -10 to 10.")] = 0,
    catch_up: Annotated[str, typer.Option("--catch-up",
                                          help="After downtime: skip (create the latest "
                                          "missed tick), all (every missed tick, the latest "
                                          "1,000) or none (wait for the next tick).")
                        ] = "skip",
    no_overlap: Annotated[bool, typer.Option("--no-overlap",
                                             help="Skip a tick while the last partition "
                                             "is still open.")] = False,
    notify: Annotated[str, typer.Option(
        "--notify", envvar=env_name("NOTIFY"), show_default=False, metavar="URL",
        help="An http(s) URL each tick's partition is POSTed a signed event to when it "
        "ends, as for create (docs/how-to/notifications.md).")] = "",
    pipeline: Annotated[str, typer.Option(
        "--pipeline", envvar=env_name("PIPELINE"), metavar="NAME",
        help="The pipeline whose routes serve each tick's partition.")] = "default",
    pipeline_version: Annotated[str, typer.Option(
        "--pipeline-version", envvar=env_name("PIPELINE_VERSION"), show_default=False,
        metavar="VERSION",
        help="The pipeline version each tick's partition keeps (default: the routes' "
        "current one at its first lease).")] = "",
    max_item_bytes: MaxItemBytes = DEFAULT_MAX_ITEM_BYTES,
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    as_json: JsonOption = False,
) -> None:
    """Add a schedule. Each tick creates the partition NAME/<tick time, ISO 8601 UTC>, such
    as nightly/2026-11-28T03:00:00Z, with the items of --items and the settings given,
    exactly once across the fleet. Everything is checked before anything is written."""
    from processor.cli.create_options import parse_gates, parse_policy
    from processor.cli.produce import _limits, _read_items, _spool
    from processor.client.schedules import check_schedule_name, new_schedule
    from watcher.rules.durations import parse_duration

    check_schedule_name(name)
    seconds = parse_duration("--every", every) if every else None
    limits = _limits(max_item_bytes)
    gates, policy = parse_gates(reduce_gates), parse_policy(on_item_failure)
    targets = {"notify": notify or None, "pipeline": pipeline,
               "pipeline_version": pipeline_version or None}
    # Every check first, so a bad option is named before the items are read.
    new_schedule(name, cron=cron or None, timezone=timezone or None, every=seconds, items=(),
                 reduce_gates=gates, on_item_failure=policy, priority=priority,
                 key=key or None, catch_up=catch_up, no_overlap=no_overlap,
                 max_item_bytes=max_item_bytes, **targets)
    with _spool() as spool:
        if items_file:
            _read_items(f"{name}/<tick>", items_file, limits, spool)
        items = [item for batch in spool.batches() for item in batch]
    info = with_client(db_url, table_prefix, lambda client: client.add_schedule(
        name, cron=cron or None, timezone=timezone or None, every=seconds, items=items,
        reduce_gates=gates, on_item_failure=policy, priority=priority, key=key or None,
        catch_up=catch_up, no_overlap=no_overlap, **targets), max_item_bytes=max_item_bytes)
    _print_schedule(info, as_json)


@schedules_app.command("list")
def list_(
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    limit: Annotated[int, typer.Option(help="Show at most this many.")] = 1000,
    as_json: JsonOption = False,
) -> None:
    """List the schedules by name, with their next and last ticks."""
    from rich.table import Table

    from processor.schedule_views import schedule_dict, timing_text

    infos = with_client(db_url, table_prefix, lambda client: client.schedules(limit))
    if as_json:
        say_json([schedule_dict(info) for info in infos])
        return
    if not infos:
        say("no schedules; add one with `processor schedules add NAME --cron EXPR`")
        return
    table = Table()
    # The ticks' times never wrap or cut (a cut one reads as another time); the names,
    # the timing and the last partition fold over lines, whole.
    for column in ("schedule", "when", "catch-up", "next tick", "last tick", "last partition"):
        table.add_column(column, overflow="fold", no_wrap=column.endswith("tick"))
    for info in infos:
        shown = schedule_dict(info)
        table.add_row(info.name, timing_text(info), shown["catch_up"]
                      + (" no-overlap" if info.no_overlap else ""),
                      "paused" if shown["paused"] else shown["next_tick"] or "-",
                      shown["last_tick"] or "-", shown["last_partition"] or "-")
    data_console().print(table)


@schedules_app.command("show")
def show(name: NameArgument, db_url: DbUrl = DEFAULT_DB_URL, table_prefix: TablePrefix = "",
         as_json: JsonOption = False) -> None:
    """Show one schedule: its timing, policy, partition settings and ticks."""
    info = with_client(db_url, table_prefix, lambda client: client.schedule(name))
    _print_schedule(info, as_json)


def _print_schedule(info: Any, as_json: bool) -> None:
    """A schedule as JSON, or as lines whose data (its key, its name, its settings) is
    printed with control characters escaped: seen, never obeyed by the terminal."""
    from processor.schedule_views import schedule_dict, schedule_lines

    if as_json:
        say_json(schedule_dict(info))
        return
    for line in schedule_lines(info):
        say(line)


def _verb(name: str, db_url: str, table_prefix: str, as_json: bool, verb: str,
          call: Callable[[AsyncClient], Awaitable[Any]], already: str) -> None:
    from processor.client.schedules import check_schedule_name

    check_schedule_name(name)
    changed = with_client(db_url, table_prefix, call)
    if as_json:
        say_json({"name": name, "changed": changed is not False})
    elif changed is False:
        say(f"schedule {name} was {already} already")
    else:
        say(f"schedule {name} {verb}")


@schedules_app.command("pause")
def pause(name: NameArgument, db_url: DbUrl = DEFAULT_DB_URL, table_prefix: TablePrefix = "",
          as_json: JsonOption = False) -> None:
    """Pause a schedule: no ticks until it is resumed."""
    _verb(name, db_url, table_prefix, as_json, "paused",
          lambda client: client.pause_schedule(name), "paused")


@schedules_app.command("resume")
def resume(name: NameArgument, db_url: DbUrl = DEFAULT_DB_URL, table_prefix: TablePrefix = "",
           as_json: JsonOption = False) -> None:
    """Resume a schedule from its next tick (the ticks of the pause are not caught up)."""
    _verb(name, db_url, table_prefix, as_json, "resumed",
          lambda client: client.resume_schedule(name), "running")


@schedules_app.command("delete")
def delete(name: NameArgument, db_url: DbUrl = DEFAULT_DB_URL, table_prefix: TablePrefix = "",
           as_json: JsonOption = False) -> None:
    """Delete a schedule; the partitions it created stay."""
    _verb(name, db_url, table_prefix, as_json, "deleted",
          lambda client: client.delete_schedule(name), "deleted")


