"""Park: items parked by their answers, then completed from outside through the API.

On one database, ``park_items`` items spread over ``partitions`` partitions:

- a normal drain: an in-process watcher answers every item ``done`` (the write of
  a normal answer);
- a parking drain: the same items, each answered ``wait`` (the item's row, with its
  wait); the ratio of the two times is the parking cost per item against a
  normal answer's write. Both drains end on the same in-process sign, read every
  10 ms at no database cost: every item was answered and the watcher holds no lease
  (the partitions closed, or let their leases go once only waits were left). The
  stored statuses are checked after the clock stops. The watcher's resident memory
  is read then too: a processor holds no per-item state for waiting items;
- the writes alone: the time the store's ``items_apply`` (every batch of answers) took
  in each drain, per item written: what an answer's write costs, without the calls
  and the rest of the drain. Parking's stores the wait's key, timeout and policy too;
- completions: every token ``POST /v1/completions/{token}`` (``{"done": true}``) by
  ``concurrency`` concurrent HTTP clients against ``processor api``'s app under
  uvicorn (in this process), timed until the last answer; the partitions complete;
- the baseline: the client's ``add_items`` of the same number of items, one item a
  call (one transaction each, as a completion is), by as many concurrent tasks.

The goal, set when parking and completion by token were built: completions per second at
least half of that ``add_items`` rate.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

import httpx

from bench.common import (
    Goal,
    Outcome,
    Row,
    Settings,
    rate_text,
    ratio_goal,
    rss_bytes,
    statefeed_tables,
    wait_for,
)
from processor import AsyncClient, NewItem
from processor.api.server import ApiOptions, api_running
from watcher import Result, Store, Wait, Watcher, WatcherConfig, WorkItem
from watcher.records import ItemWrite
from watcher.store.db.urls import parse_database_url

TITLE = ("Park ({database}): {items:,} items parked by their answers, completed through "
         "POST /v1/completions/{{token}} by {clients} clients")
COMPLETION_GOAL = 0.5  # completions/s / add_items (one item a call)/s, at least
WRITE_GOAL = 1.0  # a parking answer's write / a normal answer's write, at most
# The completion rate the completions' phase allows for at the least (a second): the
# default size's 100,000 ran at 139 a second on PostgreSQL on two cores, past the
# 300 s every other phase is given.
SLOWEST_COMPLETIONS = 40.0


class WriteClock:
    """Sums the seconds of a store's ``items_apply`` calls and the writes they carried
    (installed on one :class:`Store` instance)."""

    def __init__(self, store: Store) -> None:
        self.seconds = 0.0
        self.writes = 0
        apply = store.items_apply

        async def timed(writes: Sequence[ItemWrite], owner: str) -> list[bool]:
            started = time.perf_counter()
            try:
                return await apply(writes, owner)
            finally:
                self.seconds += time.perf_counter() - started
                self.writes += len(writes)

        store.items_apply = timed  # type: ignore[method-assign]

    @property
    def per_write(self) -> float:
        """Seconds per item written."""
        return self.seconds / max(1, self.writes)


class Parker:
    """Answers every item ``wait`` (keeping its token), or ``done`` when not parking;
    counts its calls."""

    def __init__(self, park: bool) -> None:
        self.park = park
        self.calls = 0
        self.tokens: list[str] = []

    async def __call__(self, item: WorkItem) -> Result:
        self.calls += 1
        if not self.park:
            return Result(done=True)
        self.tokens.append(item.completion_token)
        return Result(wait=Wait(3600))


def _answered_and_let_go(watcher: Watcher, parker: Parker,
                         total: int) -> Callable[[], Awaitable[bool]]:
    """The drain's end, for :func:`wait_for`: every item was answered and ``watcher``
    holds no lease (read in process: no database read competes with the drain)."""

    async def ended() -> bool:
        return parker.calls >= total and not watcher.keeper.leases

    return ended


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
                clients: int, phase: float) -> tuple[float, float, float | None, int]:
    """Seconds of the drain, seconds of its writes per item, (parking) completions per
    second through the API, and the process's resident bytes once the drain ended; each
    phase ends within ``phase`` seconds (else TimeoutError)."""
    timeout = phase
    tag = "pkw" if park else "pkd"
    async with statefeed_tables(db_url, tag) as prefix, AsyncClient(db_url, prefix) as client:
        ids = await _fill(client, partitions, per_partition)
        parker = Parker(park)
        store = Store.open(db_url, prefix)
        clock = WriteClock(store)
        watcher = Watcher(store, parker, WatcherConfig(owner_id=f"bench-{tag}"))
        running = asyncio.create_task(watcher.run())
        total = partitions * per_partition
        try:
            started = time.perf_counter()
            await wait_for(_answered_and_let_go(watcher, parker, total), timeout=timeout,
                           what="every item answered and every lease let go")
            seconds = time.perf_counter() - started
            resident = rss_bytes()
            rate = None
            if not park:
                assert all([(await client.partition(pid)).status == "complete" for pid in ids])
            else:
                assert await _waiting(client, ids, total), "every item waits"
                rate = await _complete(db_url, prefix, parker.tokens, clients, timeout)
                async with asyncio.timeout(timeout):
                    for pid in ids:
                        info = await client.wait(pid, timeout=timeout)
                        assert info.status == "complete", info
        finally:
            await watcher.stop()
            await running
            await store.close()
    return seconds, clock.per_write, rate, resident


async def _complete(db_url: str, prefix: str, tokens: list[str], clients: int,
                    phase: float) -> float:
    """Completions per second: every token posted once by ``clients`` concurrent clients,
    within ``phase`` seconds or the time :data:`SLOWEST_COMPLETIONS` a second would take,
    whichever is longer (100,000 completions take minutes on two cores).

    Raises:
        TimeoutError: they did not all finish in that time.
    """
    options = ApiOptions(parse_database_url(db_url), prefix, port=0)
    timeout = max(phase, len(tokens) / SLOWEST_COMPLETIONS)
    queue = list(tokens)
    retried: list[str] = []
    async with api_running(options) as url, httpx.AsyncClient(
            base_url=url, timeout=60, limits=httpx.Limits(max_connections=clients)) as http:

        async def worker() -> None:
            while queue:
                token = queue.pop()
                try:
                    answer = await http.post(f"/v1/completions/{token}", json={"done": True})
                except httpx.TransportError:
                    # The connection broke mid-request: sent again, as a client would. A
                    # completion the first try applied answers 409 already_completed.
                    retried.append(token)
                    answer = await http.post(f"/v1/completions/{token}", json={"done": True})
                    assert answer.status_code in (200, 409), answer.text
                    continue
                assert answer.status_code == 200, answer.text

        started = time.perf_counter()
        async with asyncio.timeout(timeout):
            await asyncio.gather(*(worker() for _ in range(clients)))
        if retried:
            print(f"park: {len(retried)} completions sent again after a broken connection")
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
    normal, normal_write, _, normal_rss = await drain(
        settings.db_url, partitions, per_partition, park=False, clients=clients, phase=timeout)
    parked, parked_write, completions, parked_rss = await drain(
        settings.db_url, partitions, per_partition, park=True, clients=clients, phase=timeout)
    added = await add_items_rate(settings.db_url, partitions, per_partition, clients)
    assert completions is not None
    share = completions / added
    cost = parked / normal
    write_cost = parked_write / normal_write
    outcome.rows += [
        Row("normal answers (done)", rate_text(items / normal), f"{normal:.2f} s"),
        Row("parking answers (wait)", rate_text(items / parked), f"{parked:.2f} s"),
        Row("parking cost per item / normal answer", f"{cost:.2f}x",
            "the whole drain: calls, tokens, checks and writes"),
        Row("parking write / normal answer's write", f"{write_cost:.2f}x",
            f"{parked_write * 1e6:.1f} against {normal_write * 1e6:.1f} µs an item "
            f"(items_apply); goal <= {WRITE_GOAL:g}x"),
        Row("resident memory after the drain, normal / parking",
            f"{normal_rss / 2**20:.0f} / {parked_rss / 2**20:.0f} MiB",
            "every item waiting, no lease held (the bench keeps the tokens)"),
        Row("completions through the API", rate_text(completions, "completions/s"),
            f"{clients} concurrent HTTP clients, processor api under uvicorn in-process"),
        Row("client add_items, one item a call", rate_text(added),
            f"{clients} concurrent tasks"),
        Row("completions / add_items", f"{share:.2f}x", f"goal >= {COMPLETION_GOAL:g}x"),
    ]
    outcome.figures.update(items=items, partitions=partitions, clients=clients,
                           normal_seconds=round(normal, 3), park_seconds=round(parked, 3),
                           park_cost_ratio=round(cost, 3),
                           normal_write_us=round(normal_write * 1e6, 2),
                           park_write_us=round(parked_write * 1e6, 2),
                           park_write_ratio=round(write_cost, 3),
                           normal_rss_bytes=normal_rss, park_rss_bytes=parked_rss,
                           completions_per_second=round(completions, 1),
                           add_items_per_second=round(added, 1),
                           completion_ratio=round(share, 3))
    outcome.goals.append(ratio_goal("park: completions/s vs add_items (one a call)", share,
                                    COMPLETION_GOAL))
    outcome.goals.append(Goal("park: a parking answer's write vs a normal one's",
                              f"<= {WRITE_GOAL:g}x", f"{write_cost:.2f}x",
                              write_cost <= WRITE_GOAL))
    return outcome

