"""The pure parts of flow control: grants of a key's limit, token buckets, which free
partitions a lease scan takes, the order of turns at freed slots, priority ranks and a
partition's flow slots."""

from __future__ import annotations

import asyncio
import random
from datetime import datetime, timedelta

import pytest

from watcher.flow.key_pools import KeyPool
from watcher.flow.limits import FlowSlots
from watcher.flow.rates import TokenPool
from watcher.flow.slots import SlotPool
from watcher.models import FlowScope
from watcher.rules.balance import pick_free
from watcher.rules.buckets import BURST_SECONDS, claim, refill
from watcher.rules.fairness import FAIR_SPACING, started_at
from watcher.rules.grants import GrantDecision, OtherGrant, decide_grant
from watcher.rules.priority import AGING_STEP, priority_problem, rank_at, starvation_bound


@pytest.mark.parametrize(("limit", "wanted", "in_use", "others", "expected"), [
    # alone: what it wants, within the limit
    (4, 3, 0, [], GrantDecision(3, 3)),
    (4, 9, 0, [], GrantDecision(4, 4)),
    # what the others hold is not free
    (4, 4, 0, [OtherGrant(3, 3)], GrantDecision(1, 1)),
    (4, 4, 0, [OtherGrant(4, 4)], GrantDecision(0, 0)),
    # never below the calls in flight
    (4, 0, 2, [OtherGrant(2, 2)], GrantDecision(2, 2)),
    # another wants more than it holds: keep an even share, give the rest back
    (4, 4, 4, [OtherGrant(0, 4)], GrantDecision(4, 2)),
    (4, 4, 1, [OtherGrant(0, 4)], GrantDecision(2, 2)),
    (6, 6, 0, [OtherGrant(0, 6), OtherGrant(0, 6)], GrantDecision(2, 2)),
])
def test_decide_grant(limit: int, wanted: int, in_use: int, others: list[OtherGrant],
                      expected: GrantDecision) -> None:
    assert decide_grant(limit, wanted, in_use, others) == expected


def test_grants_decided_one_after_another_never_exceed_the_limit() -> None:
    """Three processors asking in turn, with calls starting and ending at random: the
    grants' sum (slots each holds) stays within the limit at every step."""
    rng = random.Random(7)
    limit = 5
    slots = [0, 0, 0]
    in_use = [0, 0, 0]
    wanted = [0, 0, 0]
    for _ in range(2000):
        me = rng.randrange(3)
        # calls within its grant (and the share it may use) start or end
        in_use[me] = rng.randint(0, slots[me])
        wanted[me] = rng.randint(0, limit + 2)
        others = [OtherGrant(slots[n], wanted[n]) for n in range(3) if n != me]
        decision = decide_grant(limit, min(wanted[me], limit), in_use[me], others)
        slots[me] = decision.slots
        assert sum(slots) <= limit, slots
        assert decision.target <= decision.slots


def test_a_key_pool_lets_nothing_by_until_its_limit_is_known_and_only_its_share() -> None:
    pool = KeyPool("k", asyncio.Event())
    assert pool.take(3, now=0.0) == 0 and pool.unmet == 3 and pool.wanted_grant.is_set()
    pool.granted_now(4, GrantDecision(slots=4, target=2), expires_at=10.0)
    assert pool.take(3, now=1.0) == 2
    assert pool.free(now=1.0) == 0
    pool.give_back(1)
    assert pool.free(now=1.0) == 1
    assert pool.free(now=10.0) == 0  # the grant lapsed: nothing more


def test_a_frozen_key_pool_starts_no_call_the_grant_being_written_may_not_cover() -> None:
    pool = KeyPool("k", asyncio.Event())
    pool.granted_now(4, GrantDecision(4, 4), expires_at=10.0)
    pool.take(1, now=0.0)
    assert pool.freeze() == 1
    assert pool.take(2, now=0.0) == 0
    pool.granted_now(4, GrantDecision(3, 3), expires_at=10.0)
    assert pool.take(5, now=0.0) == 2


@pytest.mark.parametrize(("tokens", "elapsed", "rate", "expected"), [
    (None, 0.0, 10.0, 10.0 * BURST_SECONDS),  # a new bucket starts full
    (0.0, 0.1, 10.0, 1.0),
    (0.0, 100.0, 10.0, 10.0 * BURST_SECONDS),  # capped at the burst
    (0.0, 100.0, 0.5, 1.0),  # a burst is at least one call
    (2.0, -5.0, 10.0, 2.0),  # a clock step back adds nothing
])
def test_refill(tokens: float | None, elapsed: float, rate: float, expected: float) -> None:
    assert refill(tokens, elapsed, rate) == pytest.approx(expected)


def test_claims_take_whole_calls() -> None:
    assert claim(2.7, 5) == 2
    assert claim(9.0, 5) == 5
    assert claim(0.4, 5) == 0


def test_tokens_lapse_and_a_hold_stops_every_call() -> None:
    demand = asyncio.Event()
    pool = TokenPool(FlowScope.HANDLER, "h", demand)
    pool.learned()  # its hold and rate were read
    pool.rate = 10.0
    pool.claimed(3, now=0.0)
    assert pool.take(5, now=0.1) == 3 and pool.unmet == 2 and demand.is_set()
    pool.claimed(3, now=1.0)
    assert pool.free(now=5.0) == 0  # unused tokens lapse
    assert pool.surrender() == 3 and pool.tokens == 0  # and go back to the bucket
    assert pool.surrender() == 0
    pool.rate = None
    pool.block(until=3.0)
    assert pool.take(1, now=2.0) == 0 and pool.held == 1
    assert pool.unblock_due(now=3.0) and pool.take(1, now=3.0) == 1


def test_a_pool_lets_no_call_by_until_its_hold_is_read() -> None:
    # A hold another processor stored before this one first looked is honoured from the
    # first call: the pool asks the loop to read it, and the read wakes the waiters.
    demand = asyncio.Event()
    pool = TokenPool(FlowScope.HANDLER, "h", demand)
    woken = asyncio.Event()
    assert pool.free(now=0.0) == 0 and pool.take(2, now=0.0) == 0 and demand.is_set()
    pool.notify_when_free(woken)
    pool.block(until=5.0)  # the hold read
    pool.learned()
    assert woken.is_set() and pool.known
    assert pool.take(1, now=1.0) == 0 and pool.held == 1
    assert pool.unblock_due(now=5.0) and pool.take(1, now=5.0) == 1


def test_flow_slots_take_what_every_gate_allows_and_return_the_rest() -> None:
    shared = SlotPool(8)
    key = KeyPool("k", asyncio.Event())
    key.granted_now(4, GrantDecision(2, 2), expires_at=100.0)
    tokens = TokenPool(FlowScope.KEY, "k", asyncio.Event())
    tokens.learned()  # its hold and rate were read
    tokens.rate = 5.0
    tokens.claimed(5, now=0.0)
    slots = FlowSlots(shared, [tokens, key], clock=lambda: 0.1)
    assert slots.take(6) == 2
    assert (shared.in_use, key.in_use, tokens.tokens) == (2, 2, 3)  # 3 tokens came back
    slots.give_back(2)
    assert (shared.in_use, key.in_use, tokens.tokens) == (0, 0, 3)  # tokens are spent


def test_pick_free_takes_the_head_of_the_queue_in_order() -> None:
    queue = list(range(64))
    assert pick_free(queue, 3) == [0, 1, 2]
    assert pick_free(queue, 1) == [0]
    assert pick_free([5, 4], 3) == [5, 4]
    assert pick_free(queue, 0) == [] and pick_free([], 3) == []


async def test_turns_at_freed_slots_go_by_queue_order_then_arrival() -> None:
    pool = SlotPool(4)
    pool.take(4)
    late, early, same_a, same_b = (asyncio.Event() for _ in range(4))
    pool.notify_when_free(late, order=30.0)
    pool.notify_when_free(same_a, order=10.0)
    pool.notify_when_free(early, order=5.0)
    pool.notify_when_free(same_b, order=10.0)
    woken = []
    for _ in range(4):
        pool.give_back(1)  # one free is a quarter: a turn each time
        event = next(e for e in (late, early, same_a, same_b) if e.is_set() and e not in woken)
        woken.append(event)
        event.clear()
        pool.take(1)
        pool.pass_turn()
    assert woken == [early, same_a, same_b, late]


def test_priority_ranks_and_the_stated_bound() -> None:
    start = datetime(2026, 11, 26, 12, 0)
    assert rank_at(start, 2) == start - 2 * AGING_STEP
    assert rank_at(start, -1) == start + AGING_STEP
    assert starvation_bound(-10, 10) == 20 * AGING_STEP
    assert starvation_bound(5, 1) == timedelta(0)
    assert priority_problem(10) is None and priority_problem(-10) is None
    for bad in (11, -11, 1.0, True, "1"):
        assert priority_problem(bad) is not None


def test_a_keys_clock_hands_out_the_start_before_it() -> None:
    moved = datetime(2026, 11, 26, 12, 0, 5)
    assert started_at(moved) == moved - FAIR_SPACING


@pytest.mark.parametrize(("limit", "processors"), [(4, 3), (4, 4), (5, 2), (8, 3)])
def test_every_processor_that_wants_a_share_gets_one(limit: int, processors: int) -> None:
    """Processors that always want the whole limit, refreshing in turn, with their calls
    ending between refreshes: each settles on a share, and none is left with nothing
    (a partition it holds would never run)."""
    slots = [0] * processors
    for _ in range(10):
        for me in range(processors):
            others = [OtherGrant(slots[n], limit) for n in range(processors) if n != me]
            decision = decide_grant(limit, limit, 0, others)  # its calls have ended
            slots[me] = decision.target
            assert sum(slots) <= limit
    assert all(share >= 1 for share in slots), slots


def test_turns_go_by_queue_place_in_steps_and_keep_priority_apart() -> None:
    from datetime import UTC

    from watcher.rules.priority import TURN_STEP_SECONDS, turn_order

    start = datetime(2026, 11, 26, 12, 0, 0, tzinfo=UTC)
    burst = {turn_order(start + timedelta(seconds=s)) for s in (0.0, 1.5, 9.9)}
    assert len(burst) == 1  # created together: one step, turns by waiting time
    assert turn_order(start + timedelta(seconds=TURN_STEP_SECONDS)) > burst.pop()
    assert turn_order(rank_at(start, 1)) < turn_order(start)  # a step of priority counts


def test_a_claim_asks_for_the_calls_made_and_refused_within_a_burst() -> None:
    pool = TokenPool(FlowScope.HANDLER, "h", asyncio.Event())
    pool.learned()  # its hold and rate were read
    pool.rate = 100.0  # one interval is 10 calls, a burst 50
    assert pool.want() == 0  # nothing waited or ran: no claim
    assert pool.take(30, now=0.0) == 0 and pool.want() == 30
    pool.claimed(30, now=0.0)
    assert pool.take(5, now=0.1) == 5 and pool.tokens == 25
    assert pool.surrender() == 25 and pool.want() == 10  # at least an interval's worth
    pool.claimed(10, now=0.1)
    assert pool.free(now=0.2) == 10
    assert pool.take(200, now=0.2) == 10 and pool.want() == 50  # never over a burst


def test_returned_tokens_refill_a_bucket_up_to_its_burst() -> None:
    assert refill(2.0, 0.1, 10.0, returned=2) == pytest.approx(5.0)
    assert refill(2.0, 0.1, 10.0, returned=50) == pytest.approx(10 * BURST_SECONDS)


def test_a_busy_keys_grant_asks_for_its_peak_and_an_idle_one_for_nothing() -> None:
    pool = KeyPool("k", asyncio.Event())
    pool.granted_now(16, GrantDecision(16, 16), expires_at=100.0)
    assert pool.take(16, now=0.0) == 16
    pool.give_back(12)  # a batch's results are being written: 4 calls in flight now
    assert pool.wanted(16) == 16  # not 4: the grant stays where the load keeps it
    pool.granted_now(16, GrantDecision(16, 16), expires_at=100.0)
    assert pool.wanted(16) == 4
    pool.give_back(4)
    pool.granted_now(16, GrantDecision(4, 4), expires_at=100.0)
    assert pool.wanted(16) == 0  # idle for a whole interval: nothing asked for
    assert pool.take(20, now=0.0) == 4 and pool.wanted(16) == 16  # demand comes back


def test_a_claim_gives_back_every_token_held_so_none_outlives_its_lifetime() -> None:
    """Held tokens carried into a claim would get a new lifetime while the bucket
    refilled as if they were spent; surrendered, they go back to the bucket, and the
    claim takes what the calls need afresh."""
    pool = TokenPool(FlowScope.HANDLER, "h", asyncio.Event())
    pool.learned()  # its hold and rate were read
    pool.rate = 100.0
    pool.claimed(30, now=0.0)
    assert pool.take(20, now=0.1) == 20
    assert pool.surrender() == 10 and pool.tokens == 0 and pool.free(now=0.1) == 0
    assert pool.want() == 20  # the 20 calls made since the claim, none held now
    assert pool.surrender() == 0
