"""Partitions and a client's writes, one suite run on every live database.

What a client writes (a partition with its items, more items later) lands whole
or not at all; refusals name what is wrong and leave nothing behind; the reads
an operator pages through are stable and exact (ids compare case and all).
"""

from __future__ import annotations

import pytest

from watcher.errors import (
    DuplicateItemError,
    GateError,
    PartitionExistsError,
    PartitionNotFoundError,
)
from watcher.models import AVAILABLE, COMPLETE
from watcher.records import ItemWrite, NewItem, PartitionSettings
from watcher.store import Store


async def test_a_created_partition_starts_free_at_its_lowest_gate(store: Store) -> None:
    await store.partition_create("p", [NewItem("a", b"1", gate=2), NewItem("b", b"2", gate=1)],
                                 PartitionSettings(reduce_gates=frozenset({3}),
                                                   continue_on_failure=True))
    info = await store.partition_get("p")
    assert info is not None
    assert (info.status, info.gate, info.owner, info.version) == (AVAILABLE, 1, "", 1)
    assert info.counts == {AVAILABLE: 2}
    assert (info.reduce_gates, info.on_item_failure) == ((3,), "continue")
    assert [(i.id, i.gate, i.data, i.version, i.parent) for i in await store.items_list("p")] == [
        ("a", 2, b"1", 1, None), ("b", 1, b"2", 1, None)]
    assert [row.id for row in await store.leases_read_free(5)] == ["p"]


async def test_a_second_create_with_the_same_id_is_refused_and_changes_nothing(
        store: Store) -> None:
    await store.partition_create("p", [NewItem("a", b"1")])
    with pytest.raises(PartitionExistsError):
        await store.partition_create("p", [NewItem("b", b"2")])
    assert [item.id for item in await store.items_list("p")] == ["a"]


async def test_ids_compare_exactly_on_every_database(store: Store) -> None:
    await store.partition_create("Job", [NewItem("Resume-1", b"1"), NewItem("resume-1", b"2")])
    await store.partition_create("job", [NewItem("x", b"3")])
    assert sorted(item.id for item in await store.items_list("Job")) == ["Resume-1", "resume-1"]
    assert [item.id for item in await store.items_list("job")] == ["x"]


async def test_added_items_land_whole_and_reopen_a_complete_partition(store: Store) -> None:
    await store.partition_create("p", [NewItem("a", b"1")])
    (lease,) = await store.leases_take(await store.leases_read_free(5), "me", 30.0)
    (item,) = await store.items_ready("p", 0, 10)
    assert await store.items_apply(
        [ItemWrite("p", "a", item.version, COMPLETE, 0, attempts=1)], "me") == [True]
    assert await store.partition_transition("p", lease.version, "me",
                                            status=COMPLETE) is not None
    assert (await store.partition_get("p")).status == COMPLETE

    assert await store.items_add("p", [NewItem("b", b"2"), NewItem("c", b"3", gate=4)]) is True
    info = await store.partition_get("p")
    assert info.status == AVAILABLE and info.counts == {COMPLETE: 1, AVAILABLE: 2}
    assert await store.items_add("p", [NewItem("d", b"4")]) is False, "already open"


async def test_a_refused_add_writes_none_of_its_items(store: Store) -> None:
    await store.partition_create("p", [NewItem("a", b"1", gate=2)])
    with pytest.raises(GateError, match="gate 2"):
        await store.items_add("p", [NewItem("b", b"2", gate=3), NewItem("c", b"3", gate=1)])
    with pytest.raises(DuplicateItemError) as caught:
        await store.items_add("p", [NewItem("d", b"4", gate=2), NewItem("a", b"5", gate=2)])
    assert "a" in str(caught.value)
    with pytest.raises(PartitionNotFoundError):
        await store.items_add("nowhere", [NewItem("e", b"6")])
    assert [item.id for item in await store.items_list("p")] == ["a"]
    assert (await store.partition_get("p")).version == 1, "the partition row is untouched"


async def test_partition_pages_are_stable_newest_first_and_exact_on_prefix(
        store: Store) -> None:
    for name in ("job-1", "job-2", "Job-3", "other", "job-4"):
        await store.partition_create(name, [NewItem("i", b"x")])
    seen: list[str] = []
    after = None
    while True:
        page = await store.partitions_page(limit=2, after=after)
        seen += [info.id for info in page]
        if page.next_cursor is None:
            break
        after = page.next_cursor
    assert sorted(seen) == ["Job-3", "job-1", "job-2", "job-4", "other"]
    assert len(seen) == 5, "no page repeats or skips a partition"
    prefixed = await store.partitions_page(prefix="job-", limit=10)
    assert sorted(info.id for info in prefixed) == ["job-1", "job-2", "job-4"]
    bare = await store.partitions_page(prefix="job-", limit=10, with_counts=False)
    assert all(info.counts == {} for info in bare)


async def test_item_pages_walk_ids_in_order_with_filters(store: Store) -> None:
    await store.partition_create("p", [NewItem(f"i{n:02}", bytes([n]), gate=n % 3)
                                       for n in range(12)])
    ids: list[str] = []
    after = None
    while True:
        page = await store.items_page("p", after=after, limit=5)
        ids += [item.id for item in page]
        if page.next_cursor is None:
            break
        after = page.next_cursor
    assert ids == [f"i{n:02}" for n in range(12)]
    at_gate_1 = await store.items_page("p", gate=1, status=AVAILABLE, limit=100)
    assert [item.id for item in at_gate_1] == ["i01", "i04", "i07", "i10"]
    assert all(item.data == b"" for item in
               (await store.items_page("p", limit=3, with_data=False)))
    with pytest.raises(PartitionNotFoundError):
        await store.items_page("nowhere")


async def test_gate_counts_per_partition_gate_and_status(store: Store) -> None:
    await store.partition_create("p", [NewItem("a", b"1"), NewItem("b", b"2", gate=1)])
    await store.partition_create("q", [NewItem("c", b"3", gate=2)])
    counts = await store.items_gate_counts(["p", "q", "absent"])
    assert counts["p"] == {0: {AVAILABLE: 1}, 1: {AVAILABLE: 1}}
    assert counts["q"] == {2: {AVAILABLE: 1}}
    assert counts.get("absent", {}) == {}
