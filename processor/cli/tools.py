"""The verbs beside a processor: the web console, the ingest API, the demo, and the
container's health check."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Annotated, cast

import typer

# Only light modules at the top: `processor --help` and the one-line errors must not wait for
# SQLAlchemy, SQLModel or the HTTP clients; each verb imports what it uses.

if TYPE_CHECKING:

    pass
from processor.cli.common import (
    DEFAULT_CONSOLE_HOST,
    DEFAULT_CONSOLE_PORT,
    DEFAULT_DB_URL,
    DEFAULT_LOG_FORMAT,
    DEFAULT_LOG_LEVEL,
    DbUrl,
    LogFormat,
    LogLevel,
    NotifyUrl,
    TablePrefix,
    app,
    check_logging,
    database_url,
    env_name,
    fail,
    say,
    say_json,
    setup_logging,
)


@app.command()
def console(
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    host: Annotated[str, typer.Option(envvar=env_name("CONSOLE_HOST"),
                                      help="Address to listen on. Anything but 127.0.0.1, "
                                      "::1 or localhost needs --token.")
                    ] = DEFAULT_CONSOLE_HOST,
    port: Annotated[int, typer.Option(envvar=env_name("CONSOLE_PORT"),
                                      help="Port to listen on (0: any free port).")
                    ] = DEFAULT_CONSOLE_PORT,
    token: Annotated[str, typer.Option(envvar=env_name("CONSOLE_TOKEN"), show_default=False,
                                       help="Secret a browser presents once (?token=... or "
                                       "the sign-in form; scripts send 'Authorization: "
                                       "Bearer ...'), at least 16 characters. Required "
                                       "beyond loopback.")] = "",
    read_only: Annotated[bool, typer.Option("--read-only", envvar=env_name("CONSOLE_READ_ONLY"),
                                            help="Show partitions without the retry, "
                                            "cancel and delete actions.")] = False,
    api_url: Annotated[str, typer.Option(envvar=env_name("CONSOLE_API_URL"),
                                         show_default=False,
                                         help="The ingest API's public base URL (such as "
                                         "https://api.example.com): a completion URL an "
                                         "operator asks for starts with it.")] = "",
    notify_url: NotifyUrl = "",
    log_level: LogLevel = DEFAULT_LOG_LEVEL,
    log_format: LogFormat = DEFAULT_LOG_FORMAT,
) -> None:
    """Serve a web console: every partition's progress gate by gate, the processors and
    their leases, failed items with their errors; retry, cancel and delete."""
    from processor.console.server import ConsoleOptions, run_console

    check_logging(log_level, log_format)
    options = ConsoleOptions(db_url=database_url(db_url, table_prefix, migrated=False),
                             table_prefix=table_prefix,
                             host=host, port=port, token=token or None, read_only=read_only,
                             api_url=api_url or None, notify_default=notify_url or None)
    setup_logging(log_level, log_format)
    raise typer.Exit(asyncio.run(run_console(options, announce=typer.echo)))


@app.command()
def api(
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    host: Annotated[str, typer.Option(envvar=env_name("API_HOST"),
                                      help="Address to listen on. Anything but 127.0.0.1, "
                                      "::1 or localhost needs --token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar=env_name("API_PORT"),
                                      help="Port to listen on (0: any free port).")] = 8091,
    token: Annotated[str, typer.Option(envvar=env_name("API_TOKEN"), show_default=False,
                                       help="Secret every request sends as 'Authorization: "
                                       "Bearer ...', at least 16 characters. Required "
                                       "beyond loopback.")] = "",
    max_item_bytes: Annotated[int, typer.Option(envvar=env_name("MAX_ITEM_BYTES"),
                                                help="Largest item data accepted (give the "
                                                "processors the same).")] = 8 * 1024 * 1024,
    max_body_bytes: Annotated[int, typer.Option(envvar=env_name("API_MAX_BODY_BYTES"),
                                                help="Largest body read whole: a JSON "
                                                "create, and every add.")] = 64 * 1024 * 1024,
    max_upload_bytes: Annotated[int, typer.Option(envvar=env_name("API_MAX_UPLOAD_BYTES"),
                                                  help="Largest NDJSON create, streamed "
                                                  "to a temporary file.")
                                ] = 4096 * 1024 * 1024,
    completion_rate: Annotated[int, typer.Option(envvar=env_name("API_COMPLETION_RATE"),
                                                 help="Refused lookups (404) one client "
                                                 "address may make a minute on "
                                                 "/v1/completions/ (a burst at most; 0: no "
                                                 "bound); past it, 429.")] = 300,
    feed_poll_interval: Annotated[float, typer.Option(
        envvar=env_name("API_FEED_POLL_INTERVAL"),
        help="Seconds between two reads of the partitions live feeds follow (one read "
        "for them all), from 0.01 to 60.")] = 0.5,
    feed_max_clients: Annotated[int, typer.Option(
        envvar=env_name("API_FEED_MAX_CLIENTS"),
        help="Live feeds open at once at most; past it, 503.")] = 1000,
    notify_url: NotifyUrl = "",
    log_level: LogLevel = DEFAULT_LOG_LEVEL,
    log_format: LogFormat = DEFAULT_LOG_FORMAT,
) -> None:
    """Serve the ingest API: producers in any language create partitions (JSON, or NDJSON
    streamed), add items, read, wait for, page, retry, cancel and delete them over HTTP;
    operators list notification events and send dead ones again. Its OpenAPI document is
    at /v1/openapi.json."""
    from processor.api.server import ApiOptions, run_api
    from processor.api.upload import Limits
    from processor.feed.hub import FeedSettings

    check_logging(log_level, log_format)
    for name, value in (("--max-item-bytes", max_item_bytes),
                        ("--max-body-bytes", max_body_bytes),
                        ("--max-upload-bytes", max_upload_bytes)):
        if value < 1:
            raise fail(f"{name} must be a positive number of bytes, got {value}")
    if completion_rate < 0:
        raise fail("--completion-rate must be a whole number of requests a minute from 0 "
                   f"(0: no bound), got {completion_rate}")
    options = ApiOptions(db_url=database_url(db_url, table_prefix, migrated=False),
                         table_prefix=table_prefix, host=host, port=port, token=token or None,
                         limits=Limits(max_item_bytes, max_body_bytes, max_upload_bytes,
                                       completions_per_minute=completion_rate),
                         feed=FeedSettings(poll_interval=feed_poll_interval,
                                           max_clients=feed_max_clients),
                         notify_default=notify_url or None)
    setup_logging(log_level, log_format)
    from processor.observe.tracing import configure_from_env

    configure_from_env()  # OTEL_TRACES_EXPORTER set: each completion a span (trace.md)
    raise typer.Exit(asyncio.run(run_api(options, announce=typer.echo)))


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
    path: Annotated[str, typer.Option("--path", show_default=False, help="Check this path "
                                      "instead: /healthz of `processor api` (with "
                                      "--health-port 8091), /login of `processor console` "
                                      "(--health-port 8090).")] = "",
) -> None:
    """Exit 0 if this machine's (or container's) processor answers /healthz, 1 if not:
    the image's HEALTHCHECK. It finds the health port and host the way `processor run`
    was configured, by flag or by environment; with --health-port and --path it checks
    the API or the console."""
    import click

    from processor.healthcheck import HealthOptionsError, health_target, probe

    group = cast(click.Group, typer.main.get_command(app))
    run_command = group.commands["run"]
    try:
        target = health_target(run_command, port=health_port, host=health_host)
    except HealthOptionsError as error:
        # Docker reserves exit status 2 of a health check: every failure here is 1.
        say(f"processor healthcheck: cannot read the health options: {error}",
                   err=True)
        raise typer.Exit(1) from None
    if path and not path.startswith("/"):
        say(f"processor healthcheck: --path must start with /, got {path!r}", err=True)
        raise typer.Exit(1)
    healthy, detail = probe(target, path or ("/readyz" if ready else "/healthz"), timeout)
    say(detail, err=not healthy)
    raise typer.Exit(0 if healthy else 1)


@app.command("check-handler")
def check_handler(
    url: Annotated[str, typer.Argument(help="The handler's URL, as a route names it.")],
    items_file: Annotated[str, typer.Option(
        "--items", help="NDJSON file of items, as `processor create --items` takes it: "
        "each is one call (at its gate, 0 by default).")],
    repeats: Annotated[int, typer.Option(help="Copies of each call, with one "
                                         "Idempotency-Key.")] = 2,
    seed: Annotated[int, typer.Option(help="Seed of the shuffle of the copies.")] = 0,
    probe: Annotated[str, typer.Option(
        "--probe", show_default=False, metavar="URL",
        help="GET after the first and the last copy of each call, with ?partition_id=, "
        "item_id= and gate=: its answer must not change (your view of the side "
        "effects).")] = "",
    partition: Annotated[str, typer.Option(help="The X-Partition-Id the calls carry.")
                         ] = "check-handler",
    concurrency: Annotated[int, typer.Option(help="Copies in flight at once (1: one by "
                                             "one).")] = 1,
    timeout: Annotated[float, typer.Option(help="Seconds one call may take.")] = 30.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")
                       ] = False,
) -> None:
    """Check that a handler's step is idempotent: send each item's call twice (or
    --repeats times) with the same Idempotency-Key, shuffled so copies arrive out of
    order, and report every call whose answers differ (or whose side effects, as
    --probe shows them, change after a repeat). Exit 1 when one did. It sends real
    calls: point it at a handler you may call, with items you may process."""
    from pathlib import Path

    from processor.handler_check import check_handler as run_check
    from processor.handler_check import read_items

    try:
        calls = read_items(Path(items_file))
    except OSError as error:
        raise fail(f"cannot read --items {items_file}: {error.strerror or error}") from None
    except ValueError as error:
        raise fail(str(error)) from None
    if not calls:
        raise fail(f"--items {items_file} holds no item")
    try:
        report = asyncio.run(run_check(url, calls, repeats=repeats, seed=seed,
                                       partition=partition, probe_url=probe or None,
                                       timeout=timeout, concurrency=concurrency))
    except ValueError as error:
        raise fail(str(error)) from None
    if as_json:
        say_json({"calls": report.calls, "items": report.items,
                  "idempotent": report.idempotent,
                  "findings": [vars(f) for f in report.findings]}, default=str)
    else:
        for finding in report.findings:
            say(finding.line())
        say(f"{report.items} items, {report.calls} calls: "
            + ("every repeat answered the same" if report.idempotent else
               f"{len(report.findings)} not idempotent"))
    if not report.idempotent:
        raise typer.Exit(1)
