"""The verbs that set up and run a processor: migrate and run."""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Annotated

import typer

# Only light modules at the top: `processor --help` and the one-line errors must not wait for
# SQLAlchemy, SQLModel or the HTTP clients; each verb imports what it uses.
from processor.http.config import (
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_TRANSPORT,
    chosen_health_url,
    service_name,
)
from processor.notify.policy import DEFAULT_MAX_ATTEMPTS as DEFAULT_NOTIFY_ATTEMPTS
from processor.notify.policy import DEFAULT_TIMEOUT as DEFAULT_NOTIFY_TIMEOUT
from watcher.config import (
    DEFAULT_CONCURRENCY,
    DEFAULT_DB_TIMEOUT,
    DEFAULT_LEASE_DURATION,
    DEFAULT_MAX_ITEM_BYTES,
    DEFAULT_MAX_LEASES,
    DEFAULT_MAX_RETRIES,
    DEFAULT_MAX_SPAWN,
    DEFAULT_MAX_UNPAID_RETRIES,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_REDUCE_PAGE_ITEMS,
    DEFAULT_RESULT_BUFFER,
    DEFAULT_RETRY_BACKOFF,
    DEFAULT_RETRY_BACKOFF_MAX,
    DEFAULT_SHUTDOWN_TIMEOUT,
    WatcherConfig,
    default_owner_id,
)

if TYPE_CHECKING:
    from processor.http.routes import Routes

from processor.cli.common import (
    DEFAULT_BACKLOG_INTERVAL,
    DEFAULT_DB_URL,
    DEFAULT_HANDLER_BATCH_SIZE,
    DEFAULT_HEALTH_HOST,
    DEFAULT_HEALTH_PORT,
    DEFAULT_LOG_FORMAT,
    DEFAULT_LOG_LEVEL,
    DEFAULT_PURGE_STATUSES,
    DEFAULT_RETENTION_INTERVAL,
    EXIT_DATABASE,
    DbUrl,
    LogFormat,
    LogLevel,
    TablePrefix,
    app,
    check_logging,
    database_url,
    env_name,
    fail,
    say,
    setup_logging,
)


@app.command()
def migrate(
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    sql: Annotated[bool, typer.Option("--sql", help="Print the DDL for the URL's database "
                                      "without connecting.")] = False,
) -> None:
    """Create or upgrade statefeed's tables."""
    from sqlalchemy.exc import SQLAlchemyError

    from watcher.store.db.migrate import current_revision, upgrade, upgrade_sql

    url = database_url(db_url, table_prefix, migrated=False)
    if sql:
        typer.echo(upgrade_sql(url, table_prefix))  # to be run as it is: never escaped
        return
    try:
        before = current_revision(url, table_prefix)
        upgrade(url, table_prefix)
        after = current_revision(url, table_prefix)
    except SQLAlchemyError as error:
        from processor.service import describe_db_error  # the service's HTTP stack: on failure only

        raise fail(describe_db_error(error, url), EXIT_DATABASE) from None
    where = url.redacted() + (f" (prefix {table_prefix!r})" if table_prefix else "")
    if before is None:
        say(f"created statefeed's tables in {where} at revision {after}")
    elif before != after:
        say(f"upgraded statefeed's tables in {where} from revision {before} to {after}")
    else:
        say(f"statefeed's tables are up to date in {where} (revision {after})")


@app.command()
def run(
    handler_url: Annotated[str, typer.Option("--handler-url", envvar=env_name("HANDLER_URL"),
                                             help="URL the items are POSTed to.")] = "",
    routes_file: Annotated[str, typer.Option(
        "--routes", envvar=env_name("ROUTES"), show_default=False, metavar="FILE",
        help="A TOML routes file: each pipeline's gates to their handler services, in "
        "place of --handler-url (docs/how-to/pipelines.md).")] = "",
    # No default: a container that forgot PROCESSOR_DB_URL must not run on a SQLite file
    # of its own and report ready.
    db_url: Annotated[str, typer.Option("--db-url", envvar=env_name("DB_URL"), show_default=False,
                                        help="Database URL (required): "
                                        "postgresql://user:password@host:5432/dbname, "
                                        "sqlite:///file.db, ...")] = "",
    owner_id: Annotated[str, typer.Option(envvar=env_name("OWNER_ID"),
                                          help="Unique id of this processor (default: "
                                          "host-pid-random).")] = "",
    concurrency: Annotated[int, typer.Option(envvar=env_name("CONCURRENCY"),
                                             help="Handler calls in flight at once.")
                           ] = DEFAULT_CONCURRENCY,
    poll_interval: Annotated[float, typer.Option(envvar=env_name("POLL_INTERVAL"),
                                                 help="Seconds between scans for work.")
                             ] = DEFAULT_POLL_INTERVAL,
    lease_duration: Annotated[float, typer.Option(envvar=env_name("LEASE_DURATION"),
                                                  help="Lease length in seconds (>= 1).")
                              ] = DEFAULT_LEASE_DURATION,
    max_leases: Annotated[int, typer.Option(envvar=env_name("MAX_LEASES"),
                                            help="Partitions this processor leases at most.")
                          ] = DEFAULT_MAX_LEASES,
    max_retries: Annotated[int, typer.Option(envvar=env_name("MAX_RETRIES"),
                                             help="Retries before an item fails.")
                           ] = DEFAULT_MAX_RETRIES,
    max_unpaid_retries: Annotated[int, typer.Option(
        envvar=env_name("MAX_UNPAID_RETRIES"),
        help="Retries one item may take in a row without spending an attempt, when the "
        "handler's service gave no answer or answered Retry-After; past them, each counts "
        "as an attempt.")] = DEFAULT_MAX_UNPAID_RETRIES,
    result_buffer: Annotated[int, typer.Option(
        envvar=env_name("RESULT_BUFFER"), min=0,
        help="Answers queued for the writer at most while their calls' slots are free "
        "again (0: each slot is held until its result is written).")] = DEFAULT_RESULT_BUFFER,
    retry_backoff: Annotated[float, typer.Option(envvar=env_name("RETRY_BACKOFF"),
                                                 help="First retry delay in seconds; "
                                                 "doubles per retry.")] = DEFAULT_RETRY_BACKOFF,
    auto_close: Annotated[bool, typer.Option("--auto-close/--no-auto-close",
                                             envvar=env_name("AUTO_CLOSE"),
                                             help="Close partitions when all items are "
                                             "done.")] = True,
    manual_checkpoint: Annotated[bool, typer.Option(envvar=env_name("MANUAL_CHECKPOINT"),
                                                    help="Never move gates; clients do.")
                                 ] = False,
    table_prefix: TablePrefix = "",
    handler_header: Annotated[list[str] | None, typer.Option(
        help="Extra request header 'Name: value' (repeatable), e.g. an Authorization "
        "header. Env: PROCESSOR_HANDLER_HEADER, one header per line.")] = None,
    handler_health_url: Annotated[str, typer.Option(envvar=env_name("HANDLER_HEALTH_URL"),
                                                    help="Handler URL /readyz GETs (default: "
                                                    "<handler-url>/healthz, where a 404 "
                                                    "counts as healthy; off: no handler "
                                                    "check).")] = "",
    handler_batch_size: Annotated[int, typer.Option(envvar=env_name("HANDLER_BATCH_SIZE"),
                                                    help="Send up to N items per request "
                                                    "to the batch URL (0 = one item per "
                                                    "request).")
                                ] = DEFAULT_HANDLER_BATCH_SIZE,
    handler_batch_url: Annotated[str, typer.Option(envvar=env_name("HANDLER_BATCH_URL"),
                                                   help="Batch protocol URL (default: "
                                                   "<handler-url>/batch).")] = "",
    handler_reduce_url: Annotated[str, typer.Option(envvar=env_name("HANDLER_REDUCE_URL"),
                                                    help="Where reduce gates are POSTed "
                                                    "(default: <handler-url>/reduce).")
                                  ] = "",
    max_item_bytes: Annotated[int, typer.Option(envvar=env_name("MAX_ITEM_BYTES"),
                                                help="Largest item data a handler may answer; "
                                                "a larger answer fails its item.")
                              ] = DEFAULT_MAX_ITEM_BYTES,
    max_spawn: Annotated[int, typer.Option(envvar=env_name("MAX_SPAWN"),
                                           help="Most items one answer may spawn; a larger "
                                           "fan-out pages (spawn a slice, answer the same "
                                           "gate with a cursor).")] = DEFAULT_MAX_SPAWN,
    reduce_page_items: Annotated[int, typer.Option(envvar=env_name("REDUCE_PAGE_ITEMS"),
                                                   help="A reduce gate of up to N items is "
                                                   "one call; a larger one goes in pages "
                                                   "of N (a fold pass, then an apply "
                                                   "pass).")] = DEFAULT_REDUCE_PAGE_ITEMS,
    http_transport: Annotated[str, typer.Option(envvar=env_name("HTTP_TRANSPORT"),
                                                help="aiohttp (fast at high concurrency) "
                                                "or httpx (httpx's own pool).")
                            ] = DEFAULT_TRANSPORT,
    request_timeout: Annotated[float, typer.Option(envvar=env_name("REQUEST_TIMEOUT"),
                                                   help="Seconds one handler call may take.")
                               ] = DEFAULT_REQUEST_TIMEOUT,
    max_response_bytes: Annotated[int, typer.Option(envvar=env_name("MAX_RESPONSE_BYTES"),
                                                    help="Largest handler response accepted.")
                                  ] = DEFAULT_MAX_RESPONSE_BYTES,
    ca_bundle: Annotated[str, typer.Option(envvar=env_name("CA_BUNDLE"),
                                           help="CA bundle for the handler's TLS "
                                           "certificate (verification is always on).")] = "",
    shutdown_timeout: Annotated[float, typer.Option(envvar=env_name("SHUTDOWN_TIMEOUT"),
                                                    help="Seconds to finish in-flight items "
                                                    "on SIGTERM.")] = DEFAULT_SHUTDOWN_TIMEOUT,
    health_port: Annotated[int, typer.Option(envvar=env_name("HEALTH_PORT"),
                                             help="Port for /healthz, /readyz and /metrics "
                                             "(0 = off).")] = DEFAULT_HEALTH_PORT,
    health_host: Annotated[str, typer.Option(envvar=env_name("HEALTH_HOST"),
                                             help="Address the health port listens on.")
                           ] = DEFAULT_HEALTH_HOST,
    migrate_first: Annotated[bool, typer.Option("--migrate", envvar=env_name("MIGRATE"),
                                                help="Create missing tables at start-up.")
                             ] = False,
    db_timeout: Annotated[float, typer.Option(envvar=env_name("DB_TIMEOUT"),
                                              help="Seconds one database round trip may "
                                              "take (statement, lock wait, connect); then "
                                              "the connection is dropped and the work tried "
                                              "again.")] = DEFAULT_DB_TIMEOUT,
    exit_on_db_error: Annotated[bool, typer.Option(envvar=env_name("EXIT_ON_DB_ERROR"),
                                                   help="Exit instead of waiting when the "
                                                   "database is unreachable at start-up.")
                                ] = False,
    log_level: LogLevel = DEFAULT_LOG_LEVEL,
    log_format: LogFormat = DEFAULT_LOG_FORMAT,
    retention: Annotated[str, typer.Option(envvar=env_name("RETENTION"),
                                           help="Delete finished partitions (those of "
                                           "--retention-status) last updated longer ago than "
                                           "this (7d, 12h, 30m, 90s), in the background, on "
                                           "one processor at a time (default: off).")] = "",
    retention_status: Annotated[str, typer.Option(envvar=env_name("RETENTION_STATUS"),
                                                  help="Statuses retention deletes, "
                                                  "comma-separated: complete, cancelled, "
                                                  "failed.")] = DEFAULT_PURGE_STATUSES,
    retention_interval: Annotated[str, typer.Option(envvar=env_name("RETENTION_INTERVAL"),
                                                    help="How often retention looks for "
                                                    "partitions to delete.")
                                  ] = DEFAULT_RETENTION_INTERVAL,
    retention_items: Annotated[str, typer.Option(envvar=env_name("RETENTION_ITEMS"),
                                                 help="Delete the complete items of open "
                                                 "partitions last updated longer ago than "
                                                 "this (7d, 12h, 30m, 90s), in the background "
                                                 "(default: off).")] = "",
    backlog_interval: Annotated[float, typer.Option(envvar=env_name("BACKLOG_INTERVAL"),
                                                    help="Seconds between reads of the "
                                                    "backlog gauges of /metrics, at most.")
                                ] = DEFAULT_BACKLOG_INTERVAL,
    max_inflight_per_key: Annotated[int | None, typer.Option(
        envvar=env_name("MAX_INFLIGHT_PER_KEY"), show_default=False,
        help="Most calls in flight per concurrency key across the whole fleet, for keys "
        "without a limit of their own (`processor keys set`); give every processor the "
        "same (default: no limit).")] = None,
    rate_limit: Annotated[float | None, typer.Option(
        envvar=env_name("RATE_LIMIT"), show_default=False,
        help="Most calls per second to the handler across the whole fleet (the processors "
        "calling one handler URL share it; default: no limit).")] = None,
    rate_limit_per_key: Annotated[float | None, typer.Option(
        envvar=env_name("RATE_LIMIT_PER_KEY"), show_default=False,
        help="Most calls per second per concurrency key across the fleet, for keys without "
        "a rate of their own (default: no limit).")] = None,
    wait_timeout_policy: Annotated[str, typer.Option(
        envvar=env_name("WAIT_TIMEOUT_POLICY"),
        help="What a parked item's deadline does when its answer did not say: retry (an "
        "error that spends an attempt; it is called again) or fail.")] = "retry",
    notify_url: Annotated[str, typer.Option(
        "--notify-url", envvar=env_name("NOTIFY_URL"), show_default=False,
        help="Where the end of a partition that names no notify URL is POSTed (default: "
        "nowhere). Checked like a partition's: http(s), and an internal host needs "
        "--notify-allow-private.")] = "",
    notify_allow_private: Annotated[bool, typer.Option(
        envvar=env_name("NOTIFY_ALLOW_PRIVATE"),
        help="Send partition notifications to loopback, private and link-local addresses "
        "too (off: a notify URL could otherwise reach your own network). The signing "
        "secret is read from PROCESSOR_NOTIFY_SECRET.")] = False,
    notify_timeout: Annotated[float, typer.Option(
        envvar=env_name("NOTIFY_TIMEOUT"),
        help="Seconds one notification attempt may take, connecting included.")
    ] = DEFAULT_NOTIFY_TIMEOUT,
    notify_backoff: Annotated[str, typer.Option(
        envvar=env_name("NOTIFY_BACKOFF"),
        help="The first retry's longest wait; each further one doubles it (up to an hour), "
        "with jitter.")] = "5s",
    notify_attempts: Annotated[int, typer.Option(
        envvar=env_name("NOTIFY_ATTEMPTS"),
        help="Attempts before a notification is given up (dead).")] = DEFAULT_NOTIFY_ATTEMPTS,
    notify_max_age: Annotated[str, typer.Option(
        envvar=env_name("NOTIFY_MAX_AGE"),
        help="Age after which a notification is given up (dead), attempts left or not.")
    ] = "3d",
) -> None:
    """Lease partitions and dispatch their items to the handler until SIGTERM."""
    from processor.http.config import (
        DEFAULT_MAX_CONNECTIONS,
        HttpProcessorConfig,
        parse_header,
    )
    from processor.http.routes import single_route
    from processor.notify.policy import NotifyConfig, secret_from_environment
    from processor.notify.targets import check_default_url
    from processor.observe.tracing import configure_from_env
    from processor.service import ProcessorService, ServiceConfig
    from watcher.retention import RetentionConfig, check_statuses, snooze_cap
    from watcher.rules.durations import parse_duration

    routes = read_routes(routes_file) if routes_file else None
    if routes is not None and handler_url:
        raise fail("give --handler-url or --routes, not both: a routes file names every URL")
    if routes is not None:
        handler_url = routes.services()[0].url  # the shared settings' URL; each has its own
    if not handler_url:
        raise fail("--handler-url is required (or set PROCESSOR_HANDLER_URL), or --routes "
                   "FILE (PROCESSOR_ROUTES)")
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
    if not header_specs and os.environ.get(env_name("HANDLER_HEADER")):
        # One header per line: values such as "Bearer x" contain spaces.
        header_specs = [line for line in os.environ[env_name("HANDLER_HEADER")].splitlines()
                        if line.strip()]
    headers = dict(parse_header(spec) for spec in header_specs)
    check_logging(log_level, log_format)
    notify_default = asyncio.run(check_default_url(
        "--notify-url (PROCESSOR_NOTIFY_URL)", notify_url,
        allow_private=notify_allow_private)) if notify_url else None
    config = ServiceConfig(
        # The service checks the tables itself: it waits for a database still starting.
        db_url=database_url(db_url, table_prefix, migrated=False),
        table_prefix=table_prefix,
        watcher=WatcherConfig(
            owner_id=owner_id or default_owner_id(), concurrency=concurrency,
            poll_interval=poll_interval, lease_duration=lease_duration,
            max_retries=max_retries, max_unpaid_retries=max_unpaid_retries,
            result_buffer=result_buffer, retry_backoff=retry_backoff,
            retry_backoff_max=max(retry_backoff, DEFAULT_RETRY_BACKOFF_MAX), auto_close=auto_close,
            manual_checkpoint=manual_checkpoint, shutdown_timeout=shutdown_timeout,
            max_leases=max_leases, reduce_page_items=reduce_page_items,
            max_item_bytes=max_item_bytes, max_spawn=max_spawn,
            max_inflight_per_key=max_inflight_per_key, rate_limit=rate_limit,
            rate_limit_per_key=rate_limit_per_key, handler_name=(
                "default" if routes is not None else service_name(handler_url)),
            # --handler-url alone is the default pipeline, every gate to that one URL: a
            # partition of another pipeline waits for a processor whose routes serve it.
            pipelines=(routes or single_route(handler_url)).served(),
            max_snooze=snooze_cap(retention_config), wait_timeout_policy=wait_timeout_policy,
            notify_default=notify_default),
        http=HttpProcessorConfig(
            handler_url=handler_url, headers=headers, request_timeout=request_timeout,
            max_connections=max(DEFAULT_MAX_CONNECTIONS, concurrency),
            max_response_bytes=max_response_bytes, verify=ca_bundle or True,
            health_url=chosen_health_url(handler_url, handler_health_url),
            transport=http_transport,
            reduce_url=handler_reduce_url or None, health_optional=not handler_health_url),
        batch_size=handler_batch_size,
        batch_url=handler_batch_url or None,
        routes=routes, routes_path=routes_file or None,
        health_port=health_port,
        health_host=health_host,
        migrate=migrate_first,
        exit_on_db_error=exit_on_db_error,
        db_timeout=db_timeout,
        retention=retention_config,
        backlog_interval=backlog_interval,
        notify=NotifyConfig(
            secret=secret_from_environment(), allow_private=notify_allow_private,
            timeout=notify_timeout, backoff=parse_duration("--notify-backoff", notify_backoff),
            max_attempts=notify_attempts,
            max_age=parse_duration("--notify-max-age", notify_max_age)),
    )
    setup_logging(log_level, log_format)
    configure_from_env()  # OTEL_TRACES_EXPORTER set: every call a span (docs/how-to/trace.md)
    code = asyncio.run(ProcessorService(config).run())
    raise typer.Exit(code)


def read_routes(path: str) -> Routes:
    """The routes of the file at ``path``, checked; each error a line on stderr.

    Raises:
        typer.Exit: the file cannot be read, or its routes are invalid (exit 2).
    """
    from processor.http.routes import RoutesError, parse_routes

    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except (OSError, UnicodeDecodeError) as error:
        raise fail(f"--routes: cannot read {path!r}: {error}") from None
    try:
        return parse_routes(text, source=path)
    except RoutesError as error:
        for line in error.errors[:-1]:
            say(f"processor: error: {line}", err=True)
        raise fail(error.errors[-1]) from None
