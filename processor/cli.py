"""The ``processor`` command: migrate, run, status and result; the operator's verbs items,
retry, cancel, delete, purge and set-gate; the web console; and demo.

Every option can also be set as an environment variable ``PROCESSOR_<OPTION>``
(``--db-url`` is ``PROCESSOR_DB_URL``). Configuration errors print one line on
stderr and exit with status 2; database failures exit with status 1.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from typing import TYPE_CHECKING, Annotated

import typer

# Only light modules at the top: `processor --help` and the one-line errors must not wait for
# SQLAlchemy, SQLModel or the HTTP clients; each verb imports what it uses.
from processor.http_config import (
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_TRANSPORT,
)
from watcher.config import (
    DEFAULT_CONCURRENCY,
    DEFAULT_DB_TIMEOUT,
    DEFAULT_LEASE_DURATION,
    DEFAULT_MAX_ITEM_BYTES,
    DEFAULT_MAX_LEASES,
    DEFAULT_MAX_RETRIES,
    DEFAULT_MAX_SPAWN,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_REDUCE_PAGE_ITEMS,
    DEFAULT_RETRY_BACKOFF,
    DEFAULT_RETRY_BACKOFF_MAX,
    DEFAULT_SHUTDOWN_TIMEOUT,
    WatcherConfig,
    default_owner_id,
)
from watcher.errors import ConfigError, DatabaseError, StatefeedError
from watcher.text import error_text

if TYPE_CHECKING:
    from rich.console import Console

    from watcher.dburl import DatabaseURL

DEFAULT_DB_URL = "sqlite:///processor.db"
# Defaults of `processor run` that have no home in an engine or HTTP config object.
DEFAULT_HANDLER_BATCH_SIZE = 0  # one item per request
DEFAULT_HEALTH_PORT = 8080
DEFAULT_HEALTH_HOST = "0.0.0.0"
DEFAULT_LOG_LEVEL = "info"
DEFAULT_STATUS_LIMIT = 100
DEFAULT_ITEMS_LIMIT = 50
DEFAULT_PURGE_BATCH = 1000
DEFAULT_PURGE_STATUSES = "complete,cancelled"
DEFAULT_RETENTION_INTERVAL = "60s"
DEFAULT_BACKLOG_INTERVAL = 5.0
EXIT_DATABASE = 1
EXIT_CONFIG = 2
EXIT_NO_RESULT = 3
LOG_LEVELS = ("debug", "info", "warning", "error")

app = typer.Typer(
    name="processor",
    help="statefeed processor: lease partitions from SQL and drive their items through an "
    "HTTP handler, gate by gate.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    add_completion=False,
)


def _env(name: str) -> str:
    return f"PROCESSOR_{name}"


DbUrl = Annotated[str, typer.Option("--db-url", envvar=_env("DB_URL"),
                                    help="Database URL: sqlite:///file.db or "
                                    "postgresql://user:password@host:5432/dbname.")]
TablePrefix = Annotated[str, typer.Option("--table-prefix", envvar=_env("TABLE_PREFIX"),
                                          help="Prefix for statefeed's table names.")]


def fail(message: str, code: int = EXIT_CONFIG) -> typer.Exit:
    """Print one line on stderr and return the exit to raise."""
    typer.echo(f"processor: error: {message}", err=True)
    return typer.Exit(code)


def _database(raw: str, prefix: str, *, migrated: bool = True) -> DatabaseURL:
    """The parsed URL; with ``migrated``, after checking the database has statefeed's
    tables (a SQLite file that does not exist is reported, not created).

    Raises:
        ConfigError: the URL or the prefix is invalid.
        DatabaseError: the database is unreachable, or was never migrated ("run
            `processor migrate` first": the same line on every verb).
    """
    from watcher.dburl import parse_database_url
    from watcher.schema import validate_table_prefix

    url = parse_database_url(raw)
    validate_table_prefix(prefix)
    if migrated:
        from sqlalchemy.exc import SQLAlchemyError

        from watcher.store import require_migrated

        try:
            asyncio.run(require_migrated(url, prefix))
        except (SQLAlchemyError, OSError) as error:
            from processor.service import describe_db_error

            raise DatabaseError(describe_db_error(error, url)) from None
    return url


def _data_console(**options: object) -> Console:
    """A Rich console that prints text literally: ids, owners and error texts are data, and
    Rich would read ``[...]`` in them as markup (``[/x]`` even raises) and ``:name:`` as an
    emoji."""
    from rich.console import Console

    return Console(markup=False, emoji=False, highlight=False, **options)  # type: ignore[arg-type]


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    # httpx logs each request URL at INFO; keep the processor's lines readable.
    logging.getLogger("httpx").setLevel(logging.WARNING)


@app.command()
def migrate(
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    sql: Annotated[bool, typer.Option("--sql", help="Print the DDL for the URL's database "
                                      "without connecting.")] = False,
) -> None:
    """Create or upgrade statefeed's tables."""
    from sqlalchemy.exc import SQLAlchemyError

    from watcher.migrate import upgrade, upgrade_sql

    url = _database(db_url, table_prefix, migrated=False)
    if sql:
        typer.echo(upgrade_sql(url, table_prefix))
        return
    try:
        upgrade(url, table_prefix)
    except SQLAlchemyError as error:
        from processor.service import describe_db_error  # the service's HTTP stack: on failure only

        raise fail(describe_db_error(error, url), EXIT_DATABASE) from None
    typer.echo(f"statefeed tables are up to date in {url.redacted()}"
               + (f" (prefix {table_prefix!r})" if table_prefix else ""))


@app.command()
def run(
    handler_url: Annotated[str, typer.Option("--handler-url", envvar=_env("HANDLER_URL"),
                                             help="URL the items are POSTed to.")] = "",
    # No default: a container that forgot PROCESSOR_DB_URL must not run on a SQLite file
    # of its own and report ready.
    db_url: Annotated[str, typer.Option("--db-url", envvar=_env("DB_URL"), show_default=False,
                                        help="Database URL (required): "
                                        "postgresql://user:password@host:5432/dbname, "
                                        "sqlite:///file.db, ...")] = "",
    owner_id: Annotated[str, typer.Option(envvar=_env("OWNER_ID"),
                                          help="Unique id of this processor (default: "
                                          "host-pid-random).")] = "",
    concurrency: Annotated[int, typer.Option(envvar=_env("CONCURRENCY"),
                                             help="Handler calls in flight at once.")
                           ] = DEFAULT_CONCURRENCY,
    poll_interval: Annotated[float, typer.Option(envvar=_env("POLL_INTERVAL"),
                                                 help="Seconds between scans for work.")
                             ] = DEFAULT_POLL_INTERVAL,
    lease_duration: Annotated[float, typer.Option(envvar=_env("LEASE_DURATION"),
                                                  help="Lease length in seconds (>= 1).")
                              ] = DEFAULT_LEASE_DURATION,
    max_leases: Annotated[int, typer.Option(envvar=_env("MAX_LEASES"),
                                            help="Partitions this processor leases at most.")
                          ] = DEFAULT_MAX_LEASES,
    max_retries: Annotated[int, typer.Option(envvar=_env("MAX_RETRIES"),
                                             help="Retries before an item fails.")
                           ] = DEFAULT_MAX_RETRIES,
    retry_backoff: Annotated[float, typer.Option(envvar=_env("RETRY_BACKOFF"),
                                                 help="First retry delay in seconds; "
                                                 "doubles per retry.")] = DEFAULT_RETRY_BACKOFF,
    auto_close: Annotated[bool, typer.Option("--auto-close/--no-auto-close",
                                             envvar=_env("AUTO_CLOSE"),
                                             help="Close partitions when all items are "
                                             "done.")] = True,
    manual_checkpoint: Annotated[bool, typer.Option(envvar=_env("MANUAL_CHECKPOINT"),
                                                    help="Never move gates; clients do.")
                                 ] = False,
    table_prefix: TablePrefix = "",
    handler_header: Annotated[list[str] | None, typer.Option(
        help="Extra request header 'Name: value' (repeatable), e.g. an Authorization "
        "header. Env: PROCESSOR_HANDLER_HEADER, one header per line.")] = None,
    handler_health_url: Annotated[str, typer.Option(envvar=_env("HANDLER_HEALTH_URL"),
                                                    help="Handler URL checked by /readyz.")
                                  ] = "",
    handler_batch_size: Annotated[int, typer.Option(envvar=_env("HANDLER_BATCH_SIZE"),
                                                    help="Send up to N items per request "
                                                    "to the batch URL (0 = one item per "
                                                    "request).")
                                ] = DEFAULT_HANDLER_BATCH_SIZE,
    handler_batch_url: Annotated[str, typer.Option(envvar=_env("HANDLER_BATCH_URL"),
                                                   help="Batch protocol URL (default: "
                                                   "<handler-url>/batch).")] = "",
    handler_reduce_url: Annotated[str, typer.Option(envvar=_env("HANDLER_REDUCE_URL"),
                                                    help="Where reduce gates are POSTed "
                                                    "(default: <handler-url>/reduce).")
                                  ] = "",
    max_item_bytes: Annotated[int, typer.Option(envvar=_env("MAX_ITEM_BYTES"),
                                                help="Largest item data a handler may answer; "
                                                "a larger answer fails its item.")
                              ] = DEFAULT_MAX_ITEM_BYTES,
    max_spawn: Annotated[int, typer.Option(envvar=_env("MAX_SPAWN"),
                                           help="Most items one answer may spawn; a larger "
                                           "fan-out pages (spawn a slice, answer the same "
                                           "gate with a cursor).")] = DEFAULT_MAX_SPAWN,
    reduce_page_items: Annotated[int, typer.Option(envvar=_env("REDUCE_PAGE_ITEMS"),
                                                   help="A reduce gate of up to N items is "
                                                   "one call; a larger one goes in pages "
                                                   "of N (a fold pass, then an apply "
                                                   "pass).")] = DEFAULT_REDUCE_PAGE_ITEMS,
    http_transport: Annotated[str, typer.Option(envvar=_env("HTTP_TRANSPORT"),
                                                help="aiohttp (fast at high concurrency) "
                                                "or httpx (httpx's own pool).")
                            ] = DEFAULT_TRANSPORT,
    request_timeout: Annotated[float, typer.Option(envvar=_env("REQUEST_TIMEOUT"),
                                                   help="Seconds one handler call may take.")
                               ] = DEFAULT_REQUEST_TIMEOUT,
    max_response_bytes: Annotated[int, typer.Option(envvar=_env("MAX_RESPONSE_BYTES"),
                                                    help="Largest handler response accepted.")
                                  ] = DEFAULT_MAX_RESPONSE_BYTES,
    ca_bundle: Annotated[str, typer.Option(envvar=_env("CA_BUNDLE"),
                                           help="CA bundle for the handler's TLS "
                                           "certificate (verification is always on).")] = "",
    shutdown_timeout: Annotated[float, typer.Option(envvar=_env("SHUTDOWN_TIMEOUT"),
                                                    help="Seconds to finish in-flight items "
                                                    "on SIGTERM.")] = DEFAULT_SHUTDOWN_TIMEOUT,
    health_port: Annotated[int, typer.Option(envvar=_env("HEALTH_PORT"),
                                             help="Port for /healthz, /readyz and /metrics "
                                             "(0 = off).")] = DEFAULT_HEALTH_PORT,
    health_host: Annotated[str, typer.Option(envvar=_env("HEALTH_HOST"),
                                             help="Address the health port listens on.")
                           ] = DEFAULT_HEALTH_HOST,
    migrate_first: Annotated[bool, typer.Option("--migrate", envvar=_env("MIGRATE"),
                                                help="Create missing tables at start-up.")
                             ] = False,
    db_timeout: Annotated[float, typer.Option(envvar=_env("DB_TIMEOUT"),
                                              help="Seconds one database round trip may "
                                              "take (statement, lock wait, connect); then "
                                              "the connection is dropped and the work tried "
                                              "again.")] = DEFAULT_DB_TIMEOUT,
    exit_on_db_error: Annotated[bool, typer.Option(envvar=_env("EXIT_ON_DB_ERROR"),
                                                   help="Exit instead of waiting when the "
                                                   "database is unreachable at start-up.")
                                ] = False,
    log_level: Annotated[str, typer.Option(envvar=_env("LOG_LEVEL"),
                                           help="debug, info, warning or error.")
                         ] = DEFAULT_LOG_LEVEL,
    retention: Annotated[str, typer.Option(envvar=_env("RETENTION"),
                                           help="Delete finished partitions (those of "
                                           "--retention-status) last updated longer ago than "
                                           "this (7d, 12h, 30m, 90s), in the background, on "
                                           "one processor at a time (default: off).")] = "",
    retention_status: Annotated[str, typer.Option(envvar=_env("RETENTION_STATUS"),
                                                  help="Statuses retention deletes, "
                                                  "comma-separated: complete, cancelled, "
                                                  "failed.")] = DEFAULT_PURGE_STATUSES,
    retention_interval: Annotated[str, typer.Option(envvar=_env("RETENTION_INTERVAL"),
                                                    help="How often retention looks for "
                                                    "partitions to delete.")
                                  ] = DEFAULT_RETENTION_INTERVAL,
    retention_items: Annotated[str, typer.Option(envvar=_env("RETENTION_ITEMS"),
                                                 help="Delete the complete items of open "
                                                 "partitions last updated longer ago than "
                                                 "this (7d, 12h, 30m, 90s), in the background "
                                                 "(default: off).")] = "",
    backlog_interval: Annotated[float, typer.Option(envvar=_env("BACKLOG_INTERVAL"),
                                                    help="Seconds between reads of the "
                                                    "backlog gauges of /metrics, at most.")
                                ] = DEFAULT_BACKLOG_INTERVAL,
) -> None:
    """Lease partitions and dispatch their items to the handler until SIGTERM."""
    from processor.http_config import (
        DEFAULT_MAX_CONNECTIONS,
        HttpProcessorConfig,
        parse_header,
    )
    from processor.service import ProcessorService, ServiceConfig
    from watcher.durations import parse_duration
    from watcher.retention import RetentionConfig, check_statuses

    if not handler_url:
        raise fail("--handler-url is required (or set PROCESSOR_HANDLER_URL)")
    if not db_url:
        raise fail("--db-url is required (or set PROCESSOR_DB_URL): `processor run` never "
                   "picks a database of its own; `processor demo` runs on a throwaway one")
    retention_config = None
    if retention or retention_items:
        retention_config = RetentionConfig(
            older_than=parse_duration("--retention", retention) if retention else None,
            items_older_than=(parse_duration("--retention-items", retention_items)
                              if retention_items else None),
            statuses=check_statuses("--retention-status", retention_status),
            interval=parse_duration("--retention-interval", retention_interval))
    header_specs = list(handler_header or [])
    if not header_specs and os.environ.get(_env("HANDLER_HEADER")):
        # One header per line: values such as "Bearer x" contain spaces.
        header_specs = [line for line in os.environ[_env("HANDLER_HEADER")].splitlines()
                        if line.strip()]
    headers = dict(parse_header(spec) for spec in header_specs)
    if log_level.lower() not in LOG_LEVELS:
        raise fail(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}")
    config = ServiceConfig(
        # The service checks the tables itself: it waits for a database still starting.
        db_url=_database(db_url, table_prefix, migrated=False),
        table_prefix=table_prefix,
        watcher=WatcherConfig(
            owner_id=owner_id or default_owner_id(), concurrency=concurrency,
            poll_interval=poll_interval, lease_duration=lease_duration,
            max_retries=max_retries, retry_backoff=retry_backoff,
            retry_backoff_max=max(retry_backoff, DEFAULT_RETRY_BACKOFF_MAX), auto_close=auto_close,
            manual_checkpoint=manual_checkpoint, shutdown_timeout=shutdown_timeout,
            max_leases=max_leases, reduce_page_items=reduce_page_items,
            max_item_bytes=max_item_bytes, max_spawn=max_spawn),
        http=HttpProcessorConfig(
            handler_url=handler_url, headers=headers, request_timeout=request_timeout,
            max_connections=max(DEFAULT_MAX_CONNECTIONS, concurrency),
            max_response_bytes=max_response_bytes, verify=ca_bundle or True,
            health_url=handler_health_url or None, transport=http_transport,
            reduce_url=handler_reduce_url or None),
        batch_size=handler_batch_size,
        batch_url=handler_batch_url or None,
        health_port=health_port,
        health_host=health_host,
        migrate=migrate_first,
        exit_on_db_error=exit_on_db_error,
        db_timeout=db_timeout,
        retention=retention_config,
        backlog_interval=backlog_interval,
    )
    _setup_logging(log_level)
    code = asyncio.run(ProcessorService(config).run())
    raise typer.Exit(code)


@app.command()
def status(
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")
                       ] = False,
    limit: Annotated[int, typer.Option(help="Show at most this many partitions.")
                     ] = DEFAULT_STATUS_LIMIT,
) -> None:
    """Show partitions with their status, gate, owner, item counts and how many items
    their steps spawned."""
    from processor.client import Client
    from processor.views import partition_row, step_text

    url = _database(db_url, table_prefix)
    with Client(url, table_prefix) as client:
        infos = client.partitions(limit=limit)
    if as_json:
        typer.echo(json.dumps([partition_row(info) for info in infos], indent=2))
        return
    from rich.table import Table

    table = Table(title=f"statefeed partitions in {url.redacted()}")
    for column in ("partition", "status", "gate", "step", "owner", "available", "complete",
                   "failed", "spawned"):
        table.add_column(column, justify="right" if column in (
            "gate", "available", "complete", "failed", "spawned") else "left")
    for info in infos:
        counts = info.counts
        table.add_row(info.id, info.status, str(info.gate), step_text(info), info.owner or "-",
                      *(str(counts.get(s, 0)) for s in ("available", "complete", "failed")),
                      str(info.spawned))
    _data_console().print(table)
    if not infos:
        typer.echo("no partitions yet")


@app.command()
def result(
    partition_id: Annotated[str, typer.Argument(help="The partition whose result to print.")],
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
) -> None:
    """Print a partition's result (what its reduce stored): JSON pretty-printed, other
    bytes as they are."""
    from processor.client import Client

    url = _database(db_url, table_prefix)
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


PartitionArgument = Annotated[str, typer.Argument(help="The partition's id.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]


@app.command()
def items(
    partition_id: PartitionArgument,
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
) -> None:
    """Show a partition's items in id order: id, status, gate, attempts, the item that
    spawned it (its parent) and last error.

    One page at a time; the last line says how to read the next one.
    """
    import shlex

    from processor.client import Client
    from processor.views import error_after_context, error_cell, item_row

    url = _database(db_url, table_prefix)
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
    for column in ("item", "status", "gate", "attempts", "parent", "last error"):
        table.add_column(column, justify="right" if column in ("gate", "attempts") else "left",
                         overflow="fold")
    for item in page:
        table.add_row(item.id, item.status, str(item.gate), str(item.attempts),
                      item.parent or "-", error_cell(error_after_context(item)))
    _data_console(soft_wrap=True).print(table)
    if not page:
        typer.echo("no items" + (" match" if status or gate is not None or after else ""))
    if page.next_cursor is not None:
        where = " ".join(shlex.quote(part) for part in (
            partition_id, *(("--status", status) if status else ()),
            *(("--gate", str(gate)) if gate is not None else ()),
            "--limit", str(limit), "--after", page.next_cursor))
        typer.echo(f"more: processor items {where}")


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
    from processor.client import Client
    from processor.views import retry_row, retry_text

    url = _database(db_url, table_prefix)
    with Client(url, table_prefix) as client:
        report = client.retry_failed(partition_id)
    if as_json:
        typer.echo(json.dumps(retry_row(report)))
        return
    typer.echo(retry_text(report))


@app.command()
def cancel(
    partition_id: PartitionArgument,
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    as_json: JsonOption = False,
) -> None:
    """Stop a partition: no processor dispatches its items again (its holder lets it go
    within a poll interval, and late results are dropped). `processor retry` resumes it."""
    from processor.client import Client

    url = _database(db_url, table_prefix)
    with Client(url, table_prefix) as client:
        cancelled = client.cancel(partition_id)
        info = client.partition(partition_id)
    if as_json:
        typer.echo(json.dumps({"id": info.id, "cancelled": cancelled, "status": info.status,
                               "gate": info.gate, "counts": info.counts}))
    elif cancelled:
        typer.echo(f"cancelled partition {partition_id!r} at gate {info.gate} (items: "
                   f"{_counts_text(info.counts)}); `processor retry` resumes it, "
                   "`processor delete` removes it")
    else:
        typer.echo(f"partition {partition_id!r} is {info.status} already; nothing to cancel")


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
    from processor.client import Client

    url = _database(db_url, table_prefix)
    with Client(url, table_prefix) as client:
        deleted = client.delete_partition(partition_id, force=force, batch=batch)
    if as_json:
        typer.echo(json.dumps({"id": partition_id, "deleted": True, "items": deleted}))
        return
    typer.echo(f"deleted partition {partition_id!r} and its {deleted} item(s)")


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
    from processor.client import Client
    from processor.views import purge_text
    from watcher.durations import parse_duration
    from watcher.retention import check_statuses

    seconds = parse_duration("--older-than", older_than)
    statuses = check_statuses("--status", status)
    url = _database(db_url, table_prefix)
    with Client(url, table_prefix) as client:
        report = client.purge(older_than=seconds, statuses=statuses, batch=batch,
                              dry_run=dry_run)
    if as_json:
        typer.echo(json.dumps({"dry_run": dry_run, "partitions": report.partitions,
                               "items": report.items, "older_than_seconds": seconds,
                               "statuses": list(statuses)}))
        return
    typer.echo(purge_text(report, older_than=seconds, statuses=statuses, dry_run=dry_run))


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
    from processor.client import Client

    url = _database(db_url, table_prefix)
    with Client(url, table_prefix) as client:
        client.set_gate(partition_id, gate)
        info = client.partition(partition_id)
    if as_json:
        typer.echo(json.dumps({"id": info.id, "gate": info.gate, "status": info.status}))
        return
    typer.echo(f"partition {partition_id!r} is at gate {info.gate} ({info.status})")


DEFAULT_CONSOLE_HOST = "127.0.0.1"
DEFAULT_CONSOLE_PORT = 8090


@app.command()
def console(
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    host: Annotated[str, typer.Option(envvar=_env("CONSOLE_HOST"),
                                      help="Address to listen on. Anything but 127.0.0.1, "
                                      "::1 or localhost needs --token.")
                    ] = DEFAULT_CONSOLE_HOST,
    port: Annotated[int, typer.Option(envvar=_env("CONSOLE_PORT"),
                                      help="Port to listen on (0: any free port).")
                    ] = DEFAULT_CONSOLE_PORT,
    token: Annotated[str, typer.Option(envvar=_env("CONSOLE_TOKEN"), show_default=False,
                                       help="Secret a browser presents once (?token=... or "
                                       "the sign-in form; scripts send 'Authorization: "
                                       "Bearer ...'), at least 16 characters. Required "
                                       "beyond loopback.")] = "",
    read_only: Annotated[bool, typer.Option("--read-only", envvar=_env("CONSOLE_READ_ONLY"),
                                            help="Show partitions without the retry, "
                                            "cancel and delete actions.")] = False,
    log_level: Annotated[str, typer.Option(envvar=_env("LOG_LEVEL"),
                                           help="debug, info, warning or error.")
                         ] = DEFAULT_LOG_LEVEL,
) -> None:
    """Serve a web console: every partition's progress gate by gate, the processors and
    their leases, failed items with their errors; retry, cancel and delete."""
    from processor.console.server import ConsoleOptions, run_console

    if log_level.lower() not in LOG_LEVELS:
        raise fail(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}")
    options = ConsoleOptions(db_url=_database(db_url, table_prefix, migrated=False),
                             table_prefix=table_prefix,
                             host=host, port=port, token=token or None, read_only=read_only)
    _setup_logging(log_level)
    raise typer.Exit(asyncio.run(run_console(options, announce=typer.echo)))


@app.command()
def demo(
    resumes: Annotated[int, typer.Option(help="How many resumes to rank.")] = 36,
    top: Annotated[int, typer.Option(help="How many top candidates to print.")] = 5,
    with_console: Annotated[bool, typer.Option("--console", help="Serve the web console on "
                                               "the demo's database while it runs, and "
                                               "keep it open afterwards until Ctrl-C.")
                            ] = False,
    console_port: Annotated[int, typer.Option(help="The console's port on 127.0.0.1 (0: any "
                                              "free port).")] = DEFAULT_CONSOLE_PORT,
) -> None:
    """Run the resume-ranking pipeline end to end on a throwaway SQLite database."""
    from processor.demo import run_demo

    raise typer.Exit(asyncio.run(run_demo(
        resumes=resumes, top=top, console_port=console_port if with_console else None)))


@app.command()
def healthcheck(
    health_port: Annotated[int | None, typer.Option(
        help="Port to check (default: the one the running `processor run` serves, from "
        "its --health-port or PROCESSOR_HEALTH_PORT).")] = None,
    health_host: Annotated[str | None, typer.Option(
        help="Address to check (default: the running processor's --health-host; "
        "0.0.0.0 is checked on 127.0.0.1).")] = None,
    ready: Annotated[bool, typer.Option("--ready", help="Check /readyz (database and "
                                        "handler) instead of /healthz.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the answer.")] = 3.0,
) -> None:
    """Exit 0 if this machine's (or container's) processor answers /healthz, 1 if not:
    the image's HEALTHCHECK. It finds the health port and host the way `processor run`
    was configured, by flag or by environment."""
    from processor.healthcheck import HealthOptionsError, health_target, probe

    run_command = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    try:
        target = health_target(run_command, port=health_port, host=health_host)
    except HealthOptionsError as error:
        # Docker reserves exit status 2 of a health check: every failure here is 1.
        typer.echo(f"processor healthcheck: cannot read the health options: {error}",
                   err=True)
        raise typer.Exit(1) from None
    healthy, detail = probe(target, "/readyz" if ready else "/healthz", timeout)
    typer.echo(detail, err=not healthy)
    raise typer.Exit(0 if healthy else 1)


def _is_sqlalchemy_error(error: BaseException) -> bool:
    # Without importing SQLAlchemy (`--help` must stay light): if it was never loaded, the
    # error cannot be one of its exceptions.
    exc = sys.modules.get("sqlalchemy.exc")
    return exc is not None and isinstance(error, exc.SQLAlchemyError)


def _unexpected_hint(error: BaseException) -> str:
    # A driver given a keyword it does not take (a parameter of the database URL's query
    # string) raises TypeError naming the argument; anything else is not the URL's fault.
    if isinstance(error, TypeError) and "argument" in str(error):
        return (" (a database URL parameter the driver does not take? check the URL's "
                "query string)")
    return " (a bug in statefeed: please report it with the command that led to it)"


def main() -> None:
    """Entry point: run the CLI, turning configuration and database errors into one line."""
    try:
        app()
    except ConfigError as error:
        typer.echo(f"processor: error: {error}", err=True)
        sys.exit(EXIT_CONFIG)
    except DatabaseError as error:
        typer.echo(f"processor: error: {error}", err=True)
        sys.exit(EXIT_DATABASE)
    except StatefeedError as error:
        typer.echo(f"processor: error: {error}", err=True)
        sys.exit(EXIT_CONFIG)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as error:
        if _is_sqlalchemy_error(error):
            typer.echo(f"processor: error: database failed: {type(error).__name__}", err=True)
            sys.exit(EXIT_DATABASE)
        # a driver refusing a URL parameter, or a bug: one line
        logging.getLogger(__name__).debug("unexpected error", exc_info=error)
        typer.echo(f"processor: error: unexpected {error_text(error)}{_unexpected_hint(error)}",
                   err=True)
        sys.exit(EXIT_DATABASE)


if __name__ == "__main__":
    main()
