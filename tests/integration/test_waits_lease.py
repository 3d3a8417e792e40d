"""Parked partitions on every live database: a partition whose open items all wait lets
its lease go (no slot, no poll) until a completion or a deadline brings it back; races
of a completion with a timeout, a retry and a delete apply one of them, never both; the
waits of removed items go with them, and their tokens answer "already completed" for
30 days."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select, update

from processor import AsyncClient, NewItem
from tests.integration.test_waits import Parker, config
from tests.support.engine import running, wait_until
from watcher import Result, Watcher
from watcher.errors import AlreadyCompletedError, PartitionNotFoundError, WaitNotFoundError
from watcher.protocol import RetryableError
from watcher.reports import PurgeReport
from watcher.retention import purge

# A poll of 0.05 s: a wait of minutes is far more than a poll away, so the lease goes.
BOUND = 10.0


async def _owner(client: AsyncClient, partition_id: str = "p") -> str:
    return (await client.partition(partition_id)).owner


async def _waiting(client: AsyncClient, count: int) -> bool:
    items = await client.items("p")
    return sum(item.status == "waiting" for item in items) == count


async def test_a_partition_whose_items_all_wait_lets_its_lease_go(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    parker = Parker()
    await client.create_partition("p", [NewItem(f"i{n}", b"1") for n in range(5)])
    store = make_store()
    watcher = Watcher(make_store(), parker, config())
    async with running(watcher):
        await wait_until(lambda: _waiting(client, 5), message="all parked")
        await wait_until(lambda: _released(client), timeout=BOUND,
                         message="the lease let go while every item waits")
        assert not watcher.keeper.leases, "the processor holds no lease of it"
        for n in range(4):
            await store.wait_complete(parker.token(f"i{n}"), Result(gate=1))
        # i4 still waits: the partition may be taken and let go again, never passed.
        assert (await client.partition("p")).gate == 0
        await store.wait_complete(parker.token("i4"), Result(gate=1))
        info = await client.wait("p", timeout=30)
    assert info.status == "complete" and info.counts == {"complete": 5}
    await client.close()


async def _released(client: AsyncClient) -> bool:
    return await _owner(client) == ""


async def test_a_parked_partition_comes_back_at_its_deadline(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    parker = Parker(timeout=1.5, on_timeout="fail")
    await client.create_partition("p", [NewItem("a", b"1")])
    async with running(Watcher(make_store(), parker, config())):
        await wait_until(lambda: _waiting(client, 1), message="parked")
        await wait_until(lambda: _released(client), timeout=BOUND, message="let go")
        info = await client.wait("p", timeout=30)
    assert info.status == "failed", "the deadline brought it back and failed the item"
    (item,) = await client.items("p")
    assert item.status == "failed" and "timed out waiting" in (item.last_error or "")
    await client.close()


@pytest.mark.parametrize("offset", [-0.02, 0.0, 0.02])
async def test_a_completion_racing_the_deadline_applies_once(
        db_url, table_prefix, make_store, offset: float) -> None:
    client = AsyncClient(db_url, table_prefix)
    parker = Parker(timeout=1.0, on_timeout="fail")
    await client.create_partition("p", [NewItem("a", b"1")])
    store = make_store()
    async with running(Watcher(make_store(), parker, config())):
        await wait_until(lambda: parker.tokens, message="parked")
        await wait_until(lambda: _waiting(client, 1), message="waiting")
        (item,) = await client.items("p")
        assert item.retry_at is not None
        left = (item.retry_at - await store.now()).total_seconds()
        await asyncio.sleep(max(0.0, left + offset))
        try:
            done = await store.wait_complete(parker.token("a"), Result(done=True))
        except AlreadyCompletedError as lost:
            won_by = "timeout"
            assert lost.status == "failed", "the loser is told the winner's outcome"
            assert "failed now" in str(lost)
        else:
            won_by = "completion"
            assert done.status == "complete"
        info = await client.wait("p", timeout=30)
    (item,) = await client.items("p")
    expected = {"completion": ("complete", "complete"), "timeout": ("failed", "failed")}
    assert (info.status, item.status) == expected[won_by]
    with pytest.raises(AlreadyCompletedError):
        await store.wait_complete(parker.token("a"), Result(done=True))
    await client.close()


async def test_a_completion_after_a_retry_or_a_delete_is_refused(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    parker = Parker(timeout=600.0)
    await client.create_partition("p", [NewItem("a", b"1"), NewItem("b", b"2")])
    store = make_store()
    async with running(Watcher(make_store(), parker, config())):
        await wait_until(lambda: _waiting(client, 2), message="parked")
        first = parker.token("a")
        await store.wait_complete(first, RetryableError("try again"))
        await wait_until(lambda: len(parker.tokens["a"]) == 2, message="called again")
        with pytest.raises(AlreadyCompletedError):
            await store.wait_complete(first, Result(done=True))
        await wait_until(lambda: _waiting(client, 2), message="parked again")
        await client.cancel("p")
    assert await _waits(store, "p") > 0
    await client.delete_partition("p")
    assert await _waits(store, "p") == 0, "the partition's waits went with it"
    for token in (first, parker.token("a"), parker.token("b")):
        with pytest.raises(AlreadyCompletedError, match="the item was deleted"):
            await store.wait_complete(token, Result(done=True))
        with pytest.raises(AlreadyCompletedError):
            await store.wait_heartbeat(token, 60.0)
    with pytest.raises(PartitionNotFoundError):  # a late completion wrote nothing
        await client.partition("p")
    await client.close()


async def test_the_tokens_of_deleted_waits_are_forgotten_by_a_purge_after_thirty_days(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    parker = Parker(timeout=600.0)
    await client.create_partition("p", [NewItem("a", b"1")])
    store = make_store()
    async with running(Watcher(make_store(), parker, config())):
        await wait_until(lambda: _waiting(client, 1), message="parked")
    await client.delete_partition("p", force=True)
    assert await purge(store, older_than=0, statuses=("complete",)) == PurgeReport()
    with pytest.raises(AlreadyCompletedError):  # kept: younger than 30 days
        await store.wait_complete(parker.token("a"), Result(done=True))
    removed = store.tables.removed_waits
    async with store.engine.begin() as conn:  # the delete as if 31 days ago
        await conn.execute(update(removed).values(
            removed_at=datetime.now(UTC).replace(tzinfo=None) - timedelta(days=31)))
    await purge(store, older_than=0, statuses=("complete",))
    with pytest.raises(WaitNotFoundError):
        await store.wait_complete(parker.token("a"), Result(done=True))
    await client.close()


async def _waits(store, partition_id: str) -> int:  # type: ignore[no-untyped-def]
    """The wait keys the partition's items hold: in their rows, and in ``waits``."""
    w, i = store.tables.waits, store.tables.items
    async with store.engine.connect() as conn:
        in_rows = (await conn.execute(select(func.count()).where(
            i.c.partition_id == partition_id, i.c.wait_key.is_not(None)))).scalar_one()
        others = (await conn.execute(select(func.count()).select_from(w).where(
            w.c.partition_id == partition_id))).scalar_one()
    return int(in_rows) + int(others)


async def test_a_heartbeat_that_brings_a_deadline_closer_brings_the_partition_back(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    parker = Parker(timeout=600.0, on_timeout="fail")
    await client.create_partition("p", [NewItem("a", b"1")])
    store = make_store()
    async with running(Watcher(make_store(), parker, config())):
        await wait_until(lambda: _waiting(client, 1), message="parked")
        await wait_until(lambda: _released(client), timeout=BOUND, message="let go")
        await store.wait_heartbeat(parker.token("a"), 1.0)
        info = await client.wait("p", timeout=30)
    assert info.status == "failed", "taken back at the new, closer deadline"
    await client.close()


async def test_item_retention_deletes_the_waits_of_the_items_it_removes(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    parker = Parker()
    await client.create_partition("p", [NewItem("a", b"1"), NewItem("b", b"2")])
    store = make_store()
    async with running(Watcher(make_store(), parker, config())):
        await wait_until(lambda: _waiting(client, 2), message="parked")
        used = parker.token("a")
        await store.wait_complete(used, Result(done=True))

        async def purged() -> bool:
            removed, _ = await store.items_purge_finished("p", older_than=0, batch=100)
            return removed == 1

        await wait_until(purged, message="the complete item removed by retention")
        assert await _waits(store, "p") == 1, "only the waiting item's wait is left"
        with pytest.raises(AlreadyCompletedError, match="the item was deleted"):
            await store.wait_complete(used, Result(done=True))
        await store.wait_complete(parker.token("b"), Result(done=True))
        info = await client.wait("p", timeout=30)
    assert info.status == "complete"
    await client.close()
