"""Rewind: which of a partition's items go back to a gate, which are removed, and what is
refused. Pure: no I/O; :mod:`watcher.store.operator.rewind` reads and writes.

A rewind moves a partition back to gate ``G``. The *chosen* items go back to ``G``
(available, attempts reset): every item at ``G`` or later, or only the failed ones
(``failed_only``), or only the ones named (``named``). The rest keep what they have.

An item spawned by a chosen item and standing at ``G`` or later is *removed*, with
every item it spawned in turn (at any gate): the chosen item runs again from ``G``
and spawns it again. (A step spawns at the partition's gate or later, so a child
below ``G`` was spawned before its parent reached ``G`` and is kept; a child spawned
before ``G`` for a gate at or after it cannot be told apart and is removed too.)
So is every item a reduce that runs again spawned (a reduce at ``G`` or later:
:func:`reduces_again`), with its descendants, whatever items are chosen: that reduce
runs again and spawns it afresh. Removal wins: a chosen item that a chosen item or
a reduce that runs again spawned is removed, not reset.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from watcher.models import FAILED

_SHOWN = 5


@dataclass(frozen=True, slots=True)
class ItemPlace:
    """Where an item stands: its id, gate, status, the item that spawned it (``None``:
    the client's, or a reduce's) and the gate of the reduce that spawned it (``None``:
    no reduce did, or it did before the column was recorded)."""

    id: str
    gate: int
    status: str
    parent: str | None = None
    spawned_by_reduce: int | None = None


@dataclass(frozen=True, slots=True)
class RewindChoice:
    """Which items a rewind to ``gate`` chooses: all at ``gate`` or later, only the
    failed ones (``failed_only``), only those ``named`` (``None``: not narrowed)."""

    gate: int
    failed_only: bool = False
    named: frozenset[str] | None = None

    def chooses(self, item: ItemPlace) -> bool:
        """Whether ``item`` goes back to the gate."""
        return (item.gate >= self.gate
                and (not self.failed_only or item.status == FAILED)
                and (self.named is None or item.id in self.named))


def partition_problem(partition_id: str, gate: int, *, current_gate: int) -> str | None:
    """Why a rewind of ``partition_id`` (at ``current_gate``) to ``gate`` means nothing, or
    ``None`` when it may go on."""
    if type(gate) is not int or gate < 0:
        return f"cannot rewind partition {partition_id!r} to gate {gate!r}: a gate is 0 or more"
    if gate > current_gate:
        return (f"cannot rewind partition {partition_id!r} to gate {gate}: it is at gate "
                f"{current_gate}, and a rewind only goes back (to gate {current_gate} or "
                "below)")
    return None


def named_problem(partition_id: str, choice: RewindChoice,
                  found: Mapping[str, ItemPlace]) -> str | None:
    """Why the items ``choice`` names (looked up as ``found``: id to place) cannot go back,
    or ``None``: one is not in the partition, stands before the gate, or is not failed
    while ``failed_only`` is asked."""
    named = sorted(choice.named or ())
    unknown = [item_id for item_id in named if item_id not in found]
    if unknown:
        return (f"cannot rewind partition {partition_id!r}: it has no {_ids(unknown)}; "
                "nothing was written")
    before = [found[item_id] for item_id in named if found[item_id].gate < choice.gate]
    if before:
        first = before[0]
        return (f"cannot rewind item {first.id!r} of partition {partition_id!r} to gate "
                f"{choice.gate}: it is at gate {first.gate}, before it (a rewind only "
                "moves items back)" + _more(before))
    if choice.failed_only:
        other = [found[item_id] for item_id in named if found[item_id].status != FAILED]
        if other:
            first = other[0]
            return (f"cannot rewind item {first.id!r} of partition {partition_id!r} with "
                    f"failed-only: it is {first.status}, not failed" + _more(other))
    return None


def nothing_problem(partition_id: str, choice: RewindChoice) -> str:
    """The refusal of a rewind that chooses no item."""
    what = "failed item" if choice.failed_only else "item"
    return (f"cannot rewind partition {partition_id!r} to gate {choice.gate}: it has no "
            f"{what} at gate {choice.gate} or later, so nothing would run again")


def removed_items(places: Iterable[ItemPlace], choice: RewindChoice,
                  reducing_again: Collection[int] = ()) -> set[str]:
    """The ids of the items a rewind removes, from ``places``: every item an item
    spawned (``parent`` set), every parent of one, and every item a reduce in
    ``reducing_again`` spawned.

    A spawned item at the gate or later whose parent is chosen is removed; so is an
    item that the reduce at a gate of ``reducing_again`` spawned (the reduce gates
    that run again: :func:`reduces_again`), whatever ``choice`` chooses; and so is
    every item below one of them in the spawn tree, at any gate.
    """
    places = list(places)
    by_id = {place.id: place for place in places}
    children: dict[str, list[str]] = defaultdict(list)
    for place in places:
        if place.parent is not None:
            children[place.parent].append(place.id)
    removed: set[str] = set()
    again = frozenset(reducing_again)
    stack = [place.id for place in places
             if place.parent is not None and place.gate >= choice.gate
             and place.parent in by_id and choice.chooses(by_id[place.parent])
             and place.parent != place.id]
    stack += [place.id for place in places
              if place.parent is None and place.spawned_by_reduce in again]
    while stack:
        item_id = stack.pop()
        if item_id in removed:
            continue
        removed.add(item_id)
        stack.extend(children.get(item_id, ()))
    return removed


def chosen_removed(places: Iterable[ItemPlace], removed: Collection[str],
                   choice: RewindChoice) -> list[str]:
    """The ids of the chosen items among ``removed`` (sorted): removal wins, so they
    are not sent back; what spawned them runs again and spawns them afresh. A
    rewind whose chosen items are all of this kind still runs something again."""
    return sorted(place.id for place in places
                  if place.id in removed and choice.chooses(place))


def reduces_again(reduce_gates: Collection[int], gate: int) -> list[int]:
    """The reduce gates that run again after a rewind to ``gate``: every one at it or after."""
    return sorted(reduce_gate for reduce_gate in reduce_gates if reduce_gate >= gate)


def rearmed_gates(reduce_gates: Collection[int], choice: RewindChoice, *,
                  current_gate: int) -> list[int]:
    """The reduce gates whose completed items go back to available there, so that a
    reduce runs again over its whole gate when only some items were chosen: those from
    the rewind's gate up to where the partition stood. None when every item at the gate
    or later is chosen (they all go back to the gate already)."""
    if not choice.failed_only and choice.named is None:
        return []
    return [reduce_gate for reduce_gate in reduces_again(reduce_gates, choice.gate)
            if reduce_gate <= current_gate]


def _ids(ids: Sequence[str]) -> str:
    shown = ", ".join(repr(one) for one in ids[:_SHOWN])
    more = f" and {len(ids) - _SHOWN} more" if len(ids) > _SHOWN else ""
    return f"item{'s' if len(ids) > 1 else ''} {shown}{more}"


def _more(items: Sequence[ItemPlace]) -> str:
    return f" ({len(items) - 1} more like it)" if len(items) > 1 else ""
