"""The operator's verbs that change partitions: retry, rewind, cancel, delete, purge,
set-gate."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

# Only light modules at the top: `processor --help` and the one-line errors must not wait for
# SQLAlchemy, SQLModel or the HTTP clients; each verb imports what it uses.

if TYPE_CHECKING:
    from watcher.pipelines import ServedRoute

from processor.cli.common import (
    DEFAULT_DB_URL,
    DEFAULT_PURGE_BATCH,
    DEFAULT_PURGE_STATUSES,
    DbUrl,
    JsonOption,
    NotifyUrl,
    PartitionArgument,
    TablePrefix,
    app,
    database_url,
    fail,
    say,
)


@app.command()
def retry(
    partition_id: PartitionArgument,
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    as_json: JsonOption = False,
) -> None:
    """Run a partition's failed items again, with their attempts reset. A complete, failed
    or cancelled partition re-opens at its lowest failed gate, and each reduce gate it had
    finished from there on runs again over its whole gate; a failed reduce is re-armed.
    Prints what was done."""
    from processor.client.sync_client import Client
    from processor.views import retry_row, retry_text

    url = database_url(db_url, table_prefix)
    with Client(url, table_prefix) as client:
        report = client.retry_failed(partition_id)
    if as_json:
        typer.echo(json.dumps(retry_row(report)))
        return
    say(retry_text(report))


@app.command(context_settings={"allow_extra_args": True})
def rewind(
    context: typer.Context,
    partition_id: PartitionArgument,
    gate: Annotated[int, typer.Option("--gate", show_default=False,
                                      help="The gate to move the partition back to (at most "
                                      "the gate it is at).")],
    failed_only: Annotated[bool, typer.Option("--failed-only", help="Send back only the "
                                              "failed items at the gate or later.")] = False,
    items: Annotated[list[str] | None, typer.Option(
        "--items", show_default=False, help="Send back only these items (ids after "
        "--items, space-separated; each at the gate or later).")] = None,
    if_version: Annotated[int | None, typer.Option(
        "--if-version", show_default=False, help="Only if the partition is still at this "
        "version (its `version` in `processor status --json`).")] = None,
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    as_json: JsonOption = False,
) -> None:
    """Move a partition back to gate --gate and run again from there: the items at that
    gate or later (only the failed ones with --failed-only, only the named ones with
    --items) go back to it with their attempts reset, the items they spawned there or later
    are removed, and every reduce from that gate on runs again. Works on a complete,
    failed, cancelled or open partition (it re-opens); refused, writing nothing, when it
    means nothing."""
    from processor.client.sync_client import Client
    from processor.views import rewind_row, rewind_text

    extra = list(context.args)
    if extra and items is None:
        raise fail(f"unexpected argument {extra[0]!r}: rewind takes one partition id "
                   "(name items after --items)")
    named = None if items is None else [*items, *extra]
    url = database_url(db_url, table_prefix)
    with Client(url, table_prefix) as client:
        report = client.rewind(partition_id, gate, failed_only=failed_only, items=named,
                               version=if_version)
    if as_json:
        typer.echo(json.dumps(rewind_row(report)))
        return
    say(rewind_text(report))


@app.command()
def cancel(
    partition_id: PartitionArgument,
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    as_json: JsonOption = False,
    notify_url: NotifyUrl = "",
) -> None:
    """Stop a partition: no processor dispatches its items again (its holder lets it go
    within a poll interval, and late results are dropped). `processor retry` resumes it."""
    from processor.client.sync_client import Client
    from processor.notify.targets import check_url

    check_url("--notify-url (PROCESSOR_NOTIFY_URL)", notify_url or None)
    url = database_url(db_url, table_prefix)
    with Client(url, table_prefix, notify_default=notify_url or None) as client:
        cancelled = client.cancel(partition_id)
        info = client.partition(partition_id)
    if as_json:
        typer.echo(json.dumps({"id": info.id, "cancelled": cancelled, "status": info.status,
                               "gate": info.gate, "counts": info.counts}))
    elif cancelled:
        say(f"cancelled partition {partition_id!r} at gate {info.gate} (items: "
                   f"{_counts_text(info.counts)}); `processor retry` resumes it, "
                   "`processor delete` removes it")
    else:
        say(f"partition {partition_id!r} is {info.status} already; nothing to cancel")


OptionalPartition = Annotated[str | None, typer.Argument(
    show_default=False, help="The partition's id (or --key KEY, or --all).")]
KeyOption = Annotated[str, typer.Option("--key", show_default=False,
                                        help="Every partition of this concurrency key.")]
AllOption = Annotated[bool, typer.Option("--all", help="Everything: every partition of "
                                         "every key (their own pauses stay as they are).")]


@app.command()
def pause(
    partition_id: OptionalPartition = None,
    key: KeyOption = "",
    everything: AllOption = False,
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    as_json: JsonOption = False,
) -> None:
    """Pause a partition, a key (--key) or everything (--all) until `processor resume`: no
    new calls from the next poll (calls in flight finish and are written), and no
    processor leases it, across restarts."""
    from processor.cli.flow import pause_or_resume

    pause_or_resume(partition_id, key, everything, db_url, table_prefix, as_json,
                    pausing=True)


@app.command()
def resume(
    partition_id: OptionalPartition = None,
    key: KeyOption = "",
    everything: AllOption = False,
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    as_json: JsonOption = False,
) -> None:
    """Lift the pause of a partition, a key (--key) or everything (--all): processors
    lease its work again within a lease cycle."""
    from processor.cli.flow import pause_or_resume

    pause_or_resume(partition_id, key, everything, db_url, table_prefix, as_json,
                    pausing=False)


def _counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{count} {status}" for status, count in sorted(counts.items())) or "none"


@app.command()
def delete(
    partition_id: PartitionArgument,
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    force: Annotated[bool, typer.Option("--force", help="Delete it even while a processor "
                                        "holds it (cancelling it first).")] = False,
    batch: Annotated[int, typer.Option(help="Items deleted per transaction.")
                     ] = DEFAULT_PURGE_BATCH,
    as_json: JsonOption = False,
) -> None:
    """Delete a partition and its items (in batches). Refused while a processor holds it,
    unless --force."""
    from processor.client.sync_client import Client

    url = database_url(db_url, table_prefix)
    with Client(url, table_prefix) as client:
        deleted = client.delete_partition(partition_id, force=force, batch=batch)
    if as_json:
        typer.echo(json.dumps({"id": partition_id, "deleted": True, "items": deleted}))
        return
    say(f"deleted partition {partition_id!r} and its {deleted} item(s)")


@app.command()
def purge(
    older_than: Annotated[str, typer.Option("--older-than", help="Delete partitions last "
                                            "updated longer ago than this: 7d, 12h, 30m, "
                                            "90s.")],
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    status: Annotated[str, typer.Option("--status", help="Statuses to delete, "
                                        "comma-separated: complete, cancelled, failed.")
                      ] = DEFAULT_PURGE_STATUSES,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count what would be deleted; "
                                          "delete nothing.")] = False,
    batch: Annotated[int, typer.Option(help="Items deleted per transaction.")
                     ] = DEFAULT_PURGE_BATCH,
    as_json: JsonOption = False,
) -> None:
    """Delete finished partitions (complete and cancelled by default) and their items,
    in batches, when they were last updated longer ago than --older-than."""
    from processor.client.sync_client import Client
    from processor.views import purge_text
    from watcher.retention import check_statuses
    from watcher.rules.durations import parse_duration

    seconds = parse_duration("--older-than", older_than)
    statuses = check_statuses("--status", status)
    url = database_url(db_url, table_prefix)
    with Client(url, table_prefix) as client:
        report = client.purge(older_than=seconds, statuses=statuses, batch=batch,
                              dry_run=dry_run)
    if as_json:
        typer.echo(json.dumps({"dry_run": dry_run, "partitions": report.partitions,
                               "items": report.items, "older_than_seconds": seconds,
                               "statuses": list(statuses)}))
        return
    say(purge_text(report, older_than=seconds, statuses=statuses, dry_run=dry_run))


@app.command("set-gate")
def set_gate(
    partition_id: PartitionArgument,
    gate: Annotated[int, typer.Argument(help="The gate to move the partition to (forward "
                                        "only).")],
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    as_json: JsonOption = False,
) -> None:
    """Move an open partition's gate forward (a manual checkpoint). Refused, writing
    nothing, on a complete, failed or cancelled partition, while items below the new gate
    are still available, and when no item of it is available."""
    from processor.client.sync_client import Client

    url = database_url(db_url, table_prefix)
    with Client(url, table_prefix) as client:
        client.set_gate(partition_id, gate)
        info = client.partition(partition_id)
    if as_json:
        typer.echo(json.dumps({"id": info.id, "gate": info.gate, "status": info.status}))
        return
    say(f"partition {partition_id!r} is at gate {info.gate} ({info.status})")


pipelines_app = typer.Typer(
    help="Pipelines: the open partitions per pipeline and version, and moving a partition "
    "to another version (docs/how-to/pipelines.md).", no_args_is_help=True,
    rich_markup_mode=None)
app.add_typer(pipelines_app, name="pipelines")


@pipelines_app.command("list")
def pipelines_list(
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    as_json: JsonOption = False,
) -> None:
    """The open partitions of each pipeline and version, and how many a processor holds
    ("-": no version pinned yet; a processor pins its routes' current one at the first
    lease)."""
    from rich.table import Table

    from processor.cli.common import data_console
    from processor.client.sync_client import Client

    url = database_url(db_url, table_prefix)
    with Client(url, table_prefix) as client:
        counts = client.pipelines()
    if as_json:
        typer.echo(json.dumps([{"pipeline": count.pipeline, "version": count.version,
                                "open": count.open, "leased": count.leased}
                               for count in counts], indent=2))
        return
    if not counts:
        say("no open partitions")
        return
    table = Table("pipeline", "version", "open", "leased")
    for count in counts:
        table.add_row(count.pipeline, count.version or "-", str(count.open), str(count.leased))
    data_console().print(table)


@pipelines_app.command("move")
def pipelines_move(
    partition_id: PartitionArgument,
    version: Annotated[str, typer.Option("--version", show_default=False, metavar="VERSION",
                                         help="The pipeline version it moves to (required).")
                       ] = "",
    expect: Annotated[int | None, typer.Option(
        "--expect-version", show_default=False, metavar="N",
        help="Move only while the partition is at this partition version "
        "(as a read of it gave it: the client's partition(id).version).")] = None,
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    as_json: JsonOption = False,
) -> None:
    """Move a partition to another version of its pipeline: from its next lease on, its
    calls go to that version's routes. A processor holding it lets it go at once, and one
    serving the version takes it. Refused for a complete partition (nothing runs again)."""
    from processor.client.sync_client import Client

    if not version:
        raise fail("--version is required: the pipeline version to move the partition to")
    url = database_url(db_url, table_prefix)
    with Client(url, table_prefix) as client:
        moved = client.move_pipeline_version(partition_id, version, version=expect)
    if as_json:
        typer.echo(json.dumps({"id": moved.partition_id, "pipeline": moved.pipeline,
                               "before": moved.before, "after": moved.after,
                               "version": moved.version, "released": moved.released}))
        return
    say(f"moved partition {partition_id!r} of pipeline {moved.pipeline!r} from "
        f"{'no version' if moved.before is None else 'version ' + repr(moved.before)} to "
        f"version {moved.after!r}"
        + ("; the processor holding it let it go" if moved.released else ""))


def served_text(serves: tuple[ServedRoute, ...] | None) -> str:
    """What a processor serves, as ``processors`` prints it: ``every pipeline and gate``,
    or each table of routes as ``PIPELINE[@VERSION] gates 0,1`` (``gates *``: every gate;
    ``@*``: every version)."""
    if serves is None:
        return "every pipeline and gate"
    parts = []
    for route in serves:
        gates = "*" if route.gates is None else ",".join(str(g) for g in sorted(route.gates))
        parts.append(f"{route.pipeline}@{route.version or '*'} gates {gates}")
    return "; ".join(parts)


@app.command("processors")
def processors_list(
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    as_json: JsonOption = False,
) -> None:
    """The live processors (each writes its row every renew interval; a row whose time
    passed by the database clock does not count) and the pipelines, versions and gates
    each serves; `status` names the places none of them serves."""
    from rich.table import Table

    from processor.cli.common import data_console
    from processor.client.sync_client import Client

    url = database_url(db_url, table_prefix)
    with Client(url, table_prefix) as client:
        live = client.processors()
    if as_json:
        typer.echo(json.dumps([{
            "owner": info.owner, "until": info.until.isoformat(),
            "updated_at": info.updated_at.isoformat(),
            "serves": None if info.serves is None else [
                {"pipeline": route.pipeline, "version": route.version,
                 "gates": None if route.gates is None else sorted(route.gates)}
                for route in info.serves]} for info in live], indent=2))
        return
    if not live:
        say("no live processor: none has written its row within its renew interval")
        return
    table = Table("processor", "serves", "last seen (UTC)")
    for info in live:
        table.add_row(info.owner, served_text(info.serves),
                      info.updated_at.strftime("%Y-%m-%d %H:%M:%S"))
    data_console().print(table)
