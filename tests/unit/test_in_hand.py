"""The supervisor's ledger of items in hand: no item is dispatched twice, even by a
read that began before the item's result was written."""

from __future__ import annotations

import asyncio

from watcher.dispatch.in_hand import ItemsInHand
from watcher.records import ReadyItem


def _item(item_id: str, version: int = 1) -> ReadyItem:
    return ReadyItem(id=item_id, version=version, gate=0, data=b"", attempts=0)


async def _call() -> None:
    await asyncio.sleep(3600)


async def test_items_in_flight_are_excluded_and_counted() -> None:
    in_hand = ItemsInHand()
    call = asyncio.create_task(_call())
    try:
        in_hand.started([_item("a")], call)
        assert len(in_hand) == 1 and in_hand.ids() == {"a"}
        assert in_hand.calls() == [call]
        in_hand.results_queued([_item("a")])
        assert len(in_hand) == 1, "in hand until written"
        assert in_hand.calls() == [], "the call has ended"
        read = in_hand.begin_read()
        fresh = in_hand.end_read(read, [_item("a"), _item("b")], wanted=4, now=10.0)
        assert fresh == [_item("b")]
    finally:
        call.cancel()


async def test_an_item_let_go_during_a_read_is_not_taken_from_that_read() -> None:
    """The read began before the result was written, so it may return the old row."""
    in_hand = ItemsInHand()
    call = asyncio.create_task(_call())
    in_hand.started([_item("a")], call)
    in_hand.results_queued([_item("a")])
    call.cancel()
    read = in_hand.begin_read()
    in_hand.let_go([_item("a", version=3)])  # written while the read runs
    assert len(in_hand) == 0 and in_hand.ids() == {"a"}
    assert in_hand.end_read(read, [_item("a", version=3)], wanted=4, now=1.0) == []
    # The next read began after the write: it sees the new row, which is new work.
    read = in_hand.begin_read()
    assert in_hand.ids() == {"a"}, "still excluded until a later read has ended"
    assert in_hand.end_read(read, [_item("a", version=4)], wanted=4, now=2.0) == [
        _item("a", version=4)]
    assert in_hand.ids() == set(), "forgotten once a read that began after it has ended"


def test_an_item_let_go_before_a_read_began_is_forgotten_after_it() -> None:
    in_hand = ItemsInHand()
    in_hand.let_go([_item("a", version=3)])
    read = in_hand.begin_read()
    assert in_hand.end_read(read, [], wanted=4, now=1.0) == []
    assert in_hand.ids() == set()


def test_a_read_records_whether_the_gate_looked_empty_and_when() -> None:
    in_hand = ItemsInHand()
    read = in_hand.begin_read()
    assert in_hand.end_read(read, [_item("a"), _item("b"), _item("c")], wanted=2,
                            now=5.0) == [_item("a"), _item("b")]
    assert not in_hand.gate_looked_empty and in_hand.last_read == 5.0
    read = in_hand.begin_read()
    in_hand.end_read(read, [_item("c")], wanted=2, now=6.0)
    assert in_hand.gate_looked_empty and in_hand.last_read == 6.0


async def test_a_batch_is_one_call_for_its_items_until_each_result_is_queued() -> None:
    in_hand = ItemsInHand()
    call = asyncio.create_task(_call())
    batch = [_item("a"), _item("b"), _item("c")]
    try:
        in_hand.started(batch, call)
        assert len(in_hand) == 3 and in_hand.calls() == [call], "one task for the batch"
        in_hand.results_queued(batch[:1])
        assert in_hand.calling(batch) == batch[1:]
        assert in_hand.calls() == [call], "its other calls still run"
        in_hand.results_queued(batch[1:])
        assert in_hand.calling(batch) == [] and in_hand.calls() == []
        in_hand.let_go(batch)
        assert len(in_hand) == 0 and in_hand.ids() == {"a", "b", "c"}
    finally:
        call.cancel()


def test_rows_read_ahead_start_in_order_and_only_while_fresh_and_at_their_gate() -> None:
    in_hand = ItemsInHand()
    read = in_hand.begin_read()
    fresh = in_hand.end_read(read, [_item(name) for name in "abcde"], wanted=8, now=10.0)
    assert in_hand.gate_looked_empty, "5 rows for 8 wanted: nothing more is ready"
    in_hand.hold_ahead(fresh[2:], gate=0)
    assert in_hand.ahead_usable(0, now=10.5, max_age=1.0)
    assert not in_hand.ahead_usable(0, now=11.0, max_age=1.0), "older than a poll"
    assert not in_hand.ahead_usable(1, now=10.5, max_age=1.0), "the gate moved since"
    assert [item.id for item in in_hand.take_ahead(2)] == ["c", "d"]
    assert [item.id for item in in_hand.ahead] == ["e"]
    assert in_hand.drop_ahead() == 1 and in_hand.ahead == []
    assert not in_hand.ahead_usable(0, now=10.5, max_age=1.0), "nothing held"
    assert in_hand.drop_ahead() == 0


def test_spawned_rows_are_held_beside_those_read_and_only_when_no_read_ran() -> None:
    """Items an answer spawned at the gate are held as if read: after the rows read
    ahead, never when a read ran or began since their write was queued (it may have
    seen them committed and dispatched them), never twice, never at another gate; with
    nothing held, they are fresh from the moment their write was done."""
    in_hand = ItemsInHand()
    in_hand.reading = True
    assert in_hand.read_mark() is None
    assert not in_hand.add_ahead([_item("s1")], gate=0, now=5.0, mark=None), "a read ran"
    in_hand.reading = False
    mark = in_hand.read_mark()
    assert in_hand.add_ahead([_item("s1")], gate=0, now=5.0, mark=mark)
    assert in_hand.ahead_usable(0, now=5.9, max_age=1.0), "fresh from its write"
    assert not in_hand.add_ahead([_item("s2")], gate=1, now=5.5, mark=mark), "another gate"
    assert not in_hand.add_ahead([_item("s1")], gate=0, now=5.5, mark=mark), "held already"
    assert in_hand.add_ahead([_item("s2")], gate=0, now=5.5, mark=mark)
    assert not in_hand.ahead_usable(0, now=6.1, max_age=1.0), "the oldest decides"
    assert [item.id for item in in_hand.take_ahead(5)] == ["s1", "s2"]

    # A read began after the write was queued and ended before its answer came back:
    # it may have returned the spawned rows, so they are not held again.
    read = in_hand.begin_read()
    fresh = in_hand.end_read(read, [_item(name) for name in "ab"], wanted=2, now=10.0)
    assert not in_hand.add_ahead([_item("s3")], gate=0, now=10.5, mark=mark)
    in_hand.started(fresh[:1], None)  # type: ignore[arg-type]
    later = in_hand.read_mark()
    assert not in_hand.add_ahead([_item("a")], gate=0, now=10.5, mark=later), "in flight"
    in_hand.hold_ahead(fresh[1:], gate=0)
    assert in_hand.add_ahead([_item("s3")], gate=0, now=12.0, mark=later)
    assert [item.id for item in in_hand.ahead] == ["b", "s3"]
    assert not in_hand.ahead_usable(0, now=11.0, max_age=1.0), "held since the read"
