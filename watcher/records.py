"""Plain values that cross the store seam. No behaviour, no I/O."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from watcher.waits import WaitWrite

T = TypeVar("T")

# The pipeline of a partition that names none (docs/how-to/pipelines.md).
DEFAULT_PIPELINE = "default"


@dataclass(frozen=True, slots=True)
class NewItem:
    """An item to insert: its id, its bytes and its first gate.

    ``gate`` of ``None`` means the default gate: 0 for an item the client adds,
    and the spawning item's gate for an item a step spawns (see
    :attr:`watcher.protocol.Result.spawn`). ``not_before`` (an aware datetime) holds
    the item back until then by the database clock; ``None`` makes it ready at once.
    """

    id: str
    data: bytes
    gate: int | None = None
    not_before: datetime | None = None


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
    spawned: int = 0  # items its steps and reduces spawned
    priority: int = 0
    # When a client paused it (naive UTC); None while it runs.
    paused_at: datetime | None = None
    key: str | None = None  # its concurrency key; None: none
    pipeline: str = DEFAULT_PIPELINE
    pipeline_version: str | None = None  # None: not pinned yet

    def result_json(self) -> Any:
        """The partition result decoded as JSON (``None`` when there is none).

        Raises:
            ValueError: the result is not JSON (a reduce stored raw bytes).
        """
        return None if self.result is None else json.loads(self.result)


@dataclass(frozen=True, slots=True)
class ErrorEntry:
    """One failed attempt of an item, as its error history keeps it: when it failed (by
    the database clock, naive UTC), which attempt it was (1-based), at which gate, and
    the error (the handler's message, with the engine's kind prefix when it has one)."""

    at: datetime
    attempt: int
    gate: int
    error: str


@dataclass(frozen=True, slots=True)
class ItemInfo:
    """An item as the client sees it.

    ``error_history`` holds its last few errors, the oldest first (see
    :mod:`watcher.rules.error_history`); ``()`` when it never failed.
    """

    partition_id: str
    id: str
    status: str
    gate: int
    data: bytes
    attempts: int
    last_error: str | None
    version: int
    retry_at: datetime | None = None
    parent: str | None = None  # the item whose answer spawned it; None: the client added it
    error_history: tuple[ErrorEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class PartitionSettings:
    """What a partition fixed at creation and its supervisor needs: its reduce gates,
    what a failed item does, and the trace context its creator was in (W3C
    ``traceparent``/``tracestate`` as JSON, :mod:`processor.observe.tracing`; ``None``: none)."""

    reduce_gates: frozenset[int] = frozenset()
    continue_on_failure: bool = False
    trace_context: str | None = None
    # From -10 to 10 (watcher.rules.priority): higher is leased first.
    priority: int = 0
    # The concurrency key (a tenant); '' for none. Stored as partitions.flow_key.
    key: str = ""
    # Its place in the lease queue (rank_at, as seconds): turns at a processor's freed
    # slots go in this order too, so priority and fairness hold within a processor.
    queue_order: float = 0.0
    # The gates that pass on the first k of their items, as (gate, k) pairs in gate
    # order (watcher.rules.completions); () for none: every item.
    quorum: tuple[tuple[int, int], ...] = ()
    # The http(s) URL POSTed a signed event when the partition ends (complete, failed
    # or cancelled); None: no notification (docs/how-to/notifications.md).
    notify: str | None = None
    # The pipeline whose routes serve it, and the version it keeps (None: the routes'
    # current one, pinned at its first lease); docs/how-to/pipelines.md.
    pipeline: str = DEFAULT_PIPELINE
    pipeline_version: str | None = None

    def quorum_at(self, gate: int) -> int:
        """How many items pass ``gate`` (its quorum's k); 0 when every item must."""
        return next((k for at, k in self.quorum if at == gate), 0)


@dataclass(frozen=True, slots=True)
class LeaseRow:
    """What a lease scan reads of a partition, with the settings its supervisor needs."""

    id: str
    version: int
    gate: int
    owner: str
    settings: PartitionSettings = PartitionSettings()
    # The timeline read with the row (``timeline_read``): the lease starts knowing it.
    timeline: str | None = None
    timeline_read: bool = False


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
    paused: bool = False  # a client paused the partition: no new reduce call

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
    neither renewed nor lost; ``stopped`` ones were cancelled or are being
    deleted by a client; the others asked for were lost. ``timelines`` holds
    the timeline stored now (:mod:`watcher.rules.timeline`) of each held partition
    whose progress the renewal carried; ``timelines_read`` that of each held
    partition whose progress it could not write (the holder's copy was stale, or
    it had none): the holder's new copy, its progress left for the next renewal.
    """

    held: dict[str, tuple[int, int | None]]
    busy: frozenset[str] = frozenset()
    stopped: frozenset[str] = frozenset()
    timelines: dict[str, str | None] = field(default_factory=dict)
    timelines_read: dict[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LeaseStats:
    """Active partitions (leased, or free to lease) and how many each live owner holds.
    ``free_at_cap``: the free partitions were counted only up to a cap, and there may
    be more (``active`` counts the capped number)."""

    active: int
    owners: dict[str, int]
    free_at_cap: bool = False


@dataclass(frozen=True, slots=True)
class PartitionState:
    """A re-read of one partition, to tell a conflict from a lost lease."""

    id: str
    version: int
    gate: int
    status: str
    owner: str
    lease_live: bool


@dataclass(slots=True)
class ReadyItem:
    """An item ready to dispatch. ``size`` is the stored data's size when the item
    was read without its data (too large to dispatch); otherwise ``len(data)``.

    Never changed once made, yet not frozen: one is made per item read, and a frozen
    dataclass's ``__init__`` sets each field through ``object.__setattr__``, which
    costs the hot path about three times the plain assignment (see
    docs/explanation/performance.md)."""

    id: str
    version: int
    gate: int
    data: bytes
    attempts: int
    size: int | None = None
    # Its stored error history (JSON text, see watcher.rules.error_history); None: no errors.
    error_history: str | None = None
    # The key of its last wait (see watcher.waits); None: it never parked.
    wait_key: str | None = None


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
    now: datetime | None = None  # when it was read, by the store's clock
    paused: bool = False  # a client paused the partition
    # Items waiting at the gate for a completion, and how long until the earliest
    # one's deadline (0 once passed), by the database clock.
    waiting: int = 0
    seconds_to_deadline: float | None = None


@dataclass(slots=True)
class ItemWrite:
    """One guarded item update: the outcome of one attempt. Never changed once made;
    not frozen for the same reason as :class:`ReadyItem` (one is made per call).

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
    # The new error history, its newest entry's time left for the write to stamp (see
    # watcher.rules.error_history); None keeps the stored one.
    error_history: str | None = None
    # Items to insert, each with its gate resolved, in the write's transaction and
    # only if the write applies; their parent is ``item_id``.
    spawn: tuple[NewItem, ...] = ()
    # A parking write (status ``waiting``, ``retry_delay`` its timeout): the wait it
    # stores in the item's row, and the replaced key it keeps in ``waits`` (revision
    # 0021), only if it applies.
    wait: WaitWrite | None = None
    # (gate, k) when the item's gate has a quorum: a write that completes it counts,
    # and the k-th settles the gate's other items as skipped in its transaction.
    quorum: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class PartitionClose:
    """A holder's close sent with a batch of item results, after their writes (the
    partition's last results at ``gate``, as far as its holder knows): guarded as
    :meth:`~watcher.store.Store.partition_close_when_done` is, by ``version`` and the
    holder, and by nothing being left to do; its ``timeline`` is written with it."""

    partition_id: str
    version: int
    gate: int
    failures_allowed: bool
    timeline: str


class Page(list[T], Generic[T]):
    """One page of a listing: a list of its rows, and the cursor of the next page.

    ``next_cursor`` is ``None`` on the last page; otherwise pass it as
    ``after=`` to read the page that follows. Being a list, a page works
    wherever the whole listing did (iteration, ``len``, indexing, ``== []``).
    """

    __slots__ = ("next_cursor",)

    def __init__(self, rows: Iterable[T] = (), next_cursor: str | None = None) -> None:
        super().__init__(rows)
        self.next_cursor = next_cursor

    def __repr__(self) -> str:
        return f"Page({list.__repr__(self)}, next_cursor={self.next_cursor!r})"


@dataclass(frozen=True, slots=True)
class OutboxEvent:
    """A notification as the outbox holds it (:class:`watcher.models.Notification`).

    ``now`` is the database clock's time when it was read (claimed or listed);
    ``version`` guards the write that settles a claim. ``body`` is ``None`` until
    the first attempt stores the event's bytes.
    """

    seq: int
    event_id: str
    partition_id: str
    target: str
    status: str
    gate: int
    state: str
    attempts: int
    version: int
    next_at: datetime
    created_at: datetime
    updated_at: datetime
    now: datetime
    body: bytes | None = None
    last_error: str | None = None
