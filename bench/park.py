"""Park: items parked by their answers, then completed from outside through the API.

On one database, ``park_items`` items spread over ``partitions`` partitions:

- a normal drain: an in-process watcher answers every item ``done`` (the write of
  a normal answer, timed from start to the last partition complete);
- a parking drain: the same items, each answered ``wait`` (the item row and its
  ``waits`` row), timed until every item waits; the ratio of the two times is the
  parking cost per item against a normal answer's write;
- completions: every token ``POST /v1/completions/{token}`` (``{"done": true}``) by
  ``concurrency`` concurrent HTTP clients against ``processor api``'s app under
  uvicorn (in this process), timed until the last answer; the partitions complete;
- the baseline: the client's ``add_items`` of the same number of items, one item a
  call (one transaction each, as a completion is), by as many concurrent tasks.

The goal (issue 44): completions per second at least half of that ``add_items`` rate.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from bench.common import Outcome, Row, Settings, rate_text, ratio_goal, statefeed_tables
from processor import AsyncClient, NewItem
from processor.api.server import ApiOptions, api_running
from watcher import Result, Store, Wait, Watcher, WatcherConfig, WorkItem
from watcher.store.db.urls import parse_database_url

TITLE = ("Park ({database}): {items:,} items parked by their answers, completed through "
         "POST /v1/completions/{{token}} by {clients} clients")
COMPLETION_GOAL = 0.5  # completions/s / add_items (one item a call)/s, at least


class Parker:
    """Answers every item ``wait`` (keeping its token), or ``done`` when not parking."""

    def __init__(self, park: bool) -> None:
        self.park = park
        self.tokens: list[str] = []

    async def __call__(self, item: WorkItem) -> Result:
        if not self.park:
            return Result(done=True)
        self.tokens.append(item.completion_token)
        return Result(wait=Wait(3600))


async def _fill(client: AsyncClient, partitions: int, per_partition: int) -> list[str]:
    ids = [f"p{number:04d}" for number in range(partitions)]
    for pid in ids:
        await client.create_partition(pid, [NewItem(f"i{n:07d}", b"{}")
                                            for n in range(per_partition)])
    return ids


async def _waiting(client: AsyncClient, ids: list[str], expected: int) -> bool:
    counts = [await client.partition(pid) for pid in ids]
    return sum(info.counts.get("waiting", 0) for info in counts) >= expected


async def drain(db_url: str, partitions: int, per_partition: int, *, park: bool,
                clients: int, phase: float) -> tuple[float, float | None]:
    """Seconds of the drain, and (parking) completions per second through the API; each
    phase ends within ``phase`` seconds (else TimeoutError)."""
    timeout = phase
    tag = "pkw" if park else "pkd"
    async with statefeed_tables(db_url, tag) as prefix, AsyncClient(db_url, prefix) as client:
        ids = await _fill(client, partitions, per_partition)
        parker = Parker(park)
        store = Store.open(db_url, prefix)
        watcher = Watcher(store, parker, WatcherConfig(owner_id=f"bench-{tag}"))
        running = asyncio.create_task(watcher.run())
        total = partitions * per_partition
        try:
            started = time.perf_counter()
            async with asyncio.timeout(timeout):
                if park:
                    while True:
                        if await _waiting(client, ids, total):
                            break
                        await asyncio.sleep(0.05)
                else:
                    for pid in ids:
                        await client.wait(pid, timeout=timeout)
            seconds = time.perf_counter() - started
            rate = None
            if park:
                rate = await _complete(db_url, prefix, parker.tokens, clients, timeout)
                async with asyncio.timeout(timeout):
                    for pid in ids:
                        info = await client.wait(pid, timeout=timeout)
                        assert info.status == "complete", info
        finally:
            await watcher.stop()
            await running
            await store.close()
    return seconds, rate


async def _complete(db_url: str, prefix: str, tokens: list[str], clients: int,
                    phase: float) -> float:
    """Completions per second: every token posted once by ``clients`` concurrent clients."""
    options = ApiOptions(parse_database_url(db_url), prefix, port=0)
    timeout = phase
    queue = list(tokens)
    async with api_running(options) as url, httpx.AsyncClient(
            base_url=url, timeout=60, limits=httpx.Limits(max_connections=clients)) as http:

        async def worker() -> None:
            while queue:
                token = queue.pop()
                answer = await http.post(f"/v1/completions/{token}", json={"done": True})
                assert answer.status_code == 200, answer.text

        started = time.perf_counter()
        async with asyncio.timeout(timeout):
            await asyncio.gather(*(worker() for _ in range(clients)))
        return len(tokens) / (time.perf_counter() - started)


async def add_items_rate(db_url: str, partitions: int, per_partition: int,
                         clients: int) -> float:
    """Items per second added by the client one item a call, ``clients`` at once."""
    async with statefeed_tables(db_url, "pka") as prefix, AsyncClient(db_url, prefix) as client:
        ids = [f"p{number:04d}" for number in range(partitions)]
        for pid in ids:
            await client.create_partition(pid, [NewItem("seed", b"{}", 1)])
        queue = [(pid, f"i{n:07d}") for n in range(per_partition) for pid in ids]

        async def worker() -> None:
            while queue:
                pid, item_id = queue.pop()
                await client.add_items(pid, [NewItem(item_id, b"{}", 1)])

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        return len(ids) * per_partition / (time.perf_counter() - started)


async def run(settings: Settings) -> Outcome:
    """The park scenario (see the module docstring)."""
    sizes = settings.sizes
    partitions, clients = sizes.partitions, sizes.concurrency
    per_partition = max(1, sizes.park_items // partitions)
    items = partitions * per_partition
    outcome = Outcome("park", TITLE.format(database=settings.database_title, items=items,
                                           clients=clients))
    timeout = sizes.phase_timeout
    normal, _ = await drain(settings.db_url, partitions, per_partition, park=False,
                            clients=clients, phase=timeout)
    parked, completions = await drain(settings.db_url, partitions, per_partition, park=True,
                                      clients=clients, phase=timeout)
    added = await add_items_rate(settings.db_url, partitions, per_partition, clients)
    assert completions is not None
    share = completions / added
    cost = parked / normal
    outcome.rows += [
        Row("normal answers (done)", rate_text(items / normal), f"{normal:.2f} s"),
        Row("parking answers (wait)", rate_text(items / parked), f"{parked:.2f} s"),
        Row("parking cost per item / normal answer", f"{cost:.2f}x",
            "an item row and a waits row against an item row"),
        Row("completions through the API", rate_text(completions, "completions/s"),
            f"{clients} concurrent HTTP clients, processor api under uvicorn in-process"),
        Row("client add_items, one item a call", rate_text(added),
            f"{clients} concurrent tasks"),
        Row("completions / add_items", f"{share:.2f}x", f"goal >= {COMPLETION_GOAL:g}x"),
    ]
    outcome.figures.update(items=items, partitions=partitions, clients=clients,
                           normal_seconds=round(normal, 3), park_seconds=round(parked, 3),
                           park_cost_ratio=round(cost, 3),
                           completions_per_second=round(completions, 1),
                           add_items_per_second=round(added, 1),
                           completion_ratio=round(share, 3))
    outcome.goals.append(ratio_goal("park: completions/s vs add_items (one a call)", share,
                                    COMPLETION_GOAL))
    return outcome

