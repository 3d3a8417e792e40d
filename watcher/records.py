"""Plain values that cross the store seam. No behaviour, no I/O."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class NewItem:
    """An item to insert: its id, its bytes and its first gate."""

    id: str
    data: bytes
    gate: int = 0


@dataclass(frozen=True, slots=True)
class ReduceProgress:
    """Where a paged reduce of the partition's current gate stands.

    ``pass_`` is ``"fold"`` or ``"apply"``; ``pages_done`` counts the pages of
    that pass already stored; ``attempts`` counts failed reduce calls since the
    last success (shown while a reduce keeps failing).
    """

    pass_: str | None
    pages_done: int
    attempts: int


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """A partition as the client sees it. ``counts`` maps status name to item count.

    ``reduce_gates`` are the gates reduced in one step for the whole gate;
    ``on_item_failure`` is ``"fail"`` or ``"continue"``; ``result`` is the
    partition result a reduce stored (bytes, usually JSON); ``last_error`` says
    why the last reduce call failed; ``reduce`` is a reduce in progress at the
    current gate, or ``None``.
    """

    id: str
    status: str
    gate: int
    owner: str
    until: datetime
    version: int
    counts: dict[str, int] = field(default_factory=dict)
    created_at: datetime | None = None
    updated_at: datetime | None = None
    reduce_gates: tuple[int, ...] = ()
    on_item_failure: str = "fail"
    result: bytes | None = None
    last_error: str | None = None
    reduce: ReduceProgress | None = None

    def result_json(self) -> Any:
        """The partition result decoded as JSON (``None`` when there is none).

        Raises:
            ValueError: the result is not JSON (a reduce stored raw bytes).
        """
        return None if self.result is None else json.loads(self.result)


@dataclass(frozen=True, slots=True)
class ItemInfo:
    """An item as the client sees it."""

    partition_id: str
    id: str
    status: str
    gate: int
    data: bytes
    attempts: int
    last_error: str | None
    version: int
    retry_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class PartitionSettings:
    """What a partition fixed at creation and its supervisor needs: its reduce gates
    and what a failed item does."""

    reduce_gates: frozenset[int] = frozenset()
    continue_on_failure: bool = False


@dataclass(frozen=True, slots=True)
class LeaseRow:
    """What a lease scan reads of a partition, with the settings its supervisor needs."""

    id: str
    version: int
    gate: int
    owner: str
    settings: PartitionSettings = PartitionSettings()


@dataclass(frozen=True, slots=True)
class ReduceState:
    """A partition's stored reduce progress at its current gate.

    ``pass_`` is ``None`` before a paged reduce starts (and for one-call
    reduces); ``after`` is the id of the last item of the last page done;
    ``accumulator`` is the fold's latest accumulator (JSON bytes).
    """

    version: int
    gate: int
    pass_: str | None
    page: int
    after: str | None
    accumulator: bytes | None
    attempts: int


@dataclass(frozen=True, slots=True)
class ReduceEntry:
    """One item as a reduce sees it: available at the gate, or failed earlier."""

    id: str
    version: int
    gate: int
    status: str
    data: bytes
    last_error: str | None


@dataclass(frozen=True, slots=True)
class LeaseRenewal:
    """The outcome of a renewal: what was extended, and what was passed by.

    ``held`` maps each renewed partition to its new version and, when it was
    re-read, its gate (``None``: unchanged). ``busy`` partitions were locked
    by another session (a client or processor inside a transaction) and were
    neither renewed nor lost; the others asked for were lost.
    """

    held: dict[str, tuple[int, int | None]]
    busy: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class LeaseStats:
    """Active partitions and how many each live owner holds."""

    active: int
    owners: dict[str, int]


@dataclass(frozen=True, slots=True)
class PartitionState:
    """A re-read of one partition, to tell a conflict from a lost lease."""

    id: str
    version: int
    gate: int
    status: str
    owner: str
    lease_live: bool


@dataclass(frozen=True, slots=True)
class ReadyItem:
    """An item ready to dispatch."""

    id: str
    version: int
    gate: int
    data: bytes
    attempts: int


@dataclass(frozen=True, slots=True)
class GateSummary:
    """What is left at a partition's current gate, read only when the gate looks empty.

    ``pending`` counts available items at the gate (in flight or waiting for
    their retry time); ``seconds_to_next_retry`` is how long until the earliest
    of them is ready, by the database clock.
    """

    pending: int
    failed: int
    next_gate: int | None
    seconds_to_next_retry: float | None = None


@dataclass(frozen=True, slots=True)
class ItemWrite:
    """One guarded item update: the outcome of one attempt.

    ``gate`` and ``data`` of ``None`` keep the stored gate and bytes.
    ``retry_delay`` of ``None`` makes the item ready at once.
    """

    partition_id: str
    item_id: str
    seen_version: int
    status: str
    gate: int | None
    attempts: int
    data: bytes | None = None
    last_error: str | None = None
    retry_delay: float | None = None
