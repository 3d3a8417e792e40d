"""The items one partition's supervisor holds, from the read that returned them
until their result is written."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from watcher.protocol import WorkItem
from watcher.records import ReadyItem


class ItemsInHand:
    """What a supervisor holds, so that no item is dispatched twice.

    - **In flight**: items dispatched and not yet written, mapped to the task
      that calls the processor for their batch while their call runs, and to
      ``None`` once their result is queued for the writer.
    - **Let go while a read ran**: items whose result was written (or dropped)
      while a read of ready items may have been running. That read can still
      return the item's old row, which must not be dispatched again. Each entry
      keeps the row version handled and the read sequence number at the time;
      it is dropped once a read that began after it has ended, since such a
      read sees the write.
    - **The read sequence**: counts reads, for the entries above.

    - **Read ahead**: rows a read returned beyond the slots it had, at gate
      ``ahead_gate``, in the read's order. They are dispatched as slots free,
      without another read; nothing about them is written until then, so
      dropping them loses nothing (the items stay available in the database).

    It also remembers, for read pacing (:func:`watcher.rules.decisions.decide_read`),
    whether the last read found the gate empty and when that read ended.
    Not thread-safe; one supervisor task owns it.
    """

    __slots__ = ("_in_flight", "_let_go", "_reads", "_tokens_given_up", "ahead", "ahead_at",
                 "ahead_gate", "gate_looked_empty", "last_read", "reading")

    def __init__(self) -> None:
        self._in_flight: dict[str, asyncio.Task[None] | None] = {}
        self._let_go: dict[str, tuple[int, int]] = {}  # id -> (version, read sequence)
        self._reads = 0
        self.ahead: list[ReadyItem] = []
        self.ahead_gate = -1
        self.ahead_at = 0.0  # time.monotonic() when the oldest row held was known
        self.reading = False  # a read of ready items is running
        self.gate_looked_empty = False
        self.last_read = 0.0  # time.monotonic() when the last read ended
        # (item id, token) of the calls given up after their handler was handed a token.
        self._tokens_given_up: list[tuple[str, str]] = []

    def __len__(self) -> int:
        """How many items are in flight."""
        return len(self._in_flight)

    def ids(self) -> set[str]:
        """Every item id a read of ready items must not return as new."""
        return {*self._in_flight, *self._let_go}

    def read_mark(self) -> int | None:
        """The number of reads begun, or ``None`` while one runs: a mark that
        :meth:`add_ahead` compares with, to know that no read ran in between."""
        return None if self.reading else self._reads

    def begin_read(self) -> int:
        """Number a read of ready items that is about to start; returns its number."""
        self._reads += 1
        return self._reads

    def end_read(self, read: int, rows: Sequence[ReadyItem], wanted: int,
                 now: float) -> list[ReadyItem]:
        """The rows of read number ``read`` that are new, at most ``wanted`` of them.

        A row is new unless its item is in flight, or was let go at the same
        version. Records whether the gate looked empty (fewer new rows than
        wanted) and forgets what a read started after it would already see.
        """
        in_flight, let_go = self._in_flight, self._let_go
        fresh = [row for row in rows
                 if row.id not in in_flight and let_go.get(row.id, (None, 0))[0] != row.version
                 ][:wanted]
        self.gate_looked_empty = len(fresh) < wanted
        self.last_read = now
        # Results written before this read started are visible to it: forget them.
        self._let_go = {key: value for key, value in let_go.items() if value[1] >= read}
        return fresh

    def hold_ahead(self, rows: Sequence[ReadyItem], gate: int) -> None:
        """Keep ``rows`` (new rows of a read, at ``gate``) to dispatch as slots free."""
        self.ahead = list(rows)
        self.ahead_gate = gate
        self.ahead_at = self.last_read

    def add_ahead(self, rows: Sequence[ReadyItem], gate: int, now: float,
                  mark: int | None) -> bool:
        """Hold ``rows`` too: items known ready at ``gate`` as of ``now`` without a read
        (those an answer spawned, just written). ``mark`` is :meth:`read_mark` from
        before their write was sent. Returns ``False``, holding nothing, when a read
        ran or began since then (it may have seen the rows, and dispatched them), when
        any of them is in hand already, or when the rows held are at another gate."""
        if mark is None or self.read_mark() != mark or (
                self.ahead and self.ahead_gate != gate):
            return False
        known = self.ids() | {row.id for row in self.ahead}
        if any(row.id in known for row in rows):
            return False
        if not self.ahead:
            self.ahead_gate, self.ahead_at = gate, now
        self.ahead.extend(rows)
        return True

    def ahead_usable(self, gate: int, now: float, max_age: float) -> bool:
        """Whether rows read ahead may start now: some are held, read at ``gate``, and the
        oldest of them was known (its read ended, or its spawn was written) less than
        ``max_age`` seconds before ``now``.

        So a pause (read by every ready read) stops new calls within that age, as it
        does without reading ahead.
        """
        return bool(self.ahead) and self.ahead_gate == gate and now - self.ahead_at < max_age

    def take_ahead(self, count: int) -> list[ReadyItem]:
        """The first ``count`` rows read ahead, no longer held."""
        taken, self.ahead = self.ahead[:count], self.ahead[count:]
        return taken

    def drop_ahead(self) -> int:
        """Forget the rows read ahead (a read is due, or the supervisor ends); returns
        how many there were."""
        dropped = len(self.ahead)
        self.ahead = []
        return dropped

    def started(self, items: Sequence[ReadyItem], call: asyncio.Task[None]) -> None:
        """``items`` were dispatched together; ``call`` is the task calling the processor."""
        in_flight = self._in_flight
        for item in items:
            in_flight[item.id] = call

    def results_queued(self, items: Sequence[ReadyItem]) -> None:
        """The calls of ``items`` ended and their results wait for the writer."""
        in_flight = self._in_flight
        for item in items:
            in_flight[item.id] = None

    def only_results(self) -> bool:
        """Whether the last read found the gate empty, and every item in hand since has
        its result queued (no call runs, no read, nothing held ahead): those results are
        the gate's last, as far as this holder can tell."""
        return (self.gate_looked_empty and not self.ahead and not self.reading
                and all(call is None for call in self._in_flight.values()))

    def let_go(self, items: Sequence[ReadyItem]) -> None:
        """``items`` are no longer in hand; a read still running may return their old rows."""
        in_flight, let_go, reads = self._in_flight, self._let_go, self._reads
        for item in items:
            let_go[item.id] = (item.version, reads)
            in_flight.pop(item.id, None)

    def settled(self) -> None:
        """Nothing is in flight and no read is running: every item let go is visible as it
        now is to any read that starts from here, so none is left out of the next one."""
        self._let_go.clear()

    def calls(self) -> list[asyncio.Task[None]]:
        """The tasks still calling the processor (one per batch)."""
        return list({call for call in self._in_flight.values() if call is not None})

    async def finish_calls(self, grace: float) -> None:
        """Let the calls in flight end by themselves for up to ``grace`` seconds, then
        cancel those still running (a drain)."""
        tasks = self.calls()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace)
            for task in pending:
                task.cancel()

    async def cancel_calls(self) -> list[tuple[str, str]]:
        """Cancel the calls in flight and wait until each has ended (a lost lease, a
        quorum met). Returns the (item id, token) of each call given up so far whose
        handler was handed its completion token (:meth:`given_up`), and forgets them."""
        tasks = self.calls()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        given_up, self._tokens_given_up = self._tokens_given_up, []
        return given_up

    def given_up(self, items: Sequence[ReadyItem], works: Sequence[WorkItem]
                 ) -> list[ReadyItem]:
        """Those of ``items`` (one batch's, called as ``works``) whose call was cancelled
        before it ended; the tokens their handler was handed are kept for
        :meth:`cancel_calls` to return."""
        calling = self.calling(items)
        ids = {item.id for item in calling}
        self._tokens_given_up += [(work.id, work.token_given) for work in works
                                  if work.id in ids and work.token_given is not None]
        return calling

    def calling(self, items: Sequence[ReadyItem]) -> list[ReadyItem]:
        """Those of ``items`` whose call has not ended (no result queued for them)."""
        in_flight = self._in_flight
        return [item for item in items if in_flight.get(item.id) is not None]
