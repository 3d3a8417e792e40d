"""The operator's flow-control verbs: ``processor keys`` (list the controls) and ``processor
keys set`` (a key's limits), and the pauses ``processor pause|resume`` makes of a
partition, a key (``--key``) or everything (``--all``)."""

from __future__ import annotations

import contextlib
import json
import shlex
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated

import typer

# Only light modules at the top: `processor --help` and the one-line errors must not wait for
# SQLAlchemy, SQLModel or the HTTP clients; each verb imports what it uses.
from processor.cli.common import (
    CONTEXT_SETTINGS,
    DEFAULT_DB_URL,
    DbUrl,
    JsonOption,
    TablePrefix,
    app,
    data_console,
    database_url,
    fail,
    say,
)

if TYPE_CHECKING:
    from rich.table import Table

    from processor.client.flow_reads import FlowListing
    from watcher.store.db.urls import DatabaseURL

# What `--max-inflight` and `--rate` take to lift a key's own limit.
NO_LIMIT = "none"
DEFAULT_KEYS_LIMIT = 1000

keys_app = typer.Typer(
    help="List the flow controls: keys with limits, paused keys, handlers blocked by a "
    "Retry-After, and whether everything is paused; `processor keys set` sets a key's "
    "limits.", no_args_is_help=False, rich_markup_mode=None,
    context_settings=CONTEXT_SETTINGS)
app.add_typer(keys_app, name="keys")


@keys_app.callback(invoke_without_command=True)
def keys(
    context: typer.Context,
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    grants: Annotated[bool, typer.Option("--grants", help="Also show each key's live "
                                         "grants: the slots of its limit each processor "
                                         "holds (and every key that holds some).")] = False,
    limit: Annotated[int, typer.Option(help="Show at most this many rows.")
                     ] = DEFAULT_KEYS_LIMIT,
    as_json: JsonOption = False,
) -> None:
    """List the flow controls: keys and handlers with a limit, a pause or a Retry-After
    block, and the pause of everything. Limits left unset are the processors' defaults
    (--max-inflight-per-key, --rate-limit, --rate-limit-per-key)."""
    if context.invoked_subcommand is not None:
        return
    import asyncio

    from processor.client.async_client import AsyncClient
    from processor.client.flow_reads import flow_json, read_flow

    if not 1 <= limit <= 10_000:
        raise fail(f"--limit must be from 1 to 10000, got {limit}")
    url = database_url(db_url, table_prefix)

    async def read() -> FlowListing:
        async with AsyncClient(url, table_prefix) as client:
            return await read_flow(client, grants=grants, limit=limit)

    listing = asyncio.run(read())
    if as_json:
        typer.echo(json.dumps(flow_json(listing), indent=2))
        return
    console = data_console(soft_wrap=True)
    if listing.fleet_paused_at is not None:
        from processor.views import utc_text

        console.print(f"everything is paused since {utc_text(listing.fleet_paused_at)}: "
                      "`processor resume --all` lifts it")
    if not listing.rows:
        console.print("no key or handler has a limit, a pause or a block"
                      + (" or holds a grant" if grants else "")
                      + "; `processor keys set KEY --max-inflight N` sets one")
        return
    console.print(_table(listing))
    if listing.more:
        console.print(f"(the first {limit}; --limit shows more)")


def _table(listing: FlowListing) -> Table:
    from rich.table import Table

    from processor.client.flow_reads import blocked_for
    from processor.views import utc_text

    table = Table()
    columns = ["scope", "name", "max in flight", "rate /s", "paused since", "blocked for"]
    if listing.with_grants:
        columns += ["granted", "grants (owner: slots/wanted)"]
    for column in columns:
        table.add_column(column, overflow="fold", justify="right" if column in (
            "max in flight", "rate /s", "granted") else "left")
    for row in listing.rows:
        control = row.control
        blocked = blocked_for(control, listing.now)
        cells = [control.scope, control.name,
                 "-" if control.max_inflight is None else str(control.max_inflight),
                 "-" if control.rate_limit is None else f"{control.rate_limit:g}",
                 "-" if control.paused_at is None else utc_text(control.paused_at),
                 f"{blocked:.1f} s" if blocked else "-"]
        if listing.with_grants:
            cells += [str(row.granted) if control.scope == "key" else "-",
                      ", ".join(f"{grant.owner}: {grant.slots}/{grant.wanted}"
                                for grant in row.grants) or "-"]
        table.add_row(*cells)
    return table


@keys_app.command("set")
def keys_set(
    key: Annotated[str, typer.Argument(help="The concurrency key.")],
    max_inflight: Annotated[str, typer.Option("--max-inflight", show_default=False,
                                              help="Most calls of the key's items in flight "
                                              "across the fleet (none: back to the "
                                              "processors' --max-inflight-per-key).")] = "",
    rate: Annotated[str, typer.Option("--rate", show_default=False,
                                      help="Most calls per second to the handler for the "
                                      "key's items across the fleet (none: back to "
                                      "--rate-limit-per-key).")] = "",
    define: Annotated[bool, typer.Option("--define", help="Set up a key no partition has "
                                         "had yet (else an unknown key is refused as a "
                                         "typo).")] = False,
    db_url: DbUrl = DEFAULT_DB_URL,
    table_prefix: TablePrefix = "",
    as_json: JsonOption = False,
) -> None:
    """Set a key's own limits across the fleet: calls in flight and calls per second.
    Processors apply them at their next lease cycle; lowering a limit lets the calls in
    flight finish."""
    from processor.client.flow import checked_inflight_limit, checked_key_name, checked_rate
    from processor.client.sync_client import Client
    from watcher.errors import InvalidInputError

    if not max_inflight and not rate:
        raise fail("give --max-inflight N and/or --rate N (none lifts a limit); nothing "
                   "was written")
    try:
        name = checked_key_name(key)
        limit = (checked_inflight_limit(_whole(max_inflight, "--max-inflight"))
                 if max_inflight else None)
        per_second = checked_rate(_number(rate, "--rate")) if rate else None
    except InvalidInputError as error:
        raise fail(f"{error}; nothing was written") from None
    url = database_url(db_url, table_prefix)
    with Client(url, table_prefix) as client, _known_key(name):
        # Both values are checked: the first write fails only for an unknown key, and
        # then nothing was written.
        if max_inflight:
            client.set_key_limit(name, limit, define=define)
        if rate:
            client.set_key_rate(name, per_second, define=define)
    if as_json:
        shown: dict[str, object] = {"key": name}
        if max_inflight:
            shown["max_inflight"] = limit
        if rate:
            shown["rate_limit"] = per_second
        typer.echo(json.dumps(shown))
        return
    said = []
    if max_inflight:
        said.append(f"at most {limit} call(s) in flight" if limit is not None
                    else "no in-flight limit of its own (the processors' default)")
    if rate:
        said.append(f"at most {per_second:g} call(s) per second" if per_second is not None
                    else "no rate limit of its own (the processors' default)")
    say(f"key {name!r}: {' and '.join(said)} across the fleet, from each processor's "
               "next lease cycle")


@contextlib.contextmanager
def _known_key(key: str) -> Iterator[None]:
    """Say what to do in CLI terms when ``key`` is unknown.

    Raises:
        typer.Exit: the key is unknown (exit 2).
    """
    from watcher.errors import KeyNotFoundError

    try:
        yield
    except KeyNotFoundError:
        raise fail(f"no partition has had key {key!r}, so it is unknown (a typo?); nothing "
                   "was written: `processor keys --grants` lists keys, and `processor keys "
                   "set KEY --define ...` sets one up before its first partition") from None


def _whole(raw: str, option: str) -> int | None:
    """``none``, or a whole number as the client checks it (it says what is out of range)."""
    from watcher.errors import InvalidInputError

    if raw.strip().lower() == NO_LIMIT:
        return None
    text = raw.strip()
    if not (text.isascii() and text.lstrip("-").isdigit() and len(text) <= 20):
        raise InvalidInputError(f"{option} must be a whole number of calls or none, got "
                                f"{raw!r}")
    return int(text)


def _number(raw: str, option: str) -> float | None:
    """``none``, or a number of calls per second (the client checks its range)."""
    from watcher.errors import InvalidInputError

    if raw.strip().lower() == NO_LIMIT:
        return None
    try:
        return float(raw)
    except ValueError:
        raise InvalidInputError(f"{option} must be calls per second (a number) or none, got "
                                f"{raw!r}") from None


# --------------------------------------------------------------------------- pauses


def pause_or_resume(partition_id: str | None, key: str, everything: bool, db_url: str,
                    table_prefix: str, as_json: bool, *, pausing: bool) -> None:
    """``processor pause|resume``: of one partition, one key (``--key``) or everything
    (``--all``); exactly one of the three.

    Raises:
        typer.Exit: none or several of them named (exit 2); an unknown key (exit 2).
    """
    named = [one for one, given in (("PARTITION", partition_id is not None),
                                    ("--key", bool(key)), ("--all", everything)) if given]
    verb = "pause" if pausing else "resume"
    if len(named) != 1:
        raise fail(f"`processor {verb}` takes one of PARTITION, --key KEY or --all; got "
                   f"{' and '.join(named) if named else 'none'}")
    url = database_url(db_url, table_prefix)
    if partition_id is not None:
        _partition(partition_id, url, table_prefix, as_json, pausing=pausing)
        return
    from processor.client.sync_client import Client

    with Client(url, table_prefix) as client, _known_key(key):
        if everything:
            changed = client.pause_all() if pausing else client.resume_all()
        else:
            changed = client.pause_key(key) if pausing else client.resume_key(key)
    done = "paused" if pausing else "resumed"
    if as_json:
        typer.echo(json.dumps({"key": key or None, "all": everything, done: changed}))
        return
    what = "everything" if everything else f"key {key!r}"
    lift = "--all" if everything else f"--key {shlex.quote(key)}"
    if not changed:
        say(f"{what} is {'paused' if pausing else 'not paused'} already; nothing "
                   "to do")
    elif pausing:
        say(f"paused {what}: no new calls from each processor's next poll (calls in "
                   f"flight finish and are written); `processor resume {lift}` lifts it")
    else:
        say(f"resumed {what}: processors take its work again within a lease cycle")


def _partition(partition_id: str, url: DatabaseURL, table_prefix: str, as_json: bool, *,
               pausing: bool) -> None:
    from processor.client.sync_client import Client

    with Client(url, table_prefix) as client:
        changed = client.pause(partition_id) if pausing else client.resume(partition_id)
        info = client.partition(partition_id)
    verb = "paused" if pausing else "resumed"
    if as_json:
        from processor.views import utc_text

        # "paused"/"resumed" say whether this changed it; paused_at, where it stands.
        typer.echo(json.dumps({"id": info.id, verb: changed, "status": info.status,
                               "gate": info.gate, "paused_at": None if info.paused_at is None
                               else utc_text(info.paused_at)}))
    elif changed:
        say(f"{verb} partition {partition_id!r} ({info.status}, gate {info.gate})"
                   + ("; `processor resume` lifts the pause" if pausing else ""))
    else:
        say(f"partition {partition_id!r} is {'paused' if pausing else 'not paused'} "
                   "already; nothing to do")
