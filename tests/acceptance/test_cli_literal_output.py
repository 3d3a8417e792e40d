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


# --------------------------------------------------------------------------- escapes

# What a terminal obeys: retitle the window (OSC), clear it and home the cursor (CSI),
# recolour, return the carriage, break the line, the 8-bit CSI, and Rich markup.
OSC = "\x1b]0;owned\x07"
HOSTILE = f"{OSC}\x1b[2J\x1b[H\x1b[31m\r\n\x9b7m[bold]"
SHOWN = "\\x1b]0;owned\\x07\\x1b[2J\\x1b[H\\x1b[31m\\r\\n\\x9b7m[bold]"
# No raw control character may reach the terminal but the line breaks of the output.
RAW = [chr(code) for code in (*range(0x20), 0x7f, *range(0x80, 0xa0)) if chr(code) != "\n"]
SHOW_ID = f"i{HOSTILE}"
FAILED_ID = f"f{HOSTILE}"
HOSTILE_PARTITION = f"p{HOSTILE}"
HOSTILE_KEY = f"k{HOSTILE}"


def safe(done, *, code: int | None = 0) -> str:
    """Stdout and stderr together, after checking the exit code, that no traceback was
    printed and that no raw control character (but line breaks) was."""
    assert code is None or done.returncode == code, (done.returncode, done.stdout,
                                                      done.stderr)
    text: str = done.stdout + done.stderr
    assert "Traceback" not in text
    leaked = sorted({hex(ord(char)) for char in text if char in RAW})
    assert not leaked, (leaked, text)
    return text


@pytest.fixture
def hostile(migrated) -> tuple[str, ...]:
    """A partition, its key, item ids, data and a stored error all holding escapes: the
    ``--db-url``/``--table-prefix`` arguments."""
    import asyncio

    db_url, prefix = migrated

    async def build() -> None:
        store = Store.open(db_url, prefix)
        try:
            async with AsyncClient(db_url, prefix) as client:
                await client.create_partition(HOSTILE_PARTITION, [
                    NewItem(SHOW_ID, json.dumps({"note": HOSTILE, "del": "\x7f"}).encode()),
                    NewItem(FAILED_ID, b"\x1b]0;raw\x07\x9b"),
                ], key=HOSTILE_KEY)
            [_lease] = await store.leases_take(await store.leases_read_free(5), "o", 300)
            ready = {item.id: item for item in await store.items_ready(HOSTILE_PARTITION, 0,
                                                                        10)}
            assert await store.items_apply([
                ItemWrite(HOSTILE_PARTITION, FAILED_ID, ready[FAILED_ID].version, "failed",
                          0, 3, last_error=f"HTTP 500: {HOSTILE} tail")], "o") == [True]
        finally:
            await store.close()

    asyncio.run(build())
    return ("--db-url", db_url, "--table-prefix", prefix)


@pytest.mark.timeout(600)  # some twenty CLI processes, one after the other
@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_every_verb_shows_escapes_in_data_and_obeys_none(hostile) -> None:
    where = hostile
    wide = dict(WIDE)
    status = safe(run_cli("status", *where, env=wide))
    assert squeezed(SHOWN) in squeezed(status) and squeezed(HOSTILE_KEY[:1]) in status
    narrow = safe(run_cli("status", *where, env={"COLUMNS": "80"}))
    assert "\\x1b]0;" in squeezed(narrow)
    listed = safe(run_cli("items", HOSTILE_PARTITION, *where, env=wide))
    # A table's error cell is the error's first line (up to the \r here), escaped.
    for text in (SHOWN, "HTTP500:\\x1b]0;owned\\x07\\x1b[2J\\x1b[H\\x1b[31m..."):
        assert squeezed(text) in squeezed(listed), (text, listed)
    found = safe(run_cli("items", "--find", FAILED_ID, *where, env=wide))
    assert squeezed(SHOWN) in squeezed(found)
    shown = safe(run_cli("items", HOSTILE_PARTITION, "--show", SHOW_ID, *where))
    assert SHOWN in shown and "\\x7f" in shown
    failed = safe(run_cli("items", HOSTILE_PARTITION, "--show", FAILED_ID, *where))
    assert "HTTP 500: \\x1b]0;owned\\x07\\x1b[2J\\x1b[H\\x1b[31m" in failed
    assert "\\x9b7m[bold] tail" in failed and "\\x1b]0;raw\\x07" not in failed  # hex data
    # JSON stays JSON, with the same value.
    as_json = json.loads(safe(run_cli("items", HOSTILE_PARTITION, "--show", SHOW_ID,
                                      "--json", *where)))
    assert as_json["id"] == SHOW_ID and as_json["data"]["note"] == HOSTILE
    [row] = json.loads(safe(run_cli("status", *where, "--json")))
    assert (row["id"], row["key"]) == (HOSTILE_PARTITION, HOSTILE_KEY)
    safe(run_cli("items", HOSTILE_PARTITION, "--json", *where))
    safe(run_cli("items", "--find", FAILED_ID, "--json", *where))
    # The verbs that answer in a line, and the errors that name data.
    for verb in (("pause", HOSTILE_PARTITION), ("resume", HOSTILE_PARTITION),
                 ("pause", "--key", HOSTILE_KEY), ("resume", "--key", HOSTILE_KEY),
                 ("retry", HOSTILE_PARTITION), ("cancel", HOSTILE_PARTITION),
                 ("set-gate", HOSTILE_PARTITION, "0")):
        said = safe(run_cli(*verb, *where), code=None)
        assert "\\x1b]0;" in said, (verb, said)
    safe(run_cli("keys", *where))
    stopped = safe(run_cli("wait", HOSTILE_PARTITION, "--timeout", "0", *where), code=4)
    assert "\\x1b]0;" in stopped
    no_result = safe(run_cli("result", HOSTILE_PARTITION, *where), code=3)
    assert "\\x1b]0;" in no_result
    missing = safe(run_cli("items", HOSTILE_PARTITION, "--show", f"x{OSC}", *where), code=2)
    assert "\\x1b]0;owned\\x07" in missing
    gone = safe(run_cli("delete", HOSTILE_PARTITION, "--force", *where))
    assert "\\x1b]0;" in gone


ESCAPE = "acme\x1b]0;owned\x07\x1b[2J\nforged line"


def test_schedules_print_a_key_with_escapes_as_seen_never_obeyed(migrated) -> None:
    db_url, prefix = migrated
    where = ("--db-url", db_url, "--table-prefix", prefix)
    added = ok(run_cli("schedules", "add", "nightly", "--every", "1h", "--key", ESCAPE,
                       *where))
    shown = ok(run_cli("schedules", "show", "nightly", *where))
    for text in (added, shown):
        assert "\x1b" not in text and "\x07" not in text, repr(text)
        assert "\\x1b]0;owned\\x07\\x1b[2J\\nforged line" in text, text
        assert not any(line.startswith("forged") for line in text.splitlines())
    as_json = json.loads(ok(run_cli("schedules", "show", "nightly", "--json", *where)))
    assert as_json["key"] == ESCAPE
