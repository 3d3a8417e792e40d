"""``processor replay PARTITION ITEM --to URL [--apply]`` as a real subprocess on every live
database, against a real handler (the SDK's app under uvicorn on loopback): the call it
sends is the processor's (headers, key, gate, attempt, body), its answer is shown beside
the stored item, ``--apply`` writes it, an item that moved meanwhile is refused with
nothing written, and a bad URL or a handler that is down is one line, no traceback."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import handlers
from processor import AsyncClient, NewItem
from tests.acceptance.harness.processes import run_cli
from tests.acceptance.test_cli_operations import ok, one_error_line
from tests.support.servers import free_port, serve_app
from watcher.protocol import RetryableError, WorkItem
from watcher.records import ItemWrite
from watcher.rules.decisions import RetryPolicy, write_for_error
from watcher.store import Store


async def _fail_once(store: Store, partition_id: str, item_id: str) -> int:
    """Record one failed attempt of the item as a processor would (its error history
    included); returns the item's version now."""
    ready = {item.id: item for item in await store.items_ready(partition_id, 0, 10)}
    write = write_for_error(partition_id, ready[item_id], RetryableError("the model is down"),
                            RetryPolicy(backoff=0.0, jitter=0.0))
    assert await store.items_apply([write], "setup") == [True]
    return ready[item_id].version + 1


async def test_replay_shows_the_answer_and_apply_writes_it(db_url: str,
                                                           table_prefix: str) -> None:
    where = ("--db-url", db_url, "--table-prefix", table_prefix)
    seen: list[handlers.Item] = []
    store = Store.open(db_url, table_prefix)

    async def step(item: handlers.Item) -> handlers.Result:
        seen.append(item)
        if item.id == "racer":  # a processor answers it while the replay is in flight
            [ready] = [row for row in await store.items_ready("job", 0, 10)
                       if row.id == "racer"]
            assert await store.items_apply([ItemWrite("job", "racer", ready.version,
                                                      "complete", 0, 0)], "setup") == [True]
        return handlers.Result(gate=1, data={"n": item.json()["n"] + 1, "seen": "\x1b[2J"})

    try:
        async with AsyncClient(db_url, table_prefix) as client, \
                serve_app(handlers.app(step)) as handler_url:
            await client.create_partition("job", [NewItem("i0", b'{"n": 1}'),
                                                  NewItem("racer", b'{"n": 5}'),
                                                  NewItem("done", b'{"n": 9}')])
            await store.leases_take(await store.leases_read_free(5), "setup", 300)
            version = await _fail_once(store, "job", "i0")

            async def replay(*args: str) -> Any:
                return await asyncio.to_thread(run_cli, "replay", "job", *args, *where)

            # Shown, not written: the call is the item's last one (attempt 1, same key).
            text = ok(await replay("i0", "--to", handler_url + "/"))
            [call] = seen
            expected_key = WorkItem("job", "i0", 0, 2, b'{"n": 1}', version).idempotency_key
            assert (call.partition_id, call.id, call.gate, call.attempt) == ("job", "i0", 0, 1)
            assert call.idempotency_key == expected_key
            assert call.data == b'{"n": 1}'
            assert "the item's last call (attempt 1 at gate 0, which failed)" in text
            assert "answer: HTTP 200" in text
            assert "\x1b" not in text and '"seen": "\\u001b[2J"' in text  # printed safely
            assert "not written: --apply writes this answer while the item is still at " \
                   f"version {version}" in text
            assert "X-Completion-Token: (hidden)" in text
            stored = await client.item("job", "i0")
            assert (stored.status, stored.gate, stored.attempts, stored.version) == (
                "available", 0, 1, version)

            shown = json.loads(ok(await replay("i0", "--to", handler_url, "--json")))
            assert shown["answer"]["status"] == 200
            assert shown["answer"]["body"]["data"]["n"] == 2
            assert shown["would_write"]["gate"] == 1 and shown["applied"] is False
            assert shown["call"]["which"] == "last"

            # --apply: written as a processor would (gate 1, attempts reset, new data).
            text = ok(await replay("i0", "--to", handler_url, "--apply"))
            assert "written: the item is available at gate 1" in text
            stored = await client.item("job", "i0")
            assert (stored.status, stored.gate, stored.attempts) == ("available", 1, 0)
            assert json.loads(stored.data) == {"n": 2, "seen": "\x1b[2J"}

            # The item moved while its call was in flight: refused, nothing written.
            before = await client.item("job", "racer")
            line = one_error_line(await replay("racer", "--to", handler_url, "--apply"),
                                  "item 'racer' of partition 'job' moved since it was read")
            assert "nothing was written" in line
            after = await client.item("job", "racer")
            assert (after.status, after.gate, after.data) == ("complete", 0, b'{"n": 5}')
            assert after.version == before.version + 1  # the racer's write alone

            # A complete item takes no answer; the replay itself still shows one.
            ok(await replay("racer", "--to", handler_url))
            one_error_line(await replay("racer", "--to", handler_url, "--apply"),
                           "item 'racer' of partition 'job' is complete")
            assert (await client.item("job", "racer")).version == after.version
    finally:
        await store.close()


async def test_a_bad_url_or_a_handler_that_is_down_is_one_line(db_url: str,
                                                              table_prefix: str) -> None:
    where = ("--db-url", db_url, "--table-prefix", table_prefix)
    async with AsyncClient(db_url, table_prefix) as client:
        await client.create_partition("job", [NewItem("i0", b"{}")])
        before = await client.item("job", "i0")
    one_error_line(run_cli("replay", "job", "i0", "--to", "ftp://example.com/", *where),
                   "--to 'ftp://example.com/' must start with http:// or https://")
    down = f"http://127.0.0.1:{free_port()}/"
    line = one_error_line(run_cli("replay", "job", "i0", "--to", down, "--apply", *where),
                          "no answer: could not connect to http://127.0.0.1:")
    assert line.endswith("nothing was written")
    one_error_line(run_cli("replay", "job", "nope", "--to", down, *where),
                   "partition 'job' has no item 'nope'")
    async with AsyncClient(db_url, table_prefix) as client:
        after = await client.item("job", "i0")
    assert after.version == before.version and after.status == "available"
