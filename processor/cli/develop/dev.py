"""``processor dev APP``: a throwaway database, the handler app with reload, a processor,
the ingest API and the console, in one command (:mod:`processor.dev`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from processor.cli.common import DEFAULT_CONSOLE_PORT, app, say


@app.command()
def dev(
    handler_app: Annotated[str, typer.Argument(
        metavar="APP", help="The handler's ASGI app as an import string, as uvicorn takes "
                            "it: wordcount:app serves `app` of wordcount.py.",
        show_default=False)],
    db_url: Annotated[str | None, typer.Option(
        "--db-url", help="The database to use (migrated at start); default: a throwaway "
                         "SQLite file, deleted at the end.", show_default=False)] = None,
    app_dir: Annotated[Path, typer.Option(
        "--app-dir", help="Where APP is imported from, and the folder whose changes reload "
                          "it.")] = Path("."),
    handler_port: Annotated[int, typer.Option(
        "--handler-port", help="The handler's port on 127.0.0.1 (0: any free port).")] = 8000,
    api_port: Annotated[int, typer.Option(
        "--api-port", help="The ingest API's port on 127.0.0.1 (0: any free port).")] = 8091,
    console_port: Annotated[int, typer.Option(
        "--console-port", help="The web console's port on 127.0.0.1 (0: any free "
                               "port).")] = DEFAULT_CONSOLE_PORT,
    reload: Annotated[bool, typer.Option(
        "--reload/--no-reload", help="Restart the handler when a file of --app-dir "
                                     "changes.")] = True,
) -> None:
    """Develop a handler: serve APP (reloading on change) with a processor, the ingest API
    and the web console on a throwaway SQLite database, all on 127.0.0.1. Prints the
    three URLs; Ctrl-C stops everything."""
    import asyncio

    from processor.dev import DevOptions, run_dev

    options = DevOptions(handler_app, app_dir.resolve(), db_url, handler_port, api_port,
                         console_port, reload)
    raise typer.Exit(asyncio.run(run_dev(options, say)))
