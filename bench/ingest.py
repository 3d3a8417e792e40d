"""Ingest: items created through the ingest API (``processor api``) against the Python
client's ``create_partition``, on one database.

The same items (small JSON data, ``{"n": k}``) go into a fresh partition each way,
and each partition is deleted again after its timing, so every create starts on
the same table:

- client: ``AsyncClient.create_partition`` in this process, the items built
  before the clock starts;
- API, NDJSON: ``PUT /v1/partitions/{id}`` to ``processor api`` in its own
  process, the body streamed by httpx (chunked) from lines encoded before the
  clock starts; the clock stops at the 201, when every item is in the database;
- API, JSON: the same route with the items in one JSON body, for a smaller
  partition (``ingest_json_items``; a JSON body is read whole), against the
  client on that size too.

Each is timed at least three times, interleaved; the best of each counts. The
API process's CPU per item on the NDJSON path comes with it.

Goal (the ingest API): the API's NDJSON create at least half the client's
items/s.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass

import httpx

from bench.common import (
    PROCESSOR,
    Outcome,
    Row,
    Settings,
    cpu_seconds,
    rate_text,
    ratio,
    ratio_goal,
    statefeed_tables,
    wait_for,
)
from bench.procs import Child, Processes, free_port
from processor import AsyncClient, NewItem

TITLE = ("Ingest ({database}): {items:,} items through the API as NDJSON, against the "
         "client's create_partition")
ROUNDS = 3  # at least, whatever --rounds says: the ratio is the scenario's point
NDJSON_GOAL = 0.5  # API NDJSON items/s / client items/s, at least
LINES_PER_CHUNK = 1_000  # NDJSON lines per chunk of the streamed body
NDJSON = {"content-type": "application/x-ndjson"}
JSON = {"content-type": "application/json"}


@dataclass(frozen=True)
class Create:
    """One timed create: how many items, how long, and the API process's CPU meanwhile."""

    items: int
    seconds: float
    api_cpu_seconds: float = 0.0

    @property
    def per_second(self) -> float:
        return self.items / self.seconds


def best(creates: list[Create]) -> Create:
    """The fastest of ``creates``."""
    return min(creates, key=lambda create: create.seconds)


def figures(creates: list[Create]) -> dict[str, object]:
    """The best create and every round's rate, for the JSON file."""
    top = best(creates)
    return {"items": top.items, "seconds": round(top.seconds, 4),
            "items_per_s": round(top.per_second, 1),
            "rounds_items_per_s": [round(create.per_second, 1) for create in creates]}


def new_items(count: int) -> list[NewItem]:
    """``count`` small items, ``i0000000`` ... with data ``{"n": k}``."""
    return [NewItem(f"i{n:07d}", b'{"n":%d}' % n) for n in range(count)]


def ndjson_chunks(count: int) -> list[bytes]:
    """The same items as NDJSON lines, :data:`LINES_PER_CHUNK` lines a chunk."""
    lines = [b'{"id":"i%07d","data":{"n":%d}}\n' % (n, n) for n in range(count)]
    return [b"".join(lines[start:start + LINES_PER_CHUNK])
            for start in range(0, count, LINES_PER_CHUNK)]


def json_body(count: int) -> bytes:
    """The same items as one JSON create body."""
    return json.dumps({"items": [{"id": f"i{n:07d}", "data": {"n": n}} for n in range(count)]},
                      separators=(",", ":")).encode()


@contextlib.asynccontextmanager
async def api_process(settings: Settings, prefix: str) -> AsyncIterator[tuple[str, Child]]:
    """``processor api`` on the run's database and ``prefix``, in its own process, for the
    block; yields its base URL and the child.

    Raises:
        RuntimeError: it exited before it answered.
        TimeoutError: it did not answer ``/healthz`` within the phase timeout.
    """
    port = free_port()
    async with Processes(settings.work_dir) as processes:
        child = await processes.start(
            "ingest-api", PROCESSOR, "api", "--db-url", settings.db_url, "--table-prefix",
            prefix, "--port", str(port), "--log-level", "warning")
        url = f"http://127.0.0.1:{port}/"

        async def answers() -> bool:
            if not child.running:
                raise RuntimeError(f"processor api exited:\n{child.log()[-2000:]}")
            with contextlib.suppress(httpx.TransportError):
                async with httpx.AsyncClient(timeout=2) as http:
                    return (await http.get(f"{url}healthz")).status_code == 200
            return False

        await wait_for(answers, timeout=settings.sizes.phase_timeout, interval=0.05,
                       what="processor api to answer")
        try:
            yield url, child
        finally:
            await child.terminate()


async def timed(create: Awaitable[None], items: int, child: Child | None = None) -> Create:
    """Time one create (and the API process's CPU during it, given the API's ``child``)."""
    cpu_before = cpu_seconds(child.process.pid) if child is not None else 0.0
    started = time.perf_counter()
    await create
    seconds = time.perf_counter() - started
    cpu = cpu_seconds(child.process.pid) - cpu_before if child is not None else 0.0
    return Create(items, seconds, cpu)


async def run(settings: Settings) -> Outcome:
    """The ingest scenario (see the module docstring).

    Raises:
        RuntimeError: the API refused a create, or a partition holds the wrong count.
        TimeoutError: the API did not start, or a create took longer than the phase timeout.
    """
    sizes = settings.sizes
    count, json_count = sizes.ingest_items, sizes.ingest_json_items
    outcome = Outcome("ingest", TITLE.format(database=settings.database_title, items=count))
    items, small_items = new_items(count), new_items(json_count)
    chunks, body = ndjson_chunks(count), json_body(json_count)
    runs: dict[str, list[Create]] = {"client": [], "ndjson": [], "client_small": [],
                                     "json": []}
    async with statefeed_tables(settings.db_url, "ing") as prefix, \
            AsyncClient(settings.db_url, prefix) as client, \
            api_process(settings, prefix) as (url, child), \
            httpx.AsyncClient(base_url=url, timeout=sizes.phase_timeout) as http:

        async def api_put(partition_id: str, content: bytes | AsyncIterator[bytes],
                          headers: dict[str, str], expected: int) -> None:
            response = await http.put(f"v1/partitions/{partition_id}", content=content,
                                      headers=headers)
            if response.status_code != 201 or response.json()["items"] != expected:
                raise RuntimeError(f"the API refused the create of {partition_id}: "
                                   f"HTTP {response.status_code} {response.text[:300]}")

        async def stream() -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield chunk

        async def create(way: str, partition_id: str) -> None:
            if way == "client":
                await client.create_partition(partition_id, items)
            elif way == "ndjson":
                await api_put(partition_id, stream(), NDJSON, count)
            elif way == "client_small":
                await client.create_partition(partition_id, small_items)
            else:
                await api_put(partition_id, body, JSON, json_count)

        for number in range(max(settings.rounds, ROUNDS)):  # interleaved
            for way, runs_of_way in runs.items():
                partition_id = f"{way}-{number}"
                expected = json_count if way in ("client_small", "json") else count
                watched = child if way == "ndjson" else None
                runs_of_way.append(await timed(create(way, partition_id), expected, watched))
                total = sum((await client.partition(partition_id)).counts.values())
                if total != expected:
                    raise RuntimeError(f"{partition_id} holds {total} items, not {expected}")
                await client.delete_partition(partition_id, force=True)
    client_best, ndjson_best = best(runs["client"]), best(runs["ndjson"])
    small_best, json_best = best(runs["client_small"]), best(runs["json"])
    ndjson_ratio = ratio(ndjson_best.per_second, client_best.per_second)
    json_ratio = ratio(json_best.per_second, small_best.per_second)
    api_cpu_us = ndjson_best.api_cpu_seconds / count * 1e6
    rounds = len(runs["client"])
    outcome.rows += [
        Row("client create_partition", rate_text(client_best.per_second),
            f"{count:,} items in {client_best.seconds:.2f} s; best of {rounds}"),
        Row("API, NDJSON streamed", rate_text(ndjson_best.per_second),
            f"{count:,} items in {ndjson_best.seconds:.2f} s; processor api CPU "
            f"{api_cpu_us:,.1f} us/item"),
        Row("ratio API NDJSON / client", f"{ndjson_ratio:.2f}x",
            "the same items and database; 1.0x: as fast as the client in-process"),
        Row(f"client create_partition, {json_count:,} items", rate_text(small_best.per_second),
            f"in {small_best.seconds:.2f} s"),
        Row(f"API, one JSON body, {json_count:,} items", rate_text(json_best.per_second),
            f"in {json_best.seconds:.2f} s"),
        Row("ratio API JSON / client", f"{json_ratio:.2f}x", f"{json_count:,} items each"),
    ]
    outcome.figures.update(
        items=count, json_items=json_count, client=figures(runs["client"]),
        api_ndjson={**figures(runs["ndjson"]), "api_cpu_us_per_item": round(api_cpu_us, 2)},
        client_json_size=figures(runs["client_small"]), api_json=figures(runs["json"]),
        ratio_ndjson_over_client=None if ndjson_ratio is None else round(ndjson_ratio, 3),
        ratio_json_over_client=None if json_ratio is None else round(json_ratio, 3))
    outcome.goals.append(ratio_goal("ingest: API NDJSON vs the client's create_partition, "
                                    "items/s", ndjson_ratio, NDJSON_GOAL))
    return outcome
