"""What every ``processor`` verb shares: the Typer app, the options every verb takes,
the defaults, exit codes, and the helpers that open the database and print data."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

# Only light modules at the top: `processor --help` and the one-line errors must not wait for
# SQLAlchemy, SQLModel or the HTTP clients; each verb imports what it uses.
from processor.observe.logs import DEFAULT_LOG_FORMAT, LOG_FORMATS
from processor.observe.logs import setup_logging as configure_logging
from processor.observe.safe_text import escape_controls, json_text
from watcher.errors import DatabaseError

if TYPE_CHECKING:
    from rich.console import Console

    from processor.client.async_client import AsyncClient
    from watcher.store.db.urls import DatabaseURL

T = TypeVar("T")

DEFAULT_DB_URL = "sqlite:///processor.db"
# Defaults of `processor run` that have no home in an engine or HTTP config object.
DEFAULT_HANDLER_BATCH_SIZE = 0  # one item per request
DEFAULT_HEALTH_PORT = 8080
DEFAULT_HEALTH_HOST = "0.0.0.0"
DEFAULT_LOG_LEVEL = "info"
DEFAULT_STATUS_LIMIT = 100
DEFAULT_WATCH_INTERVAL = 2.0
DEFAULT_ITEMS_LIMIT = 50
DEFAULT_PURGE_BATCH = 1000
DEFAULT_PURGE_STATUSES = "complete,cancelled"
DEFAULT_RETENTION_INTERVAL = "60s"
DEFAULT_BACKLOG_INTERVAL = 5.0
EXIT_DATABASE = 1
EXIT_CONFIG = 2
EXIT_NO_RESULT = 3
# `processor wait`: the partition stopped without completing (failed or cancelled), or was
# still open when the timeout passed.
EXIT_PARTITION_STOPPED = 4
EXIT_WAIT_TIMEOUT = 5
LOG_LEVELS = ("debug", "info", "warning", "error")

# Every command and sub-command takes -h as well as --help.
CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}

app = typer.Typer(
    name="processor",
    help="statefeed processor: lease partitions from SQL and drive their items through an "
    "HTTP handler, gate by gate.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    add_completion=False,
    context_settings=CONTEXT_SETTINGS,
)


def env_name(name: str) -> str:
    return f"PROCESSOR_{name}"


# The processors' default notify URL, for the verbs that can end a partition themselves
# (a cancel): its event goes where the processors would send it.
NotifyUrl = Annotated[str, typer.Option(
    "--notify-url", envvar=env_name("NOTIFY_URL"), show_default=False,
    help="Where the end of a partition that names no notify URL is POSTed: give what "
    "`processor run --notify-url` has (default: nowhere).")]
DbUrl = Annotated[str, typer.Option("--db-url", envvar=env_name("DB_URL"),
                                    help="Database URL: sqlite:///file.db or "
                                    "postgresql://user:password@host:5432/dbname.")]
TablePrefix = Annotated[str, typer.Option("--table-prefix", envvar=env_name("TABLE_PREFIX"),
                                          help="Prefix for statefeed's table names.")]
LogLevel = Annotated[str, typer.Option("--log-level", envvar=env_name("LOG_LEVEL"),
                                       help="debug, info, warning or error.")]
LogFormat = Annotated[str, typer.Option("--log-format", envvar=env_name("LOG_FORMAT"),
                                        help="text (time LEVEL logger message) or json "
                                        "(one object per line, the key=value parts as "
                                        "fields).")]


def say(text: str, *, err: bool = False) -> None:
    """Print one line of text that may hold data (ids, keys, error texts) with its control
    characters escaped (:func:`processor.observe.safe_text.escape_controls`): a terminal shows
    them, never obeys them."""
    typer.echo(escape_controls(text), err=err)


def say_json(document: object, **options: Any) -> None:
    """Print ``document`` as JSON (``json.dumps`` options), with the characters JSON
    leaves raw but a terminal may obey written as ``\\u`` escapes."""
    typer.echo(json_text(json.dumps(document, **options)))


def operator_text(error: Exception) -> str:
    """``error``'s message for the CLI: where it names a library call to make next
    (``create_partition()``), the ``processor`` verb that does it instead."""
    import shlex

    from watcher.errors import (
        ItemNotFoundError,
        PartitionExistsError,
        PartitionNotFoundError,
    )

    if isinstance(error, PartitionNotFoundError):
        quoted = shlex.quote(error.partition_id)
        return (f"partition {error.partition_id!r} does not exist; create it with "
                f"`processor create {quoted} --items FILE`, or list the partitions with "
                "`processor status`")
    if isinstance(error, PartitionExistsError):
        return (f"partition {error.partition_id!r} already exists; add items to it with "
                f"`processor add {shlex.quote(error.partition_id)} --items FILE`")
    if isinstance(error, ItemNotFoundError):
        return (f"partition {error.partition_id!r} has no item {error.item_id!r}; list its "
                f"items with `processor items {shlex.quote(error.partition_id)}`, or look "
                f"for the id everywhere with `processor items --find "
                f"{shlex.quote(error.item_id)}`")
    return str(error)


def fail(message: str, code: int = EXIT_CONFIG) -> typer.Exit:
    """Print one line on stderr (control characters escaped) and return the exit to
    raise."""
    say(f"processor: error: {message}", err=True)
    return typer.Exit(code)


def database_url(raw: str, prefix: str, *, migrated: bool = True) -> DatabaseURL:
    """The parsed URL; with ``migrated``, after checking the database has statefeed's
    tables (a SQLite file that does not exist is reported, not created).

    Raises:
        ConfigError: the URL or the prefix is invalid.
        DatabaseError: the database is unreachable, or was never migrated ("run
            `processor migrate` first": the same line on every verb).
    """
    from watcher.store.db.urls import parse_database_url
    from watcher.store.sql.schema import validate_table_prefix

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


def with_client(db_url: str, table_prefix: str,
                call: Callable[[AsyncClient], Awaitable[T]], **options: Any) -> T:
    """``call`` with an async client of the database (``options`` go to the client),
    run to its end.

    Raises:
        ConfigError, DatabaseError: as :func:`database_url`; and what ``call`` raises.
    """
    from processor.client.async_client import AsyncClient

    url = database_url(db_url, table_prefix)

    async def run() -> T:
        async with AsyncClient(url, table_prefix, **options) as client:
            return await call(client)

    return asyncio.run(run())


def data_console(*, soft_wrap: bool = False) -> Console:
    """A Rich console that prints text literally and safely: ids, owners and error texts
    are data, and Rich would read ``[...]`` in them as markup (``[/x]`` even raises) and
    ``:name:`` as an emoji, and a terminal would obey their escape sequences
    (:class:`processor.cli.terminal.SafeConsole`)."""
    from processor.cli.terminal import SafeConsole

    return SafeConsole(soft_wrap=soft_wrap)


def check_logging(level: str, log_format: str) -> None:
    """Check ``--log-level`` and ``--log-format`` before a verb starts.

    Raises:
        typer.Exit: (exit 2, with one line on stderr) either is not one of its choices.
    """
    if level.lower() not in LOG_LEVELS:
        raise fail(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    if log_format.lower() not in LOG_FORMATS:
        raise fail(f"--log-format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")


def setup_logging(level: str, log_format: str = DEFAULT_LOG_FORMAT) -> None:
    """Log to stderr at ``level``, one line per record as ``text`` or ``json``
    (:mod:`processor.observe.logs`). Call :func:`check_logging` first.

    Raises:
        ValueError: ``log_format`` is not one of :data:`LOG_FORMATS`.
    """
    configure_logging(level, log_format.lower())



PartitionArgument = Annotated[str, typer.Argument(help="The partition's id.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]

DEFAULT_CONSOLE_HOST = "127.0.0.1"
DEFAULT_CONSOLE_PORT = 8090

