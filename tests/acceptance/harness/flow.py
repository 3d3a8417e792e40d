"""What the flow-control tests measure at the handler: how many calls of each
concurrency key run at once, and when a call arrived by the database clock.

- :class:`KeyLoad` is a ``hold`` hook for :class:`~.handler.RecordingHandler`: every
  call does its work in a task of its own that a hang-up does not cancel, so a call
  whose processor was killed with ``kill -9`` keeps running in the handler, as the
  work of a real handler would, and still counts against its key.
- :func:`most_at_once` is the pure count over the spans the calls ran.
- :class:`DbClock` turns the handler's monotonic times into database times.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from processor import AsyncClient
from tests.acceptance.harness.handler import Call


def key_of(partition_id: str) -> str:
    """The concurrency key a test gave a partition: its id up to the last ``-``
    (``a-007`` -> ``a``). The key itself never reaches the handler; the id does."""
    return partition_id.rpartition("-")[0] or partition_id


@dataclass
class Span:
    """The time one call's work ran in the handler (``ended`` is ``None`` while it runs)."""

    key: str
    partition_id: str
    item_id: str
    caller: str
    started: float
    seq: int = -1  # the call's number in the handler's log
    ended: float | None = None


def most_at_once(spans: Iterable[tuple[float, float | None]], since: float = float("-inf"),
                 until: float = float("inf")) -> int:
    """The most spans that overlap at one moment between ``since`` and ``until``.

    A span is (start, end), ``end`` ``None`` for one still running; one that ends
    exactly when another starts does not overlap it.
    """
    events: list[tuple[float, int]] = []
    for start, end in spans:
        stop = float("inf") if end is None else end
        if stop <= since or start >= until or stop <= start:
            continue
        events += [(max(start, since), 1), (min(stop, until), -1)]
    # At equal times, ends before starts.
    events.sort()
    running = most = 0
    for _, change in events:
        running += change
        most = max(most, running)
    return most


class KeyLoad:
    """A ``hold`` hook that makes every call work ``seconds`` (a number, or a function of
    the call) in a task a hang-up does not cancel, and logs the span per key.

    :meth:`outlive` keeps a killed processor's calls running longer: what a handler
    that does not notice the hang-up does.
    """

    def __init__(self, seconds: float | Callable[[Call], float] = 0.2) -> None:
        self.seconds = seconds
        self.spans: list[Span] = []
        self.running: dict[str, int] = defaultdict(int)
        self._outlive: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def __call__(self, call: Call) -> asyncio.Event:
        done = asyncio.Event()
        span = Span(key_of(call.partition_id), call.partition_id, call.item_id, call.caller,
                    time.monotonic(), call.seq)
        self.spans.append(span)
        self.running[span.key] += 1
        task = asyncio.create_task(self._work(call, span, done))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return done

    async def _work(self, call: Call, span: Span, done: asyncio.Event) -> None:
        try:
            await asyncio.sleep(self.seconds(call) if callable(self.seconds) else self.seconds)
            # Set once, at the kill: one more sleep reaches it.
            end = self._outlive.get(call.caller, 0.0)
            if end > time.monotonic():
                await asyncio.sleep(end - time.monotonic())
        finally:
            self.running[span.key] -= 1
            span.ended = time.monotonic()
            done.set()

    def outlive(self, caller: str, seconds: float) -> int:
        """Keep ``caller``'s calls that run now running ``seconds`` more (and none
        started later); returns how many there are."""
        self._outlive[caller] = time.monotonic() + seconds
        return sum(1 for span in self.spans if span.caller == caller and span.ended is None)

    def forget(self, caller: str) -> None:
        """Let ``caller``'s later calls run their normal time again."""
        self._outlive.pop(caller, None)

    def most(self, key: str, since: float = float("-inf"), until: float = float("inf")
             ) -> int:
        """The most calls of ``key`` that ran at once between ``since`` and ``until``."""
        return most_at_once(((span.started, span.ended) for span in self.spans
                             if span.key == key), since, until)

    def crowd(self, key: str, since: float = float("-inf"), until: float = float("inf")
              ) -> list[Span]:
        """The calls of ``key`` running at the first moment the most ran at once between
        ``since`` and ``until`` (the evidence when a limit was exceeded)."""
        spans = self.of(key)
        most = self.most(key, since, until)
        for moment in sorted(span.started for span in spans if since <= span.started < until):
            running = [span for span in spans if span.started <= moment
                       and (span.ended is None or span.ended > moment)]
            if len(running) == most:
                return running
        return []

    def of(self, key: str) -> list[Span]:
        """The spans of ``key``'s calls."""
        return [span for span in self.spans if span.key == key]

    async def close(self) -> None:
        """Cancel the work still running (the test is over)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@dataclass(frozen=True)
class DbClock:
    """The database clock as a function of this process's monotonic clock: one reading
    of it, ``at`` (aware UTC), taken at monotonic ``mid`` give or take ``error`` seconds
    (half the round trip of the best of several readings)."""

    at: datetime
    mid: float
    error: float

    @classmethod
    async def read(cls, client: AsyncClient, samples: int = 7) -> DbClock:
        """The reading with the shortest round trip of ``samples``.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed.
        """
        best: DbClock | None = None
        for _ in range(samples):
            before = time.monotonic()
            now = (await client.now()).replace(tzinfo=UTC)
            after = time.monotonic()
            reading = cls(now, (before + after) / 2, (after - before) / 2)
            if best is None or reading.error < best.error:
                best = reading
        assert best is not None
        return best

    def of(self, monotonic: float) -> datetime:
        """The database time at ``monotonic``."""
        return self.at + timedelta(seconds=monotonic - self.mid)

    def seconds_after(self, monotonic: float, moment: datetime) -> float:
        """How long after ``moment`` (aware) ``monotonic`` was, by the database clock."""
        return (self.of(monotonic) - moment).total_seconds()


def first_calls(calls: Sequence[Call]) -> dict[str, Call]:
    """Each partition's first call (by arrival at the handler)."""
    first: dict[str, Call] = {}
    for call in sorted(calls, key=lambda call: call.started):
        first.setdefault(call.partition_id, call)
    return first


def log_time(stamp: str) -> float:
    """A log line's time (``2026-11-26 08:36:59,584``, this host's local time) as
    seconds since the epoch, to compare with ``time.time()``."""
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def leases_taken(logs: Iterable[str]) -> list[tuple[str, str]]:
    """(log time, partition) of every ``lease_acquired`` line of the processors' logs, in
    the order they were taken (their times are this host's clock, to the millisecond:
    leases taken by two processors in one millisecond may come in either order)."""
    taken: list[tuple[str, str]] = []
    for log in logs:
        for line in log.splitlines():
            if "action=lease_acquired " in line:
                partition = line.split(" partition=", 1)[1].split(" ", 1)[0]
                taken.append((line[:23], partition))
    return sorted(taken)
