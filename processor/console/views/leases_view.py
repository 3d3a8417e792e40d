"""What the console shows of a partition's lease and its parked items: who holds it, or
that it is parked (every unfinished item waits for a completion, so no processor needs a
lease until one comes or the earliest deadline passes), the waiting items' rows, and
what the overview says while no processor holds a lease.

Pure functions over the records and the waits' summary, at ``now`` by the database
clock; no I/O, no HTML.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from processor.console.views.texts import until_text
from watcher.records import ItemInfo, PartitionInfo
from watcher.reports import WaitSummary


@dataclass(frozen=True, slots=True)
class Parked:
    """A partition's items parked for a completion (status ``waiting``): how many, per
    gate, and when the earliest wait's deadline is (``"in 2 h"``, ``"now"``, ``"none"``,
    by the database clock). ``whole``: every unfinished item of the open partition is
    parked, so no processor holds it: its processor let go of the lease, and one takes
    it again at a completion or at the earliest deadline. Nothing is stuck."""

    items: int
    by_gate: dict[int, int]
    deadline: str
    whole: bool

    @property
    def waiting_text(self) -> str:
        """``"3 items waiting for completion, next deadline in 2 h"``."""
        items = f"{self.items:,} item{'' if self.items == 1 else 's'}"
        deadline = ("no deadline" if self.deadline == "none" else
                    "next deadline now: a processor takes it up" if self.deadline == "now"
                    else f"next deadline {self.deadline}")
        return f"{items} waiting for completion, {deadline}"

    @property
    def text(self) -> str:
        """:attr:`waiting_text`, after ``"parked: "`` when the whole partition is."""
        return f"{'parked: ' if self.whole else ''}{self.waiting_text}"

    @property
    def sentence(self) -> str:
        """What the partition page says of them, as a sentence or two."""
        if not self.whole:
            return self.waiting_text[0].upper() + self.waiting_text[1:] + "."
        return (f"Parked: {self.waiting_text}. Nothing is stuck: its processor let go of "
                "the lease, and one takes it again at a completion or at the deadline.")


def parked_of(info: PartitionInfo, counts: dict[int, dict[str, int]],
              summary: WaitSummary | None, now: datetime) -> Parked | None:
    """The parked items of ``info`` from its items counted per gate and status and its
    waits' summary (the earliest deadline), at ``now`` by the database clock; ``None``
    when none is parked or the partition is not open."""
    # Over the counts' items, not a read per status: a page of partitions with thousands
    # of gates each stays one pass over what was counted.
    by_gate: dict[int, int] = {}
    ready = False
    for gate, by_status in sorted(counts.items()):
        for status, count in by_status.items():
            if status == "waiting" and count:
                by_gate[gate] = count
            ready = ready or (status == "available" and count > 0)
    if info.status != "available" or not by_gate:
        return None
    return Parked(items=sum(by_gate.values()), by_gate=by_gate,
                  deadline=until_text(summary.next_deadline if summary else None, now),
                  whole=not ready)


@dataclass(frozen=True, slots=True)
class WaitingRow:
    """A parked item as the partition page lists it: its id, gate, and its wait's
    deadline (``"2026-05-01 14:00:00 UTC"``, ``"none"``) and how far off it is (``"in
    2 h"``, ``"now"``), by the database clock."""

    id: str
    gate: int
    deadline: str
    due: str


def waiting_row(item: ItemInfo, now: datetime) -> WaitingRow:
    """How the partition page lists the parked ``item`` at ``now``."""
    deadline = item.retry_at
    return WaitingRow(item.id, item.gate, "none" if deadline is None else
                      deadline.strftime("%Y-%m-%d %H:%M:%S UTC"), until_text(deadline, now))


@dataclass(frozen=True, slots=True)
class Lease:
    """Who holds a partition and for how long: ``state`` is ``held`` (a live lease),
    ``expired`` (its holder stopped renewing), ``none`` (no processor has taken it
    yet), ``parked`` (every unfinished item waits for a completion, so no processor
    needs it: ``note`` says how many and the next deadline), or ``stopped`` (the
    partition is not open, so nobody works on it)."""

    state: str
    owner: str
    seconds_left: int
    note: str = ""


def lease_of(info: PartitionInfo, now: datetime, parked: Parked | None = None) -> Lease:
    """The lease of ``info`` at ``now`` (the database clock); ``parked``: its parked
    items (:func:`parked_of`), which make a partition without a live lease parked
    rather than waiting for a processor."""
    if info.status != "available":
        return Lease("stopped", info.owner, 0)
    left = int((info.until - now).total_seconds()) if info.owner else 0
    if left > 0:
        return Lease("held", info.owner, left)
    if parked is not None and parked.whole:
        return Lease("parked", "", 0, parked.text)
    return Lease("expired", info.owner, 0) if info.owner else Lease("none", "", 0)


@dataclass(frozen=True, slots=True)
class LeaseNote:
    """What the overview says about leases when no processor holds one: ``kind`` is
    ``idle`` (nothing is open), ``parked`` (every open item waits for a completion),
    or ``unserved`` (open work waits for a processor: a problem to act on)."""

    kind: str
    text: str


def lease_note(open_partitions: int, items_ready: int, items_parked: int) -> LeaseNote:
    """The overview's line while no processor holds a lease, from the open partitions,
    the items ready at their open partition's gate and the items parked for a
    completion (the backlog's counts)."""
    if open_partitions == 0:
        return LeaseNote("idle", "No processor holds a lease: no partition is open.")
    if items_ready == 0 and items_parked > 0:
        items = f"{items_parked:,} item{'' if items_parked == 1 else 's'}"
        return LeaseNote("parked", f"No processor holds a lease, as none needs one: the "
                         f"open partitions are parked, {items} waiting for completion. A "
                         "processor takes a partition again at a completion or at its "
                         "earliest deadline.")
    return LeaseNote("unserved", "No processor holds a lease right now. Start one with "
                     "processor run --handler-url ….")
