"""Pure balancing decisions: which free partitions a watcher takes, how many while its
slots' backlog is full, and whom it steals from toward a fair share. Plain values in,
plain values out; :mod:`watcher.leasing.keeper` does the I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from watcher.records import LeaseStats, PartitionSettings

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BalancePlan:
    """How many free partitions to take, and whom to steal from (and how many)."""

    target: int
    take_free: int = 0
    steal_from: str | None = None
    steal: int = 0


def fair_share(active: int, live_owners: int) -> int:
    """ceil(active partitions / live owners); 0 when nothing is active."""
    return math.ceil(active / live_owners) if active and live_owners else 0


def pick_free(candidates: Sequence[T], count: int) -> list[T]:
    """Which ``count`` of the free ``candidates`` (in lease-queue order) to take: the
    first ``count``, in order, so the lease queue is first come, first served for a
    fresh processor's first batch as for every later one. Processors that scan at the
    same moment contend for the same rows; the losers pass over the rows locked
    (``SKIP LOCKED``) or lost, and take the next ones (:meth:`LeaseKeeper.run_once`).
    """
    if count <= 0:
        return []
    return list(candidates[:count])


@dataclass(frozen=True, slots=True)
class Backlog:
    """The partitions a watcher holds that wait for a turn at its slots: how many, the
    lease-queue place of the last of them (``None`` while none waits), and the
    concurrency keys of every partition it holds."""

    waiting: int = 0
    last_order: float | None = None
    held_keys: frozenset[str] = frozenset()


# A watcher takes free partitions while fewer than this many lease batches of the
# partitions it holds wait for a turn at its slots: enough that freed slots always find
# a partition to start, few enough that the rest stay free for other processors, and
# that its lease reads do not walk past a thousand partitions it cannot run yet.
BACKLOG_BATCHES = 2


def backlog_room(backlog: Backlog, lease_batch: int) -> int:
    """How many free partitions a watcher with ``backlog`` may take in one cycle: up to
    ``BACKLOG_BATCHES`` lease batches waiting for slots, less those waiting now."""
    return max(0, BACKLOG_BATCHES * lease_batch - backlog.waiting)


def goes_ahead(settings: PartitionSettings, backlog: Backlog) -> bool:
    """Whether a free partition would get a turn at a watcher's slots before the last
    partition of its ``backlog``: a better place in the lease queue (a higher priority,
    or waiting a turn step longer), or a concurrency key none of its partitions has
    (keys holding no slots go first, :class:`watcher.flow.slots.SlotPool`). Such a partition
    is taken even when the backlog is full, so priority and tenant fairness hold
    across the free partitions as they do across the held ones."""
    if settings.key and settings.key not in backlog.held_keys:
        return True
    return backlog.last_order is not None and settings.queue_order < backlog.last_order


def plan_balance(me: str, stats: LeaseStats, free: int, *, max_take: int,
                 max_steal: int) -> BalancePlan:
    """Decide how ``me`` moves toward its fair share.

    ``stats`` counts active partitions and each live owner's leases; ``me``
    counts as live even before it holds anything. ``free`` is how many free
    (unleased or expired) partitions were seen. A watcher below target takes
    free partitions first; only when none are free does it steal, from the
    most-loaded owner, and only from one above target. When more partitions are
    free than the count went to (``stats.free_at_cap``), the share is not known
    and no owner is above it: ``me`` may take a whole ``max_take``.
    """
    owners = dict(stats.owners)
    owners.setdefault(me, 0)
    target = fair_share(stats.active, len(owners))
    if stats.free_at_cap:
        target = max(target, owners[me] + max_take)
    need = target - owners[me]
    if need <= 0:
        return BalancePlan(target)
    if free > 0:
        return BalancePlan(target, take_free=min(need, free, max_take))
    others = [(count, owner) for owner, count in owners.items() if owner != me]
    if not others:
        return BalancePlan(target)
    # Most loaded first; ties broken by name so every watcher picks the same victim.
    count, victim = min(others, key=lambda pair: (-pair[0], pair[1]))
    if count <= target:
        return BalancePlan(target)
    return BalancePlan(target, steal_from=victim, steal=min(need, count - target, max_steal))


def with_askers(stats: LeaseStats, askers: Sequence[str]) -> LeaseStats:
    """``stats`` with each processor asking for a hand-over (``askers``) counted as a live
    owner, holding nothing yet when it holds no lease: every processor's fair share
    then makes room for it."""
    owners = dict(stats.owners)
    for asker in askers:
        owners.setdefault(asker, 0)
    return LeaseStats(stats.active, owners, stats.free_at_cap)


def hand_over_count(me: str, stats: LeaseStats, askers: Sequence[str], *, handing: int,
                    max_steal: int) -> int:
    """How many of its partitions ``me`` hands over now to the processors asking for work.

    With the askers counted as live owners (:func:`with_askers`), every owner above the
    fair share hands over what it holds above it, up to ``max_steal`` a cycle, all at
    once rather than the most loaded first: an owner's count falls only once its
    releases land. The excess above a share that rounds up never passes what the owners
    below it lack, so no owner ends below its share. Nothing while a partition is free
    (the askers take those) or nobody else asks. ``handing`` partitions of ``me`` are
    on their way already: they count as gone.
    """
    others = set(askers) - {me}
    free = stats.active - sum(stats.owners.values())
    if not others or free > 0 or stats.free_at_cap:
        return 0
    owners = with_askers(stats, sorted(others)).owners
    held = max(0, owners.get(me, 0) - handing)
    return max(0, min(max_steal, held - fair_share(stats.active, len(owners))))
