"""The verbs of waits: ``processor complete TOKEN`` completes a waiting item, as a
handler's answer would, ``processor heartbeat TOKEN SECONDS`` moves its deadline, and
``processor waits token P ITEM`` mints an operator's completion token for a waiting
item. The handler's token is never printed; an operator's is printed once, when it
is minted."""

from __future__ import annotations

from typing import Annotated

import typer

# Only light modules at the top (see processor.cli.operate).
from processor.cli.common import (
    DEFAULT_DB_URL,
    DbUrl,
    JsonOption,
    TablePrefix,
    app,
    database_url,
    env_name,
    say,
    say_json,
)
from watcher.errors import CompletionRefusedError

TokenArgument = Annotated[str, typer.Argument(
    help="The completion token the handler was given (X-Completion-Token).",
    show_default=False)]


@app.command()
def complete(
    token: TokenArgument,
    gate: Annotated[int | None, typer.Option(
        "--gate", min=0, help="Move the item to this gate (not below its own), where it "
                              "runs; with --done it completes there.",
        show_default=False)] = None,
    done: Annotated[bool, typer.Option(
        "--done/--not-done", help="--done completes the item (at --gate, or its own "
                                  "gate); without it the item runs (again) at the gate, "
                                  "as a handler's answer without \"done\" would.")] = False,
    data: Annotated[str | None, typer.Option(
        "--data", help="The item's new data, as JSON.", show_default=False)] = None,
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
    """Complete a waiting item, exactly once, with the answer its handler would have
    given, as POST /v1/completions/TOKEN does: --gate G moves it to gate G and runs it
    there, --done completes it, neither runs it again at its gate. A token used already,
    or whose wait timed out or was cancelled, is refused and nothing is written."""
    from processor.client.sync_client import Client
    from processor.wire.completions import completion_document, read_completion

    if no_retry and error is None:
        raise CompletionRefusedError("no_retry", "--no-retry goes with --error MESSAGE")
    fields = {}
    if data is not None:
        from processor.wire.values import MalformedResponseError, decode_json

        try:
            fields["data"] = decode_json(data.encode("utf-8", "surrogatepass"), "--data",
                                         unique_keys=True)
        except MalformedResponseError as problem:
            raise CompletionRefusedError(
                "data", f"{problem}; quote it for the shell, such as "
                        "--data '{\"approved\": true}'") from None
    # The same document, read by the same decoder, as the API's route and the client.
    answer = read_completion(completion_document(gate=gate, done=done, error=error,
                                                 no_retry=no_retry, wait=wait, **fields))
    from processor.observe.tracing import configure_from_env

    configure_from_env()  # OTEL_TRACES_EXPORTER set: the completion is a span (trace.md)
    url = database_url(db_url, table_prefix)
    with Client(url, table_prefix) as client:
        completed = client.complete_answer(token, answer)
    if as_json:
        row = {"partition_id": completed.partition_id, "item_id": completed.item_id,
               "status": completed.status, "gate": completed.gate,
               "attempts": completed.attempts, "last_error": completed.last_error}
        if completed.completion_token is not None:
            row["completion_token"] = completed.completion_token
        say_json(row)
        return
    say(f"item {completed.item_id!r} of partition {completed.partition_id!r} is "
        f"{completed.status} at gate {completed.gate}")
    if completed.completion_token is not None:
        say(f"new completion token: {completed.completion_token}")


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
    say(f"the wait now ends at {deadline.isoformat()}Z")


waits_app = typer.Typer(
    help="Waits: an operator's way into a waiting item's wait.", no_args_is_help=True,
    rich_markup_mode=None)
app.add_typer(waits_app, name="waits")


@waits_app.command("token")
def waits_token(
    partition_id: Annotated[str, typer.Argument(help="The waiting item's partition.")],
    item_id: Annotated[str, typer.Argument(help="The waiting item's id.")],
    api_url: Annotated[str, typer.Option(
        "--api-url", envvar=env_name("API_URL"), show_default=False,
        help="The ingest API's public base URL: the completion URL starts with it.")] = "",
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    as_json: JsonOption = False,
) -> None:
    """Mint an operator's completion token for a waiting item (what the console's "Show
    completion URL" does) and print it, with its completion URL: whoever holds it may
    answer the wait, once, by POSTing the answer to the URL (or with `processor complete
    TOKEN`). Minting again replaces the previous operator token; the handler's token
    stays valid until one of them is used. Shown once: it is stored only as a hash."""
    from processor.client.sync_client import Client
    from processor.console.item_page import check_api_url, completion_url

    base = check_api_url(api_url or None)
    url = database_url(db_url, table_prefix)
    with Client(url, table_prefix) as client:
        token = client.operator_token(partition_id, item_id)
    where = completion_url(base, token)
    if as_json:
        say_json({"partition_id": partition_id, "item_id": item_id,
                  "completion_token": token, "completion_url": where})
        return
    say(f"operator completion token for item {item_id!r} of partition {partition_id!r} "
        "(shown once; minting again replaces it):")
    say(token)
    say(f"completion URL: {where}" + ("" if base else "  (put the ingest API's address "
                                                     "before it, or pass --api-url)"))
