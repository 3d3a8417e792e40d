"""The verbs of waits: ``processor complete TOKEN`` completes a waiting item, as a
handler's answer would, and ``processor heartbeat TOKEN SECONDS`` moves its deadline.
The token is never printed."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

# Only light modules at the top (see processor.cli.operate).
from processor.cli.common import (
    DEFAULT_DB_URL,
    DbUrl,
    JsonOption,
    TablePrefix,
    app,
    database_url,
)
from watcher.errors import CompletionRefusedError

TokenArgument = Annotated[str, typer.Argument(
    help="The completion token the handler was given (X-Completion-Token).",
    show_default=False)]


@app.command()
def complete(
    token: TokenArgument,
    data: Annotated[str | None, typer.Option(
        "--data", help="The item's new data, as JSON.", show_default=False)] = None,
    gate: Annotated[int | None, typer.Option(
        "--gate", min=0, help="Move the item to this gate (not below its own).",
        show_default=False)] = None,
    not_done: Annotated[bool, typer.Option(
        "--not-done", help="Run the item again (at its gate, or at --gate) instead of "
                           "completing it.")] = False,
    error: Annotated[str | None, typer.Option(
        "--error", help="Record a failed attempt with this message: the item is retried "
                        "as after a handler error.", show_default=False)] = None,
    no_retry: Annotated[bool, typer.Option(
        "--no-retry", help="With --error: fail the item at once.")] = False,
    wait: Annotated[float | None, typer.Option(
        "--wait", help="Park the item again for this many seconds; the new token is "
                       "printed.", show_default=False)] = None,
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    as_json: JsonOption = False,
) -> None:
    """Complete a waiting item, exactly once: as its handler's answer would (done, by
    default). A token used already, or whose wait timed out or was cancelled, is refused
    and nothing is written."""
    from processor.client.sync_client import Client

    if no_retry and error is None:
        raise CompletionRefusedError("no_retry", "--no-retry goes with --error MESSAGE")
    value: Any = None
    if data is not None:
        try:
            value = json.loads(data)
        except ValueError as problem:
            raise CompletionRefusedError(
                "data", f"--data is not valid JSON ({problem}); quote it for the shell, "
                        "such as --data '{\"approved\": true}'") from None
    from processor.observe.tracing import configure_from_env

    configure_from_env()  # OTEL_TRACES_EXPORTER set: the completion is a span (trace.md)
    url = database_url(db_url, table_prefix)
    with Client(url, table_prefix) as client:
        done = client.complete(token, done=not not_done, gate=gate,
                               data=value if data is not None else None,
                               error=error, no_retry=no_retry, wait=wait)
    if as_json:
        row = {"partition_id": done.partition_id, "item_id": done.item_id,
               "status": done.status, "gate": done.gate, "attempts": done.attempts,
               "last_error": done.last_error}
        if done.completion_token is not None:
            row["completion_token"] = done.completion_token
        typer.echo(json.dumps(row))
        return
    typer.echo(f"item {done.item_id!r} of partition {done.partition_id!r} is {done.status} "
               f"at gate {done.gate}")
    if done.completion_token is not None:
        typer.echo(f"new completion token: {done.completion_token}")


@app.command()
def heartbeat(
    token: TokenArgument,
    seconds: Annotated[float, typer.Argument(
        help="The new deadline, in seconds from now (at most 30 days).", show_default=False)],
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
) -> None:
    """Move a waiting item's deadline: a long step reports it is alive."""
    from processor.client.sync_client import Client

    url = database_url(db_url, table_prefix)
    with Client(url, table_prefix) as client:
        deadline = client.heartbeat(token, seconds)
    typer.echo(f"the wait now ends at {deadline.isoformat()}Z")
