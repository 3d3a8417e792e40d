"""Many parked items cost rows, not memory (SQLite): a processor that parked 20,000
items over four partitions holds no lease, no supervisor and nothing per item once
they all wait, and its resident state does not grow with them."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from processor import AsyncClient, NewItem
from tests.integration.test_waits import config
from tests.support.engine import running, wait_until
from watcher import Result, Store, Wait, Watcher, WorkItem
from watcher.store.db.migrate import upgrade

ITEMS = 20_000
PARTITIONS = 4


async def park(item: WorkItem) -> Result:
    """Park every item (the token is handed to no one: only the row remains)."""
    return Result(wait=Wait(3600))


async def test_twenty_thousand_parked_items_hold_no_state(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'parked.db'}"
    upgrade(db_url)
    client = AsyncClient(db_url)
    per = ITEMS // PARTITIONS
    for number in range(PARTITIONS):
        await client.create_partition(f"p{number}", [NewItem(f"i{n:05d}", b"{}")
                                                     for n in range(per)])
    watcher = Watcher(Store.open(db_url), park, config(concurrency=64))
    tracemalloc.start()
    try:
        async with running(watcher):
            await wait_until(lambda: _all_waiting(client), timeout=300, interval=0.5,
                             message="every item parked")
            await wait_until(lambda: not watcher.supervisors and not watcher.keeper.leases,
                             timeout=30, message="every lease let go")
            held, _ = tracemalloc.get_traced_memory()
            # Nothing per item: no supervisor, no lease, no call in hand.
            assert watcher.supervisors == {} and watcher.keeper.leases == {}
            for number in range(PARTITIONS):
                assert (await client.partition(f"p{number}")).owner == ""
    finally:
        tracemalloc.stop()
        await client.close()
    # 20,000 tokens alone would be ~2 MB held; what the run keeps is far less than that
    # per item (about the connection pool, caches and compiled statements).
    assert held / ITEMS < 100, f"{held / ITEMS:.0f} bytes held per parked item"


async def _all_waiting(client: AsyncClient) -> bool:
    counts = [await client.partition(f"p{number}") for number in range(PARTITIONS)]
    return sum(info.counts.get("waiting", 0) for info in counts) == ITEMS
