"""Shrinking: delta debugging (ddmin) over a failing plan's partitions, then its actions,
then the items of what is left, keeping every choice the seed made for what stays.

A run is not deterministic (processes race), so a candidate counts as failing when one
run of it fails; the budget bounds the runs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from tests.proof.plan import Plan

T = TypeVar("T")
Fails = Callable[[Plan], Awaitable[bool]]


async def ddmin(units: Sequence[T], fails: Callable[[list[T]], Awaitable[bool]],
                budget: list[int]) -> list[T]:
    """The classic ddmin: a smaller list of ``units`` for which ``fails`` still holds
    (``budget[0]`` runs at most, counted down)."""
    current = list(units)
    chunks = 2
    while len(current) >= 2 and budget[0] > 0:
        size = max(1, len(current) // chunks)
        parts = [current[i:i + size] for i in range(0, len(current), size)]
        reduced = False
        for n in range(len(parts)):
            if budget[0] <= 0:
                break
            rest = [unit for m, part in enumerate(parts) if m != n for unit in part]
            budget[0] -= 1
            if await fails(rest):
                current, chunks, reduced = rest, max(chunks - 1, 2), True
                break
        if not reduced:
            if chunks >= len(current):
                break
            chunks = min(len(current), chunks * 2)
    return current


async def shrink(plan: Plan, fails: Fails, *, budget: int = 40) -> Plan:
    """A smaller plan that still fails: fewer partitions, then fewer actions, then fewer
    items per partition."""
    left = [budget]

    async def without_partitions(kept: list[str]) -> bool:
        return await fails(plan.without(
            partitions=frozenset(p.id for p in plan.partitions if p.id not in kept)))

    kept_ids = await ddmin([p.id for p in plan.partitions], without_partitions, left)
    plan = plan.without(partitions=frozenset(p.id for p in plan.partitions
                                             if p.id not in kept_ids))

    async def with_actions(kept: list[int]) -> bool:
        return await fails(plan.without(
            actions=frozenset(n for n in range(len(plan.actions)) if n not in kept)))

    kept_actions = await ddmin(list(range(len(plan.actions))), with_actions, left)
    plan = plan.without(actions=frozenset(n for n in range(len(plan.actions))
                                          if n not in kept_actions))
    for index, partition in enumerate(plan.partitions):
        if left[0] <= 0:
            break

        async def with_items(kept: list[int], index: int = index, base: Plan = plan) -> bool:
            chosen = base.partitions[index]
            smaller = replace(chosen, items=tuple(chosen.items[n] for n in kept))
            return await fails(replace(base, partitions=(
                *base.partitions[:index], smaller, *base.partitions[index + 1:])))

        kept_items = await ddmin(list(range(len(partition.items))), with_items, left)
        smaller = replace(partition, items=tuple(partition.items[n] for n in kept_items))
        plan = replace(plan, partitions=(*plan.partitions[:index], smaller,
                                         *plan.partitions[index + 1:]))
    return plan
