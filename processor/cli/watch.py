"""``processor watch ID``: follow a partition's live feed from the ingest API in the
terminal, a progress bar per gate, until it ends (:mod:`processor.feed`)."""

from __future__ import annotations

from typing import Annotated

import typer

from processor.cli.common import (
    EXIT_CONFIG,
    EXIT_DATABASE,
    EXIT_PARTITION_STOPPED,
    PartitionArgument,
    app,
    env_name,
    fail,
    say,
)

DEFAULT_API_URL = "http://127.0.0.1:8091/"
EXIT_INTERRUPTED = 130
MIN_INTERVAL_MS, MAX_INTERVAL_MS = 100, 60_000


@app.command()
def watch(
    partition_id: PartitionArgument,
    api_url: Annotated[str, typer.Option("--api-url", envvar=env_name("API_URL"),
                                         help="The ingest API's address (`processor api`).")
                       ] = DEFAULT_API_URL,
    token: Annotated[str, typer.Option("--token", envvar=env_name("API_TOKEN"),
                                       show_default=False,
                                       help="The API's token, when it has one (sent as "
                                       "'Authorization: Bearer ...').")] = "",
    interval: Annotated[int, typer.Option("--interval", envvar=env_name("WATCH_INTERVAL_MS"),
                                          help="Milliseconds between two updates of the "
                                          "counts, from 100 to 60000.")] = 500,
    reconnect_for: Annotated[float, typer.Option(
        "--reconnect-for", envvar=env_name("WATCH_RECONNECT_FOR"),
        help="Seconds to keep reconnecting to an API that cannot be reached.")] = 60.0,
) -> None:
    """Follow a partition live: a progress bar per gate, a line per gate move, and its end.
    A dropped connection is resumed where it stopped (Last-Event-ID); Ctrl-C stops.

    \b
    Exit status:
      0    the partition is complete
      1    the API could not be reached for --reconnect-for seconds
      2    the API refused (no such partition, a bad token or option)
      4    the partition failed, was cancelled or was deleted
      130  Ctrl-C
    """
    if not MIN_INTERVAL_MS <= interval <= MAX_INTERVAL_MS:
        raise fail(f"--interval must be from {MIN_INTERVAL_MS} to {MAX_INTERVAL_MS} "
                   f"milliseconds, got {interval}")
    if not 0 <= reconnect_for <= 86_400:
        raise fail(f"--reconnect-for must be from 0 to 86400 seconds, got {reconnect_for}")
    if not api_url.startswith(("http://", "https://")):
        raise fail(f"--api-url must be an http:// or https:// address, got {api_url!r}")
    from processor.cli.terminal import SafeConsole
    from processor.feed.follow import (
        FeedLostError,
        FeedRefusedError,
        FollowOptions,
        follow,
    )
    from processor.feed.view import WatchView

    options = FollowOptions(api_url, token or None, interval, reconnect_for)
    console = SafeConsole()
    view = WatchView(partition_id, console)
    try:
        with view:
            end = follow(partition_id, options, view.show, on_retry=lambda reason:
                         console.print(f"reconnecting: {reason}", style="dim"))
    except KeyboardInterrupt:
        say(f"stopped following partition {partition_id!r}", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except FeedRefusedError as error:
        raise fail(str(error), EXIT_CONFIG) from None
    except FeedLostError as error:
        raise fail(str(error), EXIT_DATABASE) from None
    if end is None:
        say(f"partition {partition_id!r} had ended already (the feed sent its end before)")
        return
    say(view.end_text())
    if (view.end or {}).get("status") != "complete":
        raise typer.Exit(EXIT_PARTITION_STOPPED)
