"""The producer's verbs: create a partition from an NDJSON file, add items to one, and
wait for one to finish.

``create`` reads its file in chunks through the ingest API's spool (each line checked
as it arrives, the items kept in a temporary file), and inserts the partition with
all its items in one transaction only once every line was good: memory holds a few
MiB whatever the file's size. ``add`` checks its lines the same way, then adds the
items through the client in one transaction (they are held in memory, as the client
takes them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import shlex
import sys
from collections.abc import Iterator
from datetime import datetime
from typing import IO, TYPE_CHECKING, Annotated

import typer

# Only light modules at the top: `processor --help` and the one-line errors must not wait for
# SQLAlchemy, SQLModel or the HTTP clients; each verb imports what it uses.
from processor.cli.common import (
    DEFAULT_DB_URL,
    EXIT_PARTITION_STOPPED,
    EXIT_WAIT_TIMEOUT,
    DbUrl,
    JsonOption,
    PartitionArgument,
    TablePrefix,
    app,
    database_url,
    env_name,
    fail,
    say,
)
from processor.cli.create_options import parse_gates, parse_policy, parse_quorum, parse_start_at
from watcher.config import DEFAULT_MAX_ITEM_BYTES

if TYPE_CHECKING:
    from processor.api.problems import ApiError
    from processor.api.upload import Limits, Spool
    from watcher.records import NewItem, PartitionInfo, PartitionSettings
    from watcher.store.db.urls import DatabaseURL

# The NDJSON is read this many bytes at a time.
READ_CHUNK_BYTES = 64 * 1024
DEFAULT_WAIT_TIMEOUT = 300.0
STDIN = "-"
# A file read by the CLI has no body or upload limit: the spool moves to a temporary file.
NO_STREAM_LIMIT = sys.maxsize
# A gate longer than this is out of range anyway (the settings check says so).

ITEMS_HELP = ("NDJSON file of items, one per line: {\"id\": \"a\", \"gate\": 0, \"data\": "
              "<any JSON>} (or \"data_b64\": \"<base64>\" for raw bytes; gate defaults to "
              "0). - reads stdin.")
ItemsFile = Annotated[str, typer.Option("--items", envvar=env_name("ITEMS"), help=ITEMS_HELP)]
MaxItemBytes = Annotated[int, typer.Option("--max-item-bytes", envvar=env_name("MAX_ITEM_BYTES"),
                                           help="Largest item data accepted (give the "
                                           "processors the same).")]


@app.command()
def create(
    partition_id: PartitionArgument,
    items_file: Annotated[str, typer.Option("--items", envvar=env_name("ITEMS"),
                                            show_default=False,
                                            help=ITEMS_HELP + " Without it: an empty "
                                            "partition.")] = "",
    reduce_gates: Annotated[str, typer.Option("--reduce-gates",
                                              envvar=env_name("REDUCE_GATES"),
                                              help="Gates whose step is one reduce call "
                                              "over the whole gate, comma-separated: 1,3.")
                            ] = "",
    on_item_failure: Annotated[str, typer.Option("--on-item-failure",
                                                 envvar=env_name("ON_ITEM_FAILURE"),
                                                 help="What a failed item does: fail (the "
                                                 "partition fails at that gate) or "
                                                 "continue (the others carry on).")
                               ] = "fail",
    key: Annotated[str, typer.Option("--key", envvar=env_name("KEY"), show_default=False,
                                     help="The partition's concurrency key (a tenant or "
                                     "customer id): partitions are leased fairly across "
                                     "keys, and a key's calls in flight across the fleet "
                                     "stay within its limit (`processor keys`).")] = "",
    priority: Annotated[int, typer.Option("--priority", envvar=env_name("PRIORITY"),
                                          help="From -10 to 10: a higher priority is leased "
                                          "first when processors are busy (each step counts "
                                          "as 30 s of waiting).")] = 0,
    start_at: Annotated[str, typer.Option("--start-at", envvar=env_name("START_AT"),
                                          show_default=False,
                                          help="No processor starts it before this time, by "
                                          "the database clock: RFC 3339 with an offset, "
                                          "2026-11-26T10:00:00Z.")] = "",
    quorum: Annotated[list[str] | None, typer.Option(
        "--quorum", show_default=False, metavar="GATE=K",
        help="Gate GATE passes once K of its items are complete; the others are "
        "skipped (repeat for more gates): --quorum 0=1 keeps the first answer.")] = None,
    notify: Annotated[str, typer.Option(
        "--notify", envvar=env_name("NOTIFY"), show_default=False, metavar="URL",
        help="An http(s) URL POSTed a signed JSON event when the partition ends "
        "(complete, failed or cancelled); see docs/how-to/notifications.md.")] = "",
    pipeline: Annotated[str, typer.Option(
        "--pipeline", envvar=env_name("PIPELINE"), metavar="NAME",
        help="The pipeline whose routes serve it (docs/how-to/pipelines.md).")] = "default",
    pipeline_version: Annotated[str, typer.Option(
        "--pipeline-version", envvar=env_name("PIPELINE_VERSION"), show_default=False,
        metavar="VERSION", help="The pipeline version it keeps until it closes; without "
        "it, the routes' current version when a processor first leases it.")] = "",
    max_item_bytes: MaxItemBytes = DEFAULT_MAX_ITEM_BYTES,
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    as_json: JsonOption = False,
) -> None:
    """Create a partition with the items of an NDJSON file (or stdin), in one transaction.
    An item line may hold "not_before": "2026-11-26T10:00:00Z" to hold that item back.

    Every line is checked before anything is written: a bad line names the file and
    the line, and nothing is created. The file is read in chunks into a temporary
    file, so its size is not limited by memory. A partition that exists already is
    refused (exit 2); `processor add` adds items to it.
    """
    from processor.client.checks import check_id, check_settings
    from processor.views import created_text, utc_text
    from watcher.errors import PartitionExistsError

    check_id("partition", partition_id)
    limits = _limits(max_item_bytes)
    settings = check_settings(partition_id, parse_gates(reduce_gates),
                              parse_policy(on_item_failure), priority, key or None,
                              parse_quorum(quorum or []), notify or None, pipeline,
                              pipeline_version or None)
    start = parse_start_at(start_at)
    url = database_url(db_url, table_prefix)
    with _spool() as spool:
        if items_file:
            _read_items(partition_id, items_file, limits, spool)
        try:
            asyncio.run(_create(url, table_prefix, partition_id, spool, settings,
                                max_item_bytes, start))
        except PartitionExistsError:
            raise fail(f"partition {partition_id!r} already exists; nothing was written: add "
                       f"items to it with `processor add {shlex.quote(partition_id)} --items "
                       "FILE`, or delete it first (`processor delete`)") from None
        count, first_gate = spool.count, spool.first_gate or 0
    if as_json:
        typer.echo(json.dumps({
            "id": partition_id, "items": count, "first_gate": first_gate,
            "reduce_gates": sorted(settings.reduce_gates),
            "on_item_failure": "continue" if settings.continue_on_failure else "fail",
            "key": settings.key or None, "priority": settings.priority,
            "quorum": {str(gate): k for gate, k in settings.quorum} or None,
            "notify": settings.notify, "pipeline": settings.pipeline,
            "pipeline_version": settings.pipeline_version,
            "start_at": None if start is None else utc_text(start)}))
        return
    say(created_text(partition_id, count, first_gate, settings, start))


@app.command()
def add(
    partition_id: PartitionArgument,
    items_file: ItemsFile,
    max_item_bytes: MaxItemBytes = DEFAULT_MAX_ITEM_BYTES,
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    as_json: JsonOption = False,
) -> None:
    """Add the items of an NDJSON file (or stdin) to a partition, in one transaction,
    re-opening it if it was complete (a failed or cancelled one stays so until
    `processor retry`).

    Every line is checked before anything is written, as `processor create` checks
    them; the items are then held in memory (use `processor create` for a big set).
    Refused, writing nothing, when an item's gate is below the partition's gate or
    an id is stored already.
    """
    from processor.client.checks import check_id

    check_id("partition", partition_id)
    limits = _limits(max_item_bytes)
    url = database_url(db_url, table_prefix)
    with _spool() as spool:
        _read_items(partition_id, items_file, limits, spool)
        items = [item for batch in spool.batches() for item in batch]
    reopened = asyncio.run(_add(url, table_prefix, partition_id, items, max_item_bytes))
    if as_json:
        typer.echo(json.dumps({"id": partition_id, "added": len(items), "reopened": reopened}))
        return
    from processor.views import added_text

    say(added_text(partition_id, items, reopened))


@app.command()
def wait(
    partition_id: PartitionArgument,
    timeout: Annotated[float, typer.Option("--timeout", envvar=env_name("WAIT_TIMEOUT"),
                                           help="Seconds to wait at most (0: look once).")
                       ] = DEFAULT_WAIT_TIMEOUT,
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    as_json: Annotated[bool, typer.Option("--json", help="Print the partition as `processor "
                                          "status --json` does, instead of a line.")
                       ] = False,
) -> None:
    """Wait until a partition is complete, failed or cancelled, and print its final status.

    \b
    Exit status:
      0  the partition is complete
      1  the database failed
      2  no such partition, or a bad option
      4  the partition failed, or was cancelled
      5  it was still open when --timeout passed (stderr says where it
         stands; --json prints it on stdout all the same)
    """
    if not (math.isfinite(timeout) and timeout >= 0):
        raise fail(f"--timeout must be a number of seconds from 0, got {timeout}")
    url = database_url(db_url, table_prefix)
    info, timed_out = asyncio.run(_wait(url, table_prefix, partition_id, timeout))
    if as_json:
        from processor.views import partition_row

        typer.echo(json.dumps(partition_row(info), indent=2))
    if timed_out is not None:
        raise fail(timed_out, EXIT_WAIT_TIMEOUT)
    if not as_json:
        from processor.views import final_text

        say(final_text(info))
    if info.status != "complete":
        raise typer.Exit(EXIT_PARTITION_STOPPED)


# --------------------------------------------------------------------------- reading


def _limits(max_item_bytes: int) -> Limits:
    from processor.api.upload import Limits

    if max_item_bytes < 1:
        raise fail(f"--max-item-bytes must be a positive number of bytes, got {max_item_bytes}")
    return Limits(max_item_bytes, max_body_bytes=NO_STREAM_LIMIT,
                  max_upload_bytes=NO_STREAM_LIMIT)


@contextlib.contextmanager
def _spool() -> Iterator[Spool]:
    from processor.api.upload import Spool

    spool = Spool()
    try:
        yield spool
    finally:
        spool.close()


def _read_items(partition_id: str, source: str, limits: Limits, spool: Spool) -> None:
    """Check each line of ``source`` (a path, or ``-`` for stdin) as a new item into
    ``spool``, reading it in chunks.

    Raises:
        typer.Exit: the file cannot be read, or a line is not a valid item (one line
            naming the file and the line; exit 2).
    """
    from processor.api.problems import ApiError
    from processor.api.upload import NdjsonItems

    name = "stdin" if source == STDIN else source
    lines = NdjsonItems(partition_id, limits, spool)
    try:
        with _opened(source) as stream:
            while chunk := stream.read(READ_CHUNK_BYTES):
                lines.feed(chunk)
        lines.finish()
    except OSError as error:
        raise fail(f"cannot read --items {name}: {error.strerror or error}") from None
    except ApiError as error:
        raise fail(_line_error(name, error)) from None


@contextlib.contextmanager
def _opened(source: str) -> Iterator[IO[bytes]]:
    if source == STDIN:
        yield sys.stdin.buffer
        return
    with open(source, "rb") as stream:
        yield stream


def _line_error(name: str, error: ApiError) -> str:
    """``FILE line N: what is wrong``: the checks name the line first (``line 3: ...``,
    ``line 3 is not valid JSON``); the file goes before it."""
    message, line = error.message, error.line
    if line is None:
        return f"{name}: {message}"
    if message.startswith(f"line {line}"):
        return f"{name} {message}"
    return f"{name} line {line}: {message}"


# --------------------------------------------------------------------------- the database


async def _create(url: DatabaseURL, prefix: str, partition_id: str, spool: Spool,
                  settings: PartitionSettings, max_item_bytes: int,
                  start_at: datetime | None) -> None:
    """Insert the partition and the spooled items in one transaction.

    Raises:
        PartitionExistsError: the partition exists already.
        DuplicateItemError: item ids repeat (nothing is written).
        DatabaseError: the database failed.
    """
    from sqlalchemy.exc import IntegrityError, SQLAlchemyError

    from processor.client.async_client import AsyncClient
    from watcher.errors import DuplicateItemError

    async with AsyncClient(url, prefix, max_item_bytes=max_item_bytes) as client:
        try:
            await client.store.partition_create_batches(
                partition_id, spool.batches(), spool.first_gate or 0, settings,
                start_at=start_at)
        except IntegrityError as error:
            repeated = spool.repeated_ids()
            if not repeated:
                raise client.database_error(error) from None
            raise DuplicateItemError(partition_id, repeated, stored=False) from None
        except SQLAlchemyError as error:
            raise client.database_error(error) from None


async def _add(url: DatabaseURL, prefix: str, partition_id: str, items: list[NewItem],
               max_item_bytes: int) -> bool:
    """Add the items; whether the partition re-opened.

    Raises:
        typer.Exit: no such partition (exit 2).
        GateError, DuplicateItemError, InvalidInputError: as the client's ``add_items``.
        DatabaseError: the database failed.
    """
    from processor.client.async_client import AsyncClient
    from watcher.errors import PartitionNotFoundError

    async with AsyncClient(url, prefix, max_item_bytes=max_item_bytes) as client:
        try:
            return await client.add_items(partition_id, items)
        except PartitionNotFoundError:
            raise fail(f"partition {partition_id!r} does not exist; nothing was written: "
                       f"create it with `processor create {shlex.quote(partition_id)} "
                       "--items FILE`") from None


async def _wait(url: DatabaseURL, prefix: str, partition_id: str, timeout: float  # noqa: ASYNC109
                ) -> tuple[PartitionInfo, str | None]:
    """The partition once finished, or as it is when ``timeout`` passed with what the
    client says of it.

    Raises:
        PartitionNotFoundError: no partition has this id.
        DatabaseError: the database failed.
    """
    from processor.client.async_client import AsyncClient

    async with AsyncClient(url, prefix) as client:
        try:
            return await client.wait(partition_id, timeout), None
        except TimeoutError as error:
            return await client.partition(partition_id), str(error)
