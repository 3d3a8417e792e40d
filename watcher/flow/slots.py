"""A pool of dispatch slots shared by every partition a watcher holds."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import Protocol

# A waiting partition's entry in its key's heap: (order, not ready, arrival, event).
_Turn = tuple[float, bool, int, asyncio.Event]


class Slots(Protocol):
    """What a partition's supervisor uses of the slots it dispatches in: a
    :class:`SlotPool`, or a keyed partition's :class:`~watcher.flow.key_pools.KeyedSlots`."""

    @property
    def free(self) -> int: ...
    @property
    def refill_at(self) -> int: ...
    @property
    def in_use(self) -> int: ...
    def take(self, wanted: int) -> int: ...
    def give_back(self, count: int = 1) -> None: ...
    def give_back_later(self, count: int, seconds: float) -> None: ...
    def notify_when_free(self, event: asyncio.Event, order: float = 0.0, *,
                         ready: bool = False) -> None: ...
    def pass_turn(self) -> None: ...
    def leave(self, event: asyncio.Event) -> None: ...
    def calls_started(self, count: int) -> None: ...
    def calls_ended(self, count: int) -> None: ...


class SlotPool:
    """``capacity`` concurrent processor calls, shared across partitions.

    Partitions take what is free without waiting. A partition that finds too
    few slots free (fewer than ``refill_at``, a quarter of the capacity) asks
    to be told; once that many are free again, the partition that has waited
    longest is woken, and it passes the turn on (:meth:`pass_turn`) when it
    is done and slots are still free. So partitions take turns at freed slots,
    and a watcher holding a thousand partitions wakes one of them per refill,
    not all of them at every completed call.

    A concurrency key (tenant) holding none of these slots goes first: the next turn
    goes to a waiting partition of such a key (the key that took least recently, if
    several), and while one waits, partitions of other keys take nothing without a
    turn. So a tenant's first partition does not queue behind the partitions another
    tenant's burst put here before it, nor lose the slots a busy key's batch frees
    all at once to that key's next read. Among keys that all hold some, and within a
    key, turns go by lease-queue place, then to a partition ready with rows read
    ahead, then to the one that has waited longest. Unkeyed partitions count as one
    key, ``""``; with one key this is the plain turn order.

    A slot stays taken from the call's start until its answer is queued for the
    writer, or, when the writer's buffer is full (or off), until it is written; so
    :attr:`in_use` counts those results too; :attr:`calls`
    counts only the processor calls running (an item's, alone or in a batch, or
    a reduce call's), and ``on_calls`` is told that count whenever it changes.
    """

    def __init__(self, capacity: int, *, on_calls: Callable[[int], None] | None = None,
                 on_turn: Callable[[], None] | None = None) -> None:
        self.capacity = capacity
        # Told each time a waiting partition gets its turn (the backlog shrank).
        self._on_turn = on_turn
        self.refill_at = max(1, capacity // 4)
        self.in_use = 0
        self.calls = 0
        self._on_calls = on_calls
        self._in_use_by_key: dict[str, int] = {}  # keys holding slots, and how many
        self._takes = itertools.count()
        self._last_take: dict[str, int] = {}  # keys, by the number of their latest take
        # Waiting partitions: the live ones (with whether they hold rows read ahead), and
        # per key a heap of (order, not ready, arrival, event) in which an entry whose
        # event left, was woken or asked again is skipped when it comes up.
        self._waiting: dict[asyncio.Event, tuple[int, bool]] = {}
        self._queues: dict[str, list[_Turn]] = {}
        self._queued = 0  # entries in every heap, live or not
        self._arrivals = itertools.count()
        self._granted: asyncio.Event | None = None  # woken for the current turn
        self._granted_key = ""  # and its partition's key

    @property
    def free(self) -> int:
        """Slots not in use."""
        return self.capacity - self.in_use

    def free_for(self, key: str) -> int:
        """Slots a partition of concurrency key ``key`` may take now: none while a
        partition of a key that goes before it (:meth:`_ahead`) waits for a turn or has
        been given one and not yet run, else every free slot."""
        queues, granted = self._queues, self._granted
        others = (len(queues) > 1 or (queues and key not in queues)
                  or (granted is not None and self._granted_key != key and granted.is_set()))
        if others and self._behind(key):
            return 0
        return self.capacity - self.in_use

    @property
    def waiting(self) -> int:
        """Partitions waiting for a turn at these slots."""
        return len(self._waiting)

    def last_waiting_order(self) -> float | None:
        """The lease-queue place of the waiting partition that stands last (the highest
        ``order``), or ``None`` while none waits. Walks the waiting entries."""
        live = self._waiting
        orders = [entry[0] for queue in self._queues.values() for entry in queue
                  if live.get(entry[3], (None,))[0] == entry[2]]
        return max(orders, default=None)

    def standing(self, key: str) -> tuple[int, int]:
        """Key ``key``'s claim to the next slots, lowest first: the slots it holds, then
        the number of its latest take (-1: none yet)."""
        return self._in_use_by_key.get(key, 0), self._last_take.get(key, -1)

    def _behind(self, key: str) -> bool:
        """Whether a partition of another key ahead of ``key`` (:meth:`_ahead`) waits for
        a turn or holds one it has not used yet."""
        mine = self.standing(key)
        granted = self._granted
        if (granted is not None and granted.is_set() and self._granted_key != key
                and self._ahead(self.standing(self._granted_key), mine)):
            return True
        return any(other != key and self._ahead(self.standing(other), mine)
                   and self._live_head(other) for other in list(self._queues))

    @staticmethod
    def _ahead(other: tuple[int, int], mine: tuple[int, int]) -> bool:
        """Whether a key of standing ``other`` goes before one of standing ``mine`` at
        slots free now: it holds none, and the other some or it took less recently.
        Keys that all hold some share what frees as it comes, in the plain turn order:
        with many busy keys, making each take wait for a turn by standing cost
        statements (smaller reads) and bought no fairness a key with none lacked."""
        return other[0] == 0 and (mine[0] > 0 or other[1] < mine[1])

    def _live_head(self, key: str) -> bool:
        """Whether ``key``'s heap has a partition still waiting (entries that left are
        dropped from its head)."""
        queue = self._queues[key]
        while queue:
            _, _, arrival, event = queue[0]
            if self._waiting.get(event, (None,))[0] == arrival:
                return True
            heapq.heappop(queue)
            self._queued -= 1
        del self._queues[key]
        return False

    def take(self, wanted: int, key: str = "") -> int:
        """Take up to ``wanted`` slots for a partition of concurrency key ``key``
        (:meth:`free_for` says how many it may); returns how many were taken (maybe 0)."""
        taken = max(0, min(wanted, self.free_for(key)))
        if taken:
            self.in_use += taken
            self._in_use_by_key[key] = self._in_use_by_key.get(key, 0) + taken
            self._last_take[key] = next(self._takes)
            if len(self._last_take) > 2 * (len(self._in_use_by_key) + len(self._queues)) + 64:
                self._forget_idle_keys()
        return taken

    def calls_started(self, count: int) -> None:
        """``count`` processor calls began, in slots taken for them."""
        self.calls += count
        if self._on_calls is not None:
            self._on_calls(self.calls)

    def calls_ended(self, count: int) -> None:
        """``count`` processor calls ended (answered, failed or cancelled)."""
        self.calls -= count
        if self._on_calls is not None:
            self._on_calls(self.calls)

    def give_back(self, count: int = 1, key: str = "") -> None:
        """Return slots a partition of ``key`` took; wake the next partition in line
        once enough are free."""
        self.in_use -= count
        left = self._in_use_by_key.get(key, 0) - count
        if left > 0:
            self._in_use_by_key[key] = left
        else:
            self._in_use_by_key.pop(key, None)
        self.pass_turn()

    def give_back_later(self, count: int, seconds: float, key: str = "") -> None:
        """Return the slots of abandoned calls: the processor's own pool takes them back
        at once (it bounds this process's work, and those calls are over here)."""
        self.give_back(count, key)

    def pass_turn(self) -> None:
        """Wake the longest-waiting partition if at least ``refill_at`` slots are free.

        One turn at a time: while the partition woken last has not run yet
        (its event is still set), nobody else is woken. Otherwise each freed
        slot would wake one more waiter before the first had taken the slots,
        and those would wake only to find too few free and wait again.
        """
        if self.free < self.refill_at and self.in_use > 0:
            return
        if self._granted is not None and self._granted.is_set():
            return  # its partition passes the turn on when it has taken its slots
        self._granted = None
        while self._queues:
            key = (next(iter(self._queues)) if len(self._queues) == 1
                   else min(self._queues, key=self._key_place))
            queue = self._queues[key]
            _, _, arrival, event = heapq.heappop(queue)
            self._queued -= 1
            if not queue:
                del self._queues[key]
            if self._waiting.get(event, (None,))[0] != arrival:
                continue  # it left, or waits under a later entry
            del self._waiting[event]
            if not event.is_set():
                event.set()
                self._granted, self._granted_key = event, key
                if self._on_turn is not None:
                    self._on_turn()
                return

    def _key_place(self, key: str) -> tuple[bool, int, float, bool, int]:
        """Where ``key``'s next waiting partition stands for a turn: keys holding no slots
        first, the one that took least recently first among them; then the head
        entry's place, across keys as within one (a head that left is popped and
        skipped, and the choice made again)."""
        held, last_take = self.standing(key)
        order, not_ready, arrival, _ = self._queues[key][0]
        return held > 0, last_take if held == 0 else 0, order, not_ready, arrival

    def _forget_idle_keys(self) -> None:
        """Drop the latest takes of keys holding nothing and waiting for nothing (they
        come back with the standing of a new key), so the record stays bounded."""
        self._last_take = {key: take for key, take in self._last_take.items()
                           if key in self._in_use_by_key or key in self._queues}

    def leave(self, event: asyncio.Event) -> None:
        """A partition stops waiting for turns (it is done); a turn it held passes on."""
        self._waiting.pop(event, None)
        if self._granted is event:
            self._granted = None
            self.pass_turn()

    def notify_when_free(self, event: asyncio.Event, order: float = 0.0, *,
                         ready: bool = False, key: str = "") -> None:
        """Set ``event`` when it is this partition's turn at freed slots: turns go to a
        partition whose concurrency ``key`` holds no slots first; then to the lowest
        ``order`` (the partition's place in the lease queue, so a higher priority goes
        ahead); then to a partition ``ready`` to start calls from rows it read ahead;
        then to the one that has waited longest.

        A partition that read ahead starts those rows in the turns that follow, with
        no read between: a small partition is done in one read, and a big one's next
        calls follow its last without a read's wait. It holds at most one read's rows,
        so once they have started it takes its place at the back like any other.
        """
        waiting = self._waiting.get(event)
        if waiting is not None and (waiting[1] or not ready):
            return  # already in line, as far ahead
        arrival = next(self._arrivals)
        self._waiting[event] = (arrival, ready)
        if self._queued > 4 * len(self._waiting) + 64:  # mostly entries that left
            self._drop_entries_that_left()
        heapq.heappush(self._queues.setdefault(key, []), (order, not ready, arrival, event))
        self._queued += 1

    def _drop_entries_that_left(self) -> None:
        live = self._waiting
        for key, queue in list(self._queues.items()):
            kept = [entry for entry in queue if live.get(entry[3], (None,))[0] == entry[2]]
            if kept:
                heapq.heapify(kept)
                self._queues[key] = kept
            else:
                del self._queues[key]
        self._queued = sum(len(queue) for queue in self._queues.values())


class ReadAheadPool:
    """Rows a watcher's partitions may hold read ahead of their free slots, shared by all
    of them (``capacity``: the concurrency, one more round of calls).

    A read asks for the rows its slots can start plus up to a round more, as the room
    left allows, so one read feeds a partition's next calls too: they start from rows
    in hand as slots free, while other results are still being written, and a small
    partition is read once. Room is taken for the rows a read returned, not before:
    reads running at once may ask for the same room, and the rows beyond it are not
    kept. The pool bounds what the rows held take in memory however many partitions
    are leased.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held = 0

    @property
    def room(self) -> int:
        """How many more rows may be held now."""
        return self.capacity - self.held

    def hold(self, count: int) -> int:
        """Hold up to ``count`` more rows; returns how many may be (maybe 0)."""
        held = max(0, min(count, self.capacity - self.held))
        self.held += held
        return held

    def give_back(self, count: int) -> None:
        """``count`` rows held were dispatched or dropped."""
        self.held -= count


async def wait_event(event: asyncio.Event, seconds: float) -> bool:
    """Wait until ``event`` is set or ``seconds`` pass; returns whether it was set.

    Uses ``asyncio.timeout`` rather than ``wait_for``: on Python 3.11,
    ``wait_for`` can swallow a cancellation that arrives as the event fires,
    which would leave a cancelled task running.
    """
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
        return True
    except TimeoutError:
        return False
