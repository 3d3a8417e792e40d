"""``processor notifications``: the events the processors send to partitions' notify
URLs (pending, delivered, dead), and sending dead ones again."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

# Only light modules at the top: `processor --help` must not wait for SQLAlchemy.
from processor.cli.common import (
    DEFAULT_DB_URL,
    DbUrl,
    JsonOption,
    TablePrefix,
    app,
    data_console,
    say,
    with_client,
)

if TYPE_CHECKING:
    from processor.client.async_client import AsyncClient
    from watcher.records import OutboxEvent

T = TypeVar("T")

notifications_app = typer.Typer(
    help="Notifications: the signed events POSTed to a partition's --notify URL when it "
    "ends; list them (pending, delivered, dead) and send dead ones again.",
    no_args_is_help=True, rich_markup_mode=None)
app.add_typer(notifications_app, name="notifications")


def counts_line(counts: dict[str, int]) -> str:
    """One line of the outbox's counts: ``2 pending (1 due now), 1 dead``."""
    return (f"{counts.get('pending', 0)} pending ({counts.get('due', 0)} due now), "
            f"{counts.get('dead', 0)} dead")


@notifications_app.command("list")
def list_(
    state: Annotated[str, typer.Option("--state", show_default=False,
                                       help="Only events in this state: pending, "
                                       "delivered or dead.")] = "",
    partition: Annotated[str, typer.Option("--partition", show_default=False,
                                           help="Only this partition's events.")] = "",
    after: Annotated[int, typer.Option("--after", help="Events after this number (the "
                                       "first column): the next page.")] = 0,
    limit: Annotated[int, typer.Option("--limit", help="At most this many (up to 1000).")
                     ] = 100,
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    as_json: JsonOption = False,
) -> None:
    """List notification events in the order they were written, with their delivery
    state, attempts and last error, and below them how many are pending and dead."""
    from rich.table import Table

    from processor.notify.events import event_row, rfc3339

    async def read(client: AsyncClient) -> tuple[list[OutboxEvent], dict[str, int]]:
        events = await client.notifications(state=state or None,
                                            partition_id=partition or None,
                                            after=after or None, limit=limit)
        return events, await client.notification_counts()

    events, counts = with_client(db_url, table_prefix, read)
    if as_json:
        typer.echo(json.dumps({"events": [event_row(event) for event in events],
                               "counts": counts}, indent=2))
        return
    table = Table("#", "partition", "status", "state", "attempts", "next / last", "last error")
    for event in events:
        when = event.next_at if event.state == "pending" else event.updated_at
        table.add_row(str(event.seq), event.partition_id, event.status, event.state,
                      str(event.attempts), rfc3339(when) or "-", event.last_error or "-")
    if events:
        data_console().print(table)
    else:
        say("no notification events" + (f" in state {state}" if state else ""))
    say(f"notifications: {counts_line(counts)}")


@notifications_app.command("redeliver")
def redeliver(
    seqs: Annotated[list[int], typer.Argument(help="The dead events' numbers (the first "
                                              "column of `processor notifications list`).")],
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
) -> None:
    """Send dead events again: they become pending, due now, with their attempts counted
    from zero. Events that are not dead are left as they are."""
    done = with_client(db_url, table_prefix,
                        lambda client: client.redeliver_notifications(seqs))
    say(f"{done} of {len(seqs)} dead event{'s' if len(seqs) != 1 else ''} will be sent again")
