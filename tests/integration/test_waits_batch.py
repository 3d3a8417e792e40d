"""Parking answers written in the batch of plain answers, on every live database: the
``waits`` row of each applied parking write goes with the batch (the driver's own
write, not the spawning transaction), and a write the version guard or the lease
fence refuses parks nothing: its token is told the wait is over (it never began),
never that no wait has it yet."""

from __future__ import annotations

import pytest

from watcher import Result
from watcher.errors import AlreadyCompletedError
from watcher.records import ItemWrite, NewItem
from watcher.store import Store
from watcher.waits import WaitWrite, new_completion_token, token_hash


async def _held(store: Store, partition_id: str, ids: list[str], owner: str) -> None:
    """Create ``partition_id`` with ``ids`` (each at version 1) and lease it to ``owner``."""
    await store.partition_create(partition_id, [NewItem(item_id, b"") for item_id in ids])
    free = [row for row in await store.leases_read_free(100) if row.id == partition_id]
    assert [row.id for row in await store.leases_take(free, owner, 30)] == [partition_id]


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _parking(partition_id: str, item_id: str, seen: int = 1) -> tuple[ItemWrite, str]:
    """A parking write of ``item_id`` read at ``seen`` (by a traced call), and its token."""
    token = new_completion_token()
    write = ItemWrite(partition_id, item_id, seen, "waiting", 0, 0, retry_delay=600.0,
                      wait=WaitWrite(token_hash(token), 600.0, traceparent=TRACEPARENT))
    return write, token


async def _counts(store: Store, partition_id: str) -> dict[str, int]:
    info = await store.partition_get(partition_id)
    assert info is not None
    return info.counts


async def _completes(store: Store, token: str) -> bool:
    """Whether ``token`` completes its item (``False``: its wait is over, or never began;
    a token no wait ever knew, which a refused parking write's must not be, fails)."""
    try:
        done = await store.wait_complete(token, Result(done=True))
    except AlreadyCompletedError:
        return False
    assert done.status == "complete"
    assert done.parked_by == TRACEPARENT, "the wait keeps the parking call's trace"
    return True


async def test_parking_writes_and_plain_ones_share_a_batch(store: Store) -> None:
    await _held(store, "p", ["a", "b", "c", "d"], "w1")
    parked = [_parking("p", item_id) for item_id in ("a", "b", "c")]
    writes = [parked[0][0], ItemWrite("p", "d", 1, "complete", 0, 1), *(w for w, _ in parked[1:])]
    assert await store.items_apply(writes, "w1") == [True] * 4
    assert await _counts(store, "p") == {"waiting": 3, "complete": 1}
    for _, token in parked:
        assert await _completes(store, token), "each applied parking write stored its wait"


async def test_a_refused_parking_write_parks_nothing(store: Store) -> None:
    await _held(store, "p", ["a", "b", "c"], "w1")
    stale, stale_token = _parking("p", "a", seen=7)  # the version read moved on
    fresh, fresh_token = _parking("p", "b")
    writes = [stale, fresh, ItemWrite("p", "c", 1, "complete", 0, 1)]
    assert await store.items_apply(writes, "w1") == [False, True, True]
    assert not await _completes(store, stale_token), "a refused write stores no wait"
    assert await _completes(store, fresh_token)


async def test_the_same_item_twice_in_a_batch_parks_once(store: Store) -> None:
    await _held(store, "p", ["a"], "w1")
    first, first_token = _parking("p", "a")
    second, second_token = _parking("p", "a")
    applied = await store.items_apply([first, second], "w1")
    assert sorted(applied) == [False, True]
    winner, loser = (first_token, second_token) if applied[0] else (second_token, first_token)
    assert not await _completes(store, loser), "only the applied write's token has a wait"
    assert await _completes(store, winner)


@pytest.mark.parametrize("owner", ["w2", ""])
async def test_parking_writes_without_the_lease_park_nothing(store: Store, owner: str) -> None:
    await _held(store, "p", ["a", "b"], "w1")
    parked = [_parking("p", item_id) for item_id in ("a", "b")]
    assert await store.items_apply([w for w, _ in parked], owner) == [False, False]
    assert await _counts(store, "p") == {"available": 2}
    for _, token in parked:
        assert not await _completes(store, token)
