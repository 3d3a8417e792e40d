"""Checking the items an answer spawns, before anything is written. Pure: no I/O.

A step's answer (or a reduce's) may carry new items of its partition
(:attr:`watcher.protocol.Result.spawn`). They are inserted in the transaction
that writes the answer, and only if that write is applied, so a spawn is
exactly once: an answer that never landed spawned nothing, and one that
landed is never run again. What can be told from the answer alone is
checked here, so a bad spawn fails its item with a message that says what
to fix and nothing of it is written: ids that break the id rules or repeat
within the answer, data that is not bytes or is over the item size limit, a
gate below where the partition stands, and more items than one answer may
carry. Ids that already exist in the partition are found by the store, in
the write's transaction (:class:`SpawnConflictError`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from watcher.config import DEFAULT_MAX_ITEM_BYTES, DEFAULT_MAX_SPAWN, WatcherConfig
from watcher.errors import ValueRefusedError, pad_space_rule
from watcher.models import MAX_GATE
from watcher.records import NewItem
from watcher.rules.delays import DelayError, checked_time
from watcher.rules.ids import id_problem

_SHOWN_IDS = 5


@dataclass(frozen=True, slots=True)
class SpawnLimits:
    """What one answer may spawn: at most ``max_spawn`` items, each at most
    ``max_item_bytes`` bytes of data."""

    max_spawn: int = DEFAULT_MAX_SPAWN
    max_item_bytes: int = DEFAULT_MAX_ITEM_BYTES


    @classmethod
    def of(cls, config: WatcherConfig) -> SpawnLimits:
        """What one answer may spawn under ``config``."""
        return cls(config.max_spawn, config.max_item_bytes)


DEFAULT_SPAWN_LIMITS = SpawnLimits()


class SpawnConflictError(ValueRefusedError):
    """Items an answer spawns have ids the partition already holds.

    Writing the answer again cannot help, so the item that spawned them fails
    (it is not retried) with this message, and nothing of the answer is
    written. ``ids`` are the ids at fault.
    """

    def __init__(self, partition_id: str, parent: str | None, ids: Sequence[str]) -> None:
        self.partition_id = partition_id
        self.parent = parent
        self.ids = list(ids)
        who = f"item {parent!r}" if parent is not None else "the reduce"
        super().__init__(
            f"{who} of partition {partition_id!r} spawned {_ids(self.ids)} that the partition "
            "already holds; nothing of the answer was written and it is not retried: give "
            "each spawned item an id of its own (for example the parent's id and a "
            f"position, which stays the same when the step runs again){pad_space_rule(self.ids)}")



def spawn_problem(spawn: object, *, floor: int, limits: SpawnLimits) -> str | None:
    """Why the ``spawn`` of an answer cannot be written, or ``None`` when it can.

    ``floor`` is the lowest gate a spawned item may have: the partition's
    gate for a step's answer, the gate after the reduce gate for a reduce's.
    Gates of ``None`` are checked as ``floor`` (see :func:`resolve_spawn`).
    So no spawned item lands below where the partition stands, or on a reduce
    gate it has reached (a reduce sees a fixed set of items): steps never run
    at a reduce gate, and a reduce's floor is past its own.
    """
    if isinstance(spawn, str | bytes | bytearray | NewItem) or not isinstance(spawn, Sequence):
        return (f"spawn must be a list of NewItem, got {type(spawn).__name__}")
    if len(spawn) > limits.max_spawn:
        return (f"the answer spawns {len(spawn)} items, over the limit of {limits.max_spawn} "
                "per answer (--max-spawn); page the fan-out: spawn up to that many, and "
                "answer at the same gate, not done, with your cursor in the item's data, "
                "so the step runs again for the next page")
    for position, child in enumerate(spawn):
        problem = _child_problem(position, child, floor, limits)
        if problem is not None:
            return problem
    repeated = sorted(item_id for item_id, count in Counter(c.id for c in spawn).items()
                      if count > 1)
    if repeated:
        return (f"the answer spawns {_ids(repeated)} more than once; each spawned item "
                "needs an id of its own")
    return None


def resolve_spawn(spawn: Sequence[NewItem], default_gate: int) -> tuple[NewItem, ...]:
    """``spawn`` with each gate of ``None`` set to ``default_gate`` and data as bytes
    (call :func:`spawn_problem` first)."""
    return tuple(NewItem(child.id, bytes(child.data),
                         default_gate if child.gate is None else child.gate, child.not_before)
                 for child in spawn)


def _child_problem(position: int, child: object, floor: int,
                   limits: SpawnLimits) -> str | None:
    if not isinstance(child, NewItem):
        return (f"spawn[{position}] is a {type(child).__name__}; spawn NewItem(id, data: "
                "bytes, gate=None)")
    problem = id_problem("item", child.id)
    if problem is not None:
        return f"spawn[{position}]: {problem}"
    if not isinstance(child.data, bytes | bytearray | memoryview):
        hint = " (encode text first, e.g. text.encode())" if isinstance(child.data, str) else ""
        return (f"spawned item {child.id!r}: data must be bytes, got "
                f"{type(child.data).__name__}{hint}")
    size = len(child.data) if not isinstance(child.data, memoryview) else child.data.nbytes
    if size > limits.max_item_bytes:
        return (f"spawned item {child.id!r} is {size} bytes, over the item size limit of "
                f"{limits.max_item_bytes} bytes (max_item_bytes): store large content "
                "elsewhere and put a reference in the item")
    gate = floor if child.gate is None else child.gate
    if type(gate) is not int or not 0 <= gate <= MAX_GATE:
        return (f"spawned item {child.id!r}: gate must be a whole number from 0 to "
                f"{MAX_GATE} (or None for the default), got {child.gate!r}")
    if gate < floor:
        return (f"spawned item {child.id!r} has gate {gate}, below gate {floor}, the lowest "
                "it may have here: spawn at the current gate or later")
    if child.not_before is not None:
        try:
            checked_time(child.not_before, "not_before")
        except DelayError as error:
            return f"spawned item {child.id!r}: {error}"
    return None


def _ids(ids: Sequence[str]) -> str:
    shown = ", ".join(repr(one) for one in ids[:_SHOWN_IDS])
    more = f" and {len(ids) - _SHOWN_IDS} more" if len(ids) > _SHOWN_IDS else ""
    noun = "id" if len(ids) == 1 else "ids"
    return f"{noun} {shown}{more}"
