"""``processor rewind`` as a real subprocess on every live database: what it prints (text
and JSON), --failed-only, --items with several ids, --if-version, and every refusal as
one line on stderr (exit 2) with nothing written."""

from __future__ import annotations

import json

from processor import AsyncClient, NewItem
from tests.acceptance.harness.processes import run_cli
from tests.acceptance.test_cli_operations import ok, one_error_line
from watcher.records import ItemWrite
from watcher.store import Store


async def test_rewind_from_the_command_line(db_url: str, table_prefix: str) -> None:
    where = ("--db-url", db_url, "--table-prefix", table_prefix)
    store = Store.open(db_url, table_prefix)
    try:
        async with AsyncClient(db_url, table_prefix) as client:
            await client.create_partition("job", [NewItem(f"i{n}", b"{}") for n in range(4)],
                                          on_item_failure="continue")
            [lease] = await store.leases_take(await store.leases_read_free(5), "setup", 300)
            ready = {item.id: item for item in await store.items_ready("job", 0, 10)}
            assert all(await store.items_apply([
                ItemWrite("job", "i0", ready["i0"].version, "failed", 0, 3, last_error="x"),
                ItemWrite("job", "i1", ready["i1"].version, "complete", 1, 1),
                ItemWrite("job", "i2", ready["i2"].version, "complete", 1, 1),
                ItemWrite("job", "i3", ready["i3"].version, "complete", 0, 1)], "setup"))
            await store.partition_transition("job", lease.version, "setup", gate=1,
                                             status="complete")
            before = await client.partition("job")

            for args, fragment in [
                (("--gate", "2"), "a rewind only goes back (to gate 1 or below)"),
                (("--gate", "-1"), "gate must be a whole number"),
                (("--gate", "0", "--items", "nope"), "has no item 'nope'"),
                (("--gate", "1", "--items", "i0"), "it is at gate 0, before it"),
                (("--gate", "1", "--failed-only"), "no failed item at gate 1 or later"),
                (("--gate", "0", "--if-version", "1"), "not 1 as expected"),
                (("--gate", "0", "i1"), "unexpected argument 'i1'"),
            ]:
                one_error_line(run_cli("rewind", "job", *args, *where), fragment)
            one_error_line(run_cli("rewind", "nowhere", "--gate", "0", *where),
                           "partition 'nowhere' does not exist")
            after = await client.partition("job")
            assert (after.version, after.status, after.counts) == (
                before.version, before.status, before.counts)

            text = ok(run_cli("rewind", "job", "--gate", "0", "--failed-only", *where))
            assert text.strip() == ("rewound partition 'job' from gate 1 (complete) to gate "
                                    "0; 1 item back at gate 0")
            version = (await client.partition("job")).version
            shown = json.loads(ok(run_cli("rewind", "job", "--gate", "0", "--items", "i1",
                                          "i2", "--if-version", str(version), "--json",
                                          *where)))
            assert (shown["items_reset"], shown["status_before"], shown["gate"],
                    shown["version_before"]) == (2, "available", 0, version)
            items = {item.id: (item.status, item.gate, item.attempts)
                     for item in await client.items("job")}
            assert items == {"i0": ("available", 0, 0), "i1": ("available", 0, 0),
                             "i2": ("available", 0, 0), "i3": ("complete", 0, 1)}
    finally:
        await store.close()


async def test_the_version_status_json_prints_is_the_one_if_version_takes(
        db_url: str, table_prefix: str) -> None:
    where = ("--db-url", db_url, "--table-prefix", table_prefix)
    async with AsyncClient(db_url, table_prefix) as client:
        await client.create_partition("job", [NewItem("i0", b"{}")])
        await client.cancel("job")
        version = (await client.partition("job")).version
    [row] = json.loads(ok(run_cli("status", "--json", *where)))
    assert row["version"] == version
    # A stale version (the partition moved on since it was read) is refused, clearly.
    stale = version - 1
    one_error_line(run_cli("rewind", "job", "--gate", "0", "--if-version", str(stale),
                           *where),
                   f"it is at version {version}, not {stale} as expected; nothing was written")
    shown = json.loads(ok(run_cli("rewind", "job", "--gate", "0", "--if-version",
                                  str(row["version"]), "--json", *where)))
    assert shown["version_before"] == version and shown["reopened"] is True
    [after] = json.loads(ok(run_cli("status", "--json", *where)))
    assert after["version"] > version and after["status"] == "available"
    # The version read before the rewind is stale now.
    one_error_line(run_cli("rewind", "job", "--gate", "0", "--if-version",
                           str(row["version"]), *where), "nothing was written")
