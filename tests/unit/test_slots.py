"""The shared dispatch slots: partitions take turns at freed slots, one at a time."""

from __future__ import annotations

import asyncio

from watcher.flow.slots import ReadAheadPool, SlotPool


async def test_freed_slots_wake_the_longest_waiting_partition_only() -> None:
    pool = SlotPool(8)  # a turn comes once 2 slots are free
    assert pool.take(8) == 8
    waiting = [asyncio.Event() for _ in range(100)]
    for event in waiting:
        pool.notify_when_free(event)
    pool.give_back(1)
    assert not any(event.is_set() for event in waiting), "one free slot is not a turn"
    pool.give_back(1)
    assert [n for n, event in enumerate(waiting) if event.is_set()] == [0]


async def test_the_turn_passes_on_while_slots_stay_free() -> None:
    pool = SlotPool(8)
    pool.take(8)
    first, second, third = asyncio.Event(), asyncio.Event(), asyncio.Event()
    for event in (first, second, third):
        pool.notify_when_free(event)
    pool.give_back(4)
    assert first.is_set() and not second.is_set()
    first.clear()  # the first partition runs (a supervisor clears its event first)
    pool.take(1)  # it had one item ready; 3 slots stay free
    pool.pass_turn()
    assert second.is_set() and not third.is_set()
    second.clear()
    pool.take(3)
    pool.pass_turn()
    assert not third.is_set(), "nothing free: the third waits for the next refill"


async def test_an_idle_pool_wakes_a_waiter_whatever_its_size() -> None:
    pool = SlotPool(1)
    pool.take(1)
    event = asyncio.Event()
    pool.notify_when_free(event)
    pool.give_back(1)
    assert event.is_set()


async def test_a_partition_asking_twice_waits_once() -> None:
    pool = SlotPool(4)
    pool.take(4)
    event, other = asyncio.Event(), asyncio.Event()
    pool.notify_when_free(event)
    pool.notify_when_free(event)
    pool.notify_when_free(other)
    pool.give_back(4)
    assert event.is_set() and not other.is_set()
    event.clear()
    pool.pass_turn()
    assert other.is_set()


async def test_one_turn_at_a_time_until_the_woken_partition_runs() -> None:
    """Slots freed one by one after a turn was given wake nobody else: the partition
    woken first takes them all when it runs, and the others would only wake to find
    too few free."""
    pool = SlotPool(8)
    pool.take(8)
    waiting = [asyncio.Event() for _ in range(3)]
    for event in waiting:
        pool.notify_when_free(event)
    for _ in range(6):
        pool.give_back(1)
    assert [event.is_set() for event in waiting] == [True, False, False]
    waiting[0].clear()
    assert pool.take(8) == 6
    pool.pass_turn()
    assert not any(event.is_set() for event in waiting), "too few free for a turn"
    pool.give_back(2)
    assert waiting[1].is_set() and not waiting[2].is_set()


async def test_a_partition_leaving_with_the_turn_passes_it_on() -> None:
    pool = SlotPool(4)
    pool.take(4)
    gone, next_one = asyncio.Event(), asyncio.Event()
    pool.notify_when_free(gone)
    pool.notify_when_free(next_one)
    pool.give_back(1)
    assert gone.is_set() and not next_one.is_set()
    pool.leave(gone)  # its partition closed before it ran
    assert next_one.is_set()


async def test_a_partition_holding_rows_read_ahead_gets_the_next_turn_in_its_order() -> None:
    pool = SlotPool(4)
    pool.take(4)
    waited, ready, first_in_queue = asyncio.Event(), asyncio.Event(), asyncio.Event()
    pool.notify_when_free(first_in_queue, order=1.0)
    pool.notify_when_free(waited, order=5.0)
    pool.notify_when_free(ready, order=5.0, ready=True)
    woken = []
    for _ in range(3):
        pool.give_back(1)
        event = next(e for e in (waited, ready, first_in_queue)
                     if e.is_set() and e not in woken)
        woken.append(event)
        event.clear()
        pool.take(1)
        pool.pass_turn()
    assert woken == [first_in_queue, ready, waited], "order first, then rows in hand"


async def test_a_waiter_asking_again_as_ready_moves_up_and_asking_twice_wakes_once() -> None:
    pool = SlotPool(4)
    pool.take(4)
    other, mover = asyncio.Event(), asyncio.Event()
    pool.notify_when_free(other)
    pool.notify_when_free(mover)
    pool.notify_when_free(mover, ready=True)  # it read ahead while waiting
    pool.notify_when_free(mover)  # asking again without rows does not move it back
    pool.give_back(1)
    assert mover.is_set() and not other.is_set()
    mover.clear()
    pool.take(1)
    pool.give_back(1)
    assert other.is_set() and not mover.is_set(), "its older entry was dropped"


async def test_once_its_rows_have_started_a_partition_waits_at_the_back() -> None:
    """Partitions of one order still take turns: rows read ahead put a partition first
    only while it holds them."""
    pool = SlotPool(4)
    pool.take(4)
    big, small = asyncio.Event(), asyncio.Event()
    pool.notify_when_free(small)
    pool.notify_when_free(big, ready=True)
    pool.give_back(1)
    assert big.is_set() and not small.is_set()
    big.clear()
    pool.take(1)  # its last held row starts; it asks again, holding none
    pool.notify_when_free(big)
    pool.give_back(1)
    assert small.is_set() and not big.is_set(), "small waited longer"


def test_read_ahead_room_is_shared_and_bounded() -> None:
    room = ReadAheadPool(10)
    assert room.hold(6) == 6 and room.room == 4
    assert room.hold(6) == 4, "only what is left"
    assert room.hold(1) == 0 and room.room == 0
    room.give_back(7)
    assert room.room == 7 and room.held == 3


async def test_turns_go_first_to_a_key_holding_no_slots() -> None:
    """A tenant's partition leased behind another tenant's burst gets the next turn,
    although the burst's partitions rank ahead of it and waited longer."""
    pool = SlotPool(4)  # a turn comes with each freed slot
    assert pool.take(4, key="a") == 4
    burst = [asyncio.Event() for _ in range(10)]
    for event in burst:
        pool.notify_when_free(event, order=0.0, key="a")
    newcomer = asyncio.Event()
    pool.notify_when_free(newcomer, order=100.0, key="b")
    pool.give_back(1, key="a")
    assert newcomer.is_set() and not any(event.is_set() for event in burst)
    newcomer.clear()
    assert pool.take(1, key="b") == 1
    pool.pass_turn()
    pool.give_back(1, key="a")  # a holds 2, b holds 1: b has nobody waiting
    assert [n for n, event in enumerate(burst) if event.is_set()] == [0]


async def test_keys_that_all_hold_slots_take_turns_by_queue_place() -> None:
    """Only a key holding none goes first; keys that all hold some take turns as
    partitions of one key would (a busy fleet of keys keeps full reads)."""
    pool = SlotPool(4)
    pool.take(2, key="a")
    pool.take(2, key="b")
    late_a, early_b = asyncio.Event(), asyncio.Event()
    pool.notify_when_free(late_a, order=20.0, key="a")
    pool.notify_when_free(early_b, order=10.0, key="b")
    pool.give_back(1, key="a")  # a holds fewer, but some: b's partition ranks first
    assert early_b.is_set() and not late_a.is_set()
    assert pool.free_for("a") == 1  # and a's awake partitions are not held back
    early_b.clear()
    pool.take(1, key="b")
    pool.pass_turn()
    pool.give_back(1, key="a")
    assert late_a.is_set()


async def test_a_key_that_left_the_line_is_passed_over() -> None:
    pool = SlotPool(4)
    pool.take(4, key="a")
    gone, waiting = asyncio.Event(), asyncio.Event()
    pool.notify_when_free(gone, key="b")
    pool.notify_when_free(waiting, key="a")
    pool.leave(gone)
    pool.give_back(1, key="a")
    assert waiting.is_set() and not gone.is_set()
    assert pool.in_use == 3


async def test_a_key_that_just_had_the_slots_waits_while_another_keys_partition_does() -> None:
    """A batch's results written together free every slot its key held: the key then
    holds as few as the waiting one, but took last, so the waiting key goes first, and
    the busy key's awake partition may take nothing until that partition has run."""
    pool = SlotPool(4)
    assert pool.take(4, key="a") == 4
    waiting = asyncio.Event()
    pool.notify_when_free(waiting, key="k")
    pool.give_back(4, key="a")
    assert waiting.is_set()
    assert pool.free_for("a") == 0 and pool.take(4, key="a") == 0
    waiting.clear()  # its supervisor runs
    assert pool.take(4, key="k") == 4
    pool.give_back(4, key="k")  # k has nobody else waiting: a takes freely again
    assert pool.free_for("a") == 4


def test_standing_is_the_slots_held_then_the_latest_take() -> None:
    pool = SlotPool(8)
    assert pool.standing("new") == (0, -1)
    pool.take(2, key="a")
    pool.take(2, key="b")
    assert pool.standing("a") < pool.standing("b")  # equal slots, a took first
    pool.give_back(1, key="b")
    assert pool.standing("b") < pool.standing("a")


async def test_the_backlog_counts_partitions_waiting_and_the_last_ones_place() -> None:
    pool = SlotPool(4)
    assert (pool.waiting, pool.last_waiting_order()) == (0, None)
    pool.take(4)
    early, late, other_key = asyncio.Event(), asyncio.Event(), asyncio.Event()
    pool.notify_when_free(early, 10.0)
    pool.notify_when_free(late, 30.0)
    pool.notify_when_free(other_key, 20.0, key="b")
    pool.notify_when_free(early, 10.0, ready=True)  # asking again: still one partition
    assert (pool.waiting, pool.last_waiting_order()) == (3, 30.0)
    pool.leave(late)
    assert (pool.waiting, pool.last_waiting_order()) == (2, 20.0), "one that left is not counted"
    pool.give_back(4)  # turns go out: the woken partitions wait no more
    assert pool.waiting < 2
