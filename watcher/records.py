"""Plain values that cross the store seam. No behaviour, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True, slots=True)
class NewItem:
    """An item to insert: its id, its bytes and its first gate."""

    id: str
    data: bytes
    gate: int = 0


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """A partition as the client sees it. ``counts`` maps status name to item count."""

    id: str
    status: str
    gate: int
    owner: str
    until: datetime
    version: int
    counts: dict[str, int] = field(default_factory=dict)
    created_at: datetime | None = None
    updated_at: datetime | None = None


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
class LeaseRow:
    """What a lease scan reads of a partition."""

    id: str
    version: int
    gate: int
    owner: str


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
