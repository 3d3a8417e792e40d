"""The ``processor`` command: migrate and run; the producer's verbs create, add and wait;
status, result and items; the operator's verbs retry, cancel, pause, resume, delete,
purge and set-gate, the flow controls (keys) and schedules; the web console, the ingest API, demo
and healthcheck.

The verbs live by kind in :mod:`~processor.cli.serve`, :mod:`~processor.cli.produce`,
:mod:`~processor.cli.data`, :mod:`~processor.cli.operate`, :mod:`~processor.cli.flow`,
:mod:`~processor.cli.schedules` and :mod:`~processor.cli.tools`, on
:mod:`~processor.cli.common` (the app, shared options and helpers); this module
imports them, so that each registers its verbs, and holds :func:`main` and ``processor --version``.

Every option can also be set as an environment variable ``PROCESSOR_<OPTION>``
(``--db-url`` is ``PROCESSOR_DB_URL``; ``wait --timeout`` is
``PROCESSOR_WAIT_TIMEOUT``). Configuration errors (and bad input: a bad NDJSON line,
a partition that exists or does not) print one line on stderr and exit with status
2; database failures exit with status 1. ``processor result`` exits with 3 when the
partition has no result; ``processor wait`` with 4 when the partition failed or was
cancelled, and 5 when it was still open at the timeout.

The top folder of the service: may import :mod:`watcher`, :mod:`handlers`, every other
folder of :mod:`processor` and its shared top-level modules; no folder imports it.
"""


from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

# Each module registers its verbs as it is imported, in the order `processor --help` lists them.
from processor.cli import serve  # noqa: F401
from processor.cli import produce  # noqa: F401
from processor.cli import data  # noqa: F401
from processor.cli import operate  # noqa: F401
from processor.cli import flow  # noqa: F401
from processor.cli import notifications  # noqa: F401
from processor.cli import schedules  # noqa: F401
from processor.cli import tools  # noqa: F401
from processor.cli import waits  # noqa: F401
from processor.cli import watch  # noqa: F401
from processor.cli.develop import replay  # noqa: F401
from processor.cli.develop import dev  # noqa: F401
from processor.cli.common import EXIT_CONFIG, EXIT_DATABASE, app, operator_text, say
from watcher.errors import ConfigError, DatabaseError, StatefeedError
from watcher.text import error_text


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


def _print_version(value: bool) -> None:
    """``--version``: print the installed package's version and exit 0.

    Raises:
        typer.Exit: (code 0) always, once the version is printed.
    """
    if not value:
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        say(f"processor (statefeed) {version('statefeed')}")
    except PackageNotFoundError:  # run from a source tree that was never installed
        say("processor (statefeed) unknown version: the package is not installed")
    raise typer.Exit(0)


@app.callback()
def _options(
    show_version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_print_version,
        help="Print the version and exit.")] = False,
) -> None:
    # The options of `processor` itself, before the verb: only --version.
    pass


def main() -> None:
    """Entry point: run the CLI, turning configuration and database errors into one line."""
    # Typer's own copy of click: what its parser raises.
    from typer._click.exceptions import NoArgsIsHelpError, UsageError

    try:
        code = app(standalone_mode=False)
    except NoArgsIsHelpError as error:
        error.show()
        sys.exit(error.exit_code)
    except UsageError as error:
        # A bad value or option: one line saying what and where to look, not the usage.
        where = error.ctx.command_path if error.ctx is not None else "processor"
        say(f"processor: error: {error.format_message().rstrip('.')}; `{where} --help` "
            "shows how to call it", err=True)
        sys.exit(error.exit_code)
    except typer.Abort:
        say("Aborted!", err=True)
        sys.exit(1)
    except ConfigError as error:
        say(f"processor: error: {error}", err=True)
        sys.exit(EXIT_CONFIG)
    except DatabaseError as error:
        say(f"processor: error: {error}", err=True)
        sys.exit(EXIT_DATABASE)
    except StatefeedError as error:
        say(f"processor: error: {operator_text(error)}", err=True)
        sys.exit(EXIT_CONFIG)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as error:
        if _is_sqlalchemy_error(error):
            say(f"processor: error: database failed: {type(error).__name__}", err=True)
            sys.exit(EXIT_DATABASE)
        # a driver refusing a URL parameter, or a bug: one line
        logging.getLogger(__name__).debug("unexpected error", exc_info=error)
        say(f"processor: error: unexpected {error_text(error)}{_unexpected_hint(error)}",
                   err=True)
        sys.exit(EXIT_DATABASE)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()

