"""The CLI prints data literally: ids, owners and error texts holding Rich markup
(``[/bold]``, ``[red]x[/red]``, ``[link=...]``) or emoji codes (``:smile:``) are shown as
they are stored, on every verb, and never crash a table."""

from __future__ import annotations

import json

import pytest

from processor import AsyncClient, NewItem
from tests.acceptance.harness.processes import run_cli
from watcher.records import ItemWrite
from watcher.store import Store

# Each would be changed by Rich's markup or emoji handling; "[/bold]" alone raises.
TRICKY = ["[/bold]", "[red]x[/red]", "[link=http://example.invalid]y[/link]", ":smile:",
          "[bold]b", "a\\[/b]"]
PARTITION = "p[/bold][red]x[/red]:smile:"
OWNER = "owner[/bold][link=http://example.invalid]o[/link]"
ERROR = "HTTP 500: [/bold] [red]boom[/red] :smile: [link=http://example.invalid]z[/link]"


@pytest.fixture
def migrated(db_url: str, table_prefix: str) -> tuple[str, str]:
    """(database URL, table prefix): an empty, migrated namespace."""
    return db_url, table_prefix


WIDE = {"COLUMNS": "400"}  # a table wide enough that no cell is cut with an ellipsis


def ok(done) -> str:
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and done.stderr == ""
    return done.stdout


def squeezed(text: str) -> str:
    # Tables may fold a long cell over lines: compare the text with the borders and line
    # breaks taken out.
    return "".join(ch for ch in text if ch not in "│┃ \n")


async def test_ids_owners_and_errors_print_as_stored(migrated) -> None:
    db_url, prefix = migrated
    where = ("--db-url", db_url, "--table-prefix", prefix)
    store = Store.open(db_url, prefix)
    try:
        async with AsyncClient(db_url, prefix) as client:
            await client.create_partition(PARTITION, [NewItem(text, b"{}") for text in TRICKY])
        [_lease] = await store.leases_take(await store.leases_read_free(5), OWNER, 300)
        ready = {item.id: item for item in await store.items_ready(PARTITION, 0, 10)}
        assert await store.items_apply([
            ItemWrite(PARTITION, "[/bold]", ready["[/bold]"].version, "failed", 0, 3,
                      last_error=ERROR)], OWNER) == [True]
    finally:
        await store.close()

    status = ok(run_cli("status", *where, env=WIDE))
    for text in (PARTITION, OWNER):
        assert squeezed(text) in squeezed(status), status
    assert "smile" in status and "😄" not in status

    items = ok(run_cli("items", PARTITION, *where, env=WIDE))
    for text in (PARTITION, *TRICKY, ERROR):
        assert squeezed(text) in squeezed(items), (text, items)
    assert "😄" not in items

    failed = ok(run_cli("items", PARTITION, *where, "--status", "failed", env=WIDE))
    assert squeezed(ERROR) in squeezed(failed)

    # The JSON forms are literal too (json.dumps, no Rich), and say the same.
    shown = json.loads(ok(run_cli("items", PARTITION, *where, "--json")))
    assert sorted(row["id"] for row in shown["items"]) == sorted(TRICKY)
    [row] = json.loads(ok(run_cli("status", *where, "--json")))
    assert (row["id"], row["owner"]) == (PARTITION, OWNER)

    # The plain-text verbs print the id as it is.
    assert PARTITION in ok(run_cli("cancel", PARTITION, *where))
    assert PARTITION in ok(run_cli("retry", PARTITION, *where))


def test_an_unexpected_error_blames_the_url_only_when_a_driver_refused_an_argument() -> None:
    from processor.cli import _unexpected_hint

    refused = TypeError("connect() got an unexpected keyword argument 'passwd'")
    assert "query string" in _unexpected_hint(refused)
    for error in (ValueError("closing tag '[/bold]' doesn't match"), KeyError("x"),
                  TypeError("unsupported operand")):
        assert "URL" not in _unexpected_hint(error), error
