"""A partition's close sent with its last results (watcher.leasing.closing): when it is
asked for, what it counts in the timeline, which leases it may be tried on, and what
the lease records after it. The write itself runs against every database in
tests/integration/test_close_when_done.py."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any
from unittest.mock import ANY

import pytest

from watcher.config import WatcherConfig
from watcher.dispatch.context import PartitionContext
from watcher.dispatch.gate_moves import GateMover
from watcher.dispatch.in_hand import ItemsInHand
from watcher.dispatch.writer import ResultWriter
from watcher.leasing.closing import close_request, write_with_closes
from watcher.leasing.lease import Lease
from watcher.models import Status
from watcher.records import ItemWrite, PartitionClose, PartitionSettings, ReadyItem
from watcher.rules.timeline import decode_timeline

NOW = datetime(2026, 12, 7, 3, 0)  # naive UTC, as the store clock reads


def _lease(**settings: Any) -> Lease:
    lease = Lease("p", version=4, gate=0, settings=PartitionSettings(**settings))
    lease.timeline_read(None)
    return lease


def _done(item_id: str, *, status: str = Status.COMPLETE.value, gate: int | None = None,
          spawn: tuple[Any, ...] = ()) -> ItemWrite:
    return ItemWrite("p", item_id, 1, status, gate, 1, spawn=spawn)


def test_a_close_counts_every_result_queued_in_its_timeline() -> None:
    lease = _lease()
    lease.done.add(3, at=100.0)  # written before
    request = close_request(lease, [_done("a"), _done("b")], unwritten=5, now=NOW, at=101.0)
    assert request is not None
    assert (request.gate, request.failures_allowed, request.closed) == (0, False, False)
    assert (request.progress.items, request.progress.age) == (8, 1.0)
    [span] = decode_timeline(request.timeline).gates
    assert (span.gate, span.items, span.ended) == (0, 8, NOW)


@pytest.mark.parametrize("why", ["moved on", "failed", "spawned", "retried", "quorum",
                                 "no clock", "timeline unread", "refused before",
                                 "handing over"])
def test_no_close_is_asked_for_when_the_gate_would_not_try_one_at_once(why: str) -> None:
    lease = _lease(quorum=((0, 1),)) if why == "quorum" else _lease()
    write = {"moved on": _done("a", status=Status.AVAILABLE.value, gate=1),
             "failed": _done("a", status=Status.FAILED.value),
             "spawned": _done("a", spawn=(object(),)),
             "retried": _done("a", status=Status.AVAILABLE.value)}.get(why, _done("a"))
    if why == "timeline unread":
        lease.timeline_known = False
    lease.close_refused = why == "refused before"
    lease.handing_over = why == "handing over"
    now = None if why == "no clock" else NOW
    assert close_request(lease, [write], unwritten=1, now=now, at=0.0) is None


async def test_only_results_in_hand_after_an_empty_read_make_the_last_write() -> None:
    in_hand = ItemsInHand()
    item = ReadyItem("a", 1, 0, b"", 0)
    read = in_hand.begin_read()
    in_hand.end_read(read, [item], wanted=4, now=1.0)  # fewer than asked: the gate is read
    assert in_hand.gate_looked_empty
    call = asyncio.create_task(asyncio.sleep(3600))
    in_hand.started([item], call)
    assert not in_hand.only_results(), "its call still runs"
    call.cancel()
    in_hand.results_queued([item])
    assert in_hand.only_results()
    in_hand.hold_ahead([ReadyItem("b", 1, 0, b"", 0)], gate=0)
    assert not in_hand.only_results(), "a row read ahead is still to run"


class _Store:
    """Answers every write applied, and each close as told; records what it was sent."""

    def __init__(self, went: bool) -> None:
        self.went = went
        self.sent: list[list[PartitionClose]] = []

    async def items_apply_closing(self, writes: list[ItemWrite], owner: str,
                                  closes: list[PartitionClose]) -> tuple[list[bool], list[bool]]:
        self.sent.append(list(closes))
        return [True] * len(writes), [self.went] * len(closes)


@pytest.mark.parametrize("went", [True, False])
async def test_a_close_that_went_moves_the_lease_on_and_one_refused_is_not_tried_again(
        went: bool) -> None:
    lease = _lease()
    request = close_request(lease, [_done("a")], unwritten=1, now=NOW, at=0.0)
    assert request is not None
    store = _Store(went)
    assert await write_with_closes(store, [_done("a")], "w", [request]) == [True]  # type: ignore[arg-type]
    [[close]] = store.sent
    assert (close.partition_id, close.version, close.gate) == ("p", 4, 0)
    assert request.closed is went
    assert lease.version == (5 if went else 4)
    assert lease.close_refused is not went
    assert not lease.lock.locked()


@pytest.mark.parametrize("why", ["lock held", "lost", "gate moved"])
async def test_a_close_is_not_sent_on_a_lease_busy_or_gone_and_the_writes_still_go(
        why: str) -> None:
    lease = _lease()
    request = close_request(lease, [_done("a")], unwritten=1, now=NOW, at=0.0)
    assert request is not None
    if why == "lock held":
        await lease.lock.acquire()
    lease.lost = why == "lost"
    if why == "gate moved":
        lease.wrote(5, gate=1)
    store = _Store(True)
    assert await write_with_closes(store, [_done("a")], "w", [request]) == [True]  # type: ignore[arg-type]
    assert store.sent == [[]] and not request.closed
    assert not lease.close_refused, "not tried: the drained gate tries its close itself"
    assert lease.lock.locked() is (why == "lock held")


async def test_the_lease_lock_is_let_go_when_the_write_fails() -> None:
    lease = _lease()
    request = close_request(lease, [_done("a")], unwritten=1, now=NOW, at=0.0)
    assert request is not None

    class Failing:
        async def items_apply_closing(self, *args: Any) -> Any:
            await asyncio.sleep(0)
            raise RuntimeError("the database is gone")

    with pytest.raises(RuntimeError):
        await write_with_closes(Failing(), [_done("a")], "w", [request])  # type: ignore[arg-type]
    assert not lease.lock.locked() and not request.closed and not lease.close_refused


async def test_one_close_at_a_time_waits_for_the_writers_answer() -> None:
    """A close sent with results blocks a second one until the writer answers the first
    (the second's results were read after it, so the first is refused or closes)."""
    lease = _lease()
    store = _Store(went=False)
    store.closes_with_writes = True  # type: ignore[attr-defined]
    store.time_to_record = lambda: NOW  # type: ignore[attr-defined]
    gates = GateMover(PartitionContext(lease, store, None, WatcherConfig(), None),  # type: ignore[arg-type]
                      reducer=None)  # type: ignore[arg-type]
    in_hand = ItemsInHand()
    in_hand.end_read(in_hand.begin_read(), [], wanted=4, now=1.0)  # the gate looked empty
    first = gates.close_with([_done("a")], in_hand)
    assert first is not None
    assert gates.close_with([_done("b")], in_hand) is None, "the first is not answered yet"
    writer = ResultWriter(store, "w", batch_size=10, buffer_items=10, buffer_bytes=1 << 20)  # type: ignore[arg-type]
    answered = asyncio.Event()
    writer.enqueue_many([_done("a")], lambda _: answered.set(), first)
    await asyncio.wait_for(answered.wait(), timeout=5)
    await writer.close(grace=1.0)
    assert first.answered and lease.close_refused and store.sent == [[ANY]]
    assert gates.close_with([_done("b")], in_hand) is None, "refused: not tried again"
