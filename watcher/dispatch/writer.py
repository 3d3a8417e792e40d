"""Group commit of item results: many guarded item writes per transaction.

Results arriving while a transaction is in progress are written together by
the next one, so under load the number of transactions per item falls well
below one, and under light load a result is written at once.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence
from functools import partial

from sqlalchemy.exc import SQLAlchemyError
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from watcher.dispatch.backoff import backoff, last_error, sleep_until
from watcher.leasing.closing import CloseWithWrite, write_with_closes
from watcher.outages import OutageLatch
from watcher.records import ItemWrite
from watcher.rules.decisions import unstorable_write
from watcher.store import Store
from watcher.store.db.refusals import blames_a_value, is_refusal, write_or_refuse
from watcher.store.drivers.conflicts import is_lock_conflict

log = logging.getLogger(__name__)

# Waits before writing a batch again: after a lock conflict (the batch was
# rolled back whole), and while the database is unavailable.
CONFLICT_RETRY_DELAY = 0.05
OUTAGE_RETRY_FIRST = 0.05
OUTAGE_RETRY_MAX = 5.0


class WriterClosedError(RuntimeError):
    """The writer stopped before this result could be written; the item will run again."""


Outcome = bool | BaseException
# Told, once, how a queued write ended: applied (True), fenced off (False), or
# the error that kept it from being written (WriterClosedError: never written).
WriteDone = Callable[[Outcome], None]
# Told, once, how each write of a queued batch ended, in the batch's order.
WritesDone = Callable[[list[Outcome]], None]


class _Entry:
    """Writes queued together (one dispatched batch's results) and their one waiter.

    ``outcomes`` holds the answers of the writes done so far: a batch written
    one write at a time (to find a refused value) can be cut short by an
    outage and go on later from where it stopped.
    """

    __slots__ = ("close", "done", "outcomes", "size", "writes")

    def __init__(self, writes: list[ItemWrite], done: WritesDone,
                 close: CloseWithWrite | None = None) -> None:
        self.writes = writes
        self.done = done
        self.close = close
        self.outcomes: list[Outcome] = []
        self.size = sum(_size(write) for write in writes)

    def unwritten(self) -> Sequence[ItemWrite]:
        """The writes not answered yet."""
        return self.writes[len(self.outcomes):] if self.outcomes else self.writes


class ResultWriter:
    """Writes item results for one owner, batching whatever is queued.

    The queue is a buffer of at most ``buffer_items`` writes and ``buffer_bytes`` of
    their data (what :meth:`has_room` tells the callers that free a call's slot as
    soon as its result is queued); the writer never refuses a write for it.
    """

    def __init__(self, store: Store, owner: str, *, batch_size: int,
                 linger: float = 0.0, calls_running: Callable[[], int] | None = None,
                 buffer_items: int = 0, buffer_bytes: int = 0) -> None:
        self.store = store
        self.owner = owner
        self.batch_size = batch_size
        self.linger = linger
        self.buffer_items = buffer_items
        self.buffer_bytes = buffer_bytes
        self._queued_bytes = 0  # the data of the writes in the queue
        # How many processor calls run now: with none, no result can come to join the
        # next batch, so the writer does not linger (None: it cannot tell).
        self._calls_running = calls_running
        self._last_write = -math.inf  # the loop time at which the last write ended
        self._queue: list[_Entry] = []
        self._queued = 0  # writes in the queue, over every entry
        self._pending = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()  # an event so that it cuts a retry wait short
        self._outage = OutageLatch()

    def start(self) -> None:
        """Start the background flush task (idempotent)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"result-writer-{self.owner}")

    def enqueue_many(self, writes: list[ItemWrite], done: WritesDone,
                     close: CloseWithWrite | None = None) -> None:
        """Queue ``writes``; ``done`` is called once, when every one of them is written or
        cannot be, with each one's outcome in order. A write the database refuses for its
        values is replaced in ``writes`` by the failure written in its place, so that
        ``done``'s caller reads what was written (a refused spawn inserted no child).
        ``close``: the writes are their partition's last at its gate, and its close is
        sent after them, in the same round trip (:mod:`watcher.leasing.closing`);
        ``close.closed`` says whether it went through by the time ``done`` is called.

        An outcome is whether the write was applied (``False``: the item moved
        on or the lease was lost, so the result was fenced off), or the error
        that stopped it. ``done`` is called from the writer's task and must
        not block. The writes of one call go in one transaction, with other
        queued writes, unless the database refuses a value in them.

        Raises:
            WriterClosedError: the writer is stopping; nothing was queued.
        """
        if self._closing.is_set():
            raise WriterClosedError("the result writer is stopping")
        self.start()
        entry = _Entry(writes, done, close)
        self._queue.append(entry)
        self._queued += len(writes)
        self._queued_bytes += entry.size
        self._pending.set()

    def has_room(self) -> bool:
        """Whether the queue is below both of its bounds (``buffer_items`` writes,
        ``buffer_bytes`` of data): a result queued now may free its call's slot."""
        return self._queued < self.buffer_items and self._queued_bytes < self.buffer_bytes

    def enqueue(self, write: ItemWrite, done: WriteDone) -> None:
        """Queue one write; ``done`` gets its outcome (see :meth:`enqueue_many`).

        Raises:
            WriterClosedError: the writer is stopping; nothing was queued.
        """
        self.enqueue_many([write], lambda outcomes: done(outcomes[0]))

    async def submit(self, write: ItemWrite) -> bool:
        """Queue ``write`` and wait until it is written; returns whether it was applied.

        Raises:
            WriterClosedError: the writer stopped before the write could be made.
            Exception: the database refused even the failure record for it.
        """
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def done(outcome: Outcome) -> None:
            if future.done():
                return
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

        self.enqueue(write, done)
        return await future

    def _head(self) -> list[_Entry]:
        """The entries at the front of the queue that make up the next batch: up to
        ``batch_size`` writes, and always the first entry, however many it holds."""
        head: list[_Entry] = []
        count = 0
        for entry in self._queue:
            size = len(entry.writes) - len(entry.outcomes)
            if head and count + size > self.batch_size:
                break
            head.append(entry)
            count += size
        return head

    async def _run(self) -> None:
        while True:
            await self._pending.wait()
            self._pending.clear()
            while self._queue:
                await self._linger()
                batch = self._head()
                try:
                    written = await self._write_head()
                except Exception as error:  # a bug: fail this batch, keep the writer alive
                    log.exception("action=result_write_error owner=%s", self.owner)
                    for entry in batch:
                        if entry in self._queue:
                            self._remove(entry)
                            _answer_all(entry, error)
                    continue
                if not written:
                    return  # closed during an outage: everything queued has failed
                self._last_write = asyncio.get_running_loop().time()
                if self._outage.recover():
                    log.warning("action=result_write_recovered owner=%s", self.owner)
            if self._closing.is_set():
                return

    async def _write_head(self) -> bool:
        """Write the head of the queue, trying again while the database fails.

        Returns ``False`` when the writer closed during an outage: then every
        queued write has failed with :class:`WriterClosedError`. Raises what a
        bug raises.
        """
        try:
            await self._write(self._head())
            return True
        except SQLAlchemyError as error:
            # Entering the retry loop for every batch would add to the cost of
            # each write on the hot path: a write enters it only once it has failed.
            return await self._write_head_again(error)

    async def _write_head_again(self, failure: SQLAlchemyError) -> bool:
        """Write the head of the queue again until the database takes it.

        ``failure`` is the error of the first try. A lock conflict (the batch
        was rolled back whole) is tried again shortly, at debug level; an
        outage is logged when it begins and when it ends, and ends the
        retries once the writer is closing. Returns and raises as
        :meth:`_write_head`.
        """
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(SQLAlchemyError),
            wait=backoff(first=OUTAGE_RETRY_FIRST, maximum=OUTAGE_RETRY_MAX,
                         conflict=CONFLICT_RETRY_DELAY),
            stop=self._stop_retrying, sleep=sleep_until(self._closing),
            before_sleep=lambda state: self._write_failed(last_error(state)), reraise=True)
        try:
            async for attempt in retrying:
                with attempt:
                    if attempt.retry_state.attempt_number == 1:
                        raise failure  # the first try, made before the retry loop
                    await self._write(self._head())
        except SQLAlchemyError as error:  # closing during an outage
            self._write_failed(error)
            self._fail_all(WriterClosedError("the database failed while the watcher was stopping"))
            return False
        return True

    def _stop_retrying(self, state: RetryCallState) -> bool:
        """Give up once the writer is closing, unless the write lost a lock conflict."""
        error = last_error(state)
        return self._closing.is_set() and not (error is not None and is_lock_conflict(error))

    def _write_failed(self, error: BaseException | None) -> None:
        """Log a failed write: a lock conflict at debug level, an outage once."""
        if error is not None and is_lock_conflict(error):
            log.debug("action=result_write_conflict owner=%s", self.owner)
        elif self._outage.fail():
            log.warning("action=result_write_failed owner=%s pending=%d error=%s",
                        self.owner, self._queued, type(error).__name__)

    async def _linger(self) -> None:
        """Right after a write, wait out the linger so that the next one carries more.

        A result that comes after a quiet spell is written at once; a full batch,
        a writer that is closing, or one whose processor has no call running (every
        result that could come is queued: a key limit can hold the calls in flight
        far below the batch size) does not wait either.
        """
        if not self.linger or self._closing.is_set() or self._queued >= self.batch_size:
            return
        if self._calls_running is not None and self._calls_running() == 0:
            return
        remaining = self._last_write + self.linger - asyncio.get_running_loop().time()
        if remaining > 0:
            await asyncio.sleep(remaining)

    async def _write(self, head: list[_Entry]) -> None:
        """Write the unanswered writes of ``head`` (the front of the queue) in one
        transaction and answer its waiters.

        When the database refuses the batch for a value in it, or drops the
        connection on it while it answers other statements at once, the writes
        go one per transaction instead, so that only the bad one is affected.
        Raises what an outage raises, leaving the batch queued.
        """
        writes = [write for entry in head for write in entry.unwritten()]
        closes = [entry.close for entry in head if entry.close is not None]
        try:
            applied = await (write_with_closes(self.store, writes, self.owner, closes)
                             if closes else self.store.items_apply(writes, self.owner))
        except Exception as error:
            if not await self._blames_a_value(error):
                raise
            await self._write_one_by_one(head)
            return
        start = 0
        for entry in head:
            end = start + len(entry.writes) - len(entry.outcomes)
            entry.outcomes.extend(applied[start:end])
            start = end
            self._remove(entry)
            _answer(entry)

    async def _write_one_by_one(self, head: list[_Entry]) -> None:
        """Write the unanswered writes of ``head`` one per transaction.

        A write the database refuses for its values is replaced by
        :func:`~watcher.rules.decisions.unstorable_write`, which fails the item with
        an error saying why. Each entry's waiter is answered as soon as its
        writes are done. Raises what an outage raises, leaving the rest queued
        (an entry keeps the answers of the writes it had done).
        """
        store = self.store
        for entry in head:
            for position, write in enumerate(entry.unwritten(), len(entry.outcomes)):
                outcome: Outcome
                try:
                    outcome = await write_or_refuse(store, partial(self._write_alone, write))
                except Exception as error:
                    if not is_refusal(store, error):
                        raise
                    log.warning("action=result_unstorable partition=%s item=%s error=%s",
                                write.partition_id, write.item_id, type(error).__name__)
                    replacement = unstorable_write(write, error)
                    try:
                        outcome = (await self.store.items_apply([replacement], self.owner))[0]
                    except Exception as second:
                        if not is_refusal(store, second):
                            raise
                        outcome = second
                    else:  # the caller reads what was written, not the write refused
                        entry.writes[position] = replacement
                entry.outcomes.append(outcome)
            self._remove(entry)
            _answer(entry)

    def _remove(self, entry: _Entry) -> None:
        """Take an answered entry off the queue (almost always its head)."""
        if self._queue[0] is entry:
            del self._queue[0]
        else:
            self._queue.remove(entry)
        self._queued -= len(entry.writes)
        self._queued_bytes -= entry.size

    async def _write_alone(self, write: ItemWrite) -> bool:
        """Write one result in a transaction of its own; returns whether it was applied.

        Raises what the database raised (a refused value, an outage).
        """
        return (await self.store.items_apply([write], self.owner))[0]

    async def _blames_a_value(self, error: BaseException) -> bool:
        """Whether a failed batch is to be written one by one to find a bad value
        (:func:`~watcher.store.db.refusals.blames_a_value`)."""
        return await blames_a_value(self.store, error)

    def _fail_all(self, error: Exception) -> None:
        queued, self._queue, self._queued, self._queued_bytes = self._queue, [], 0, 0
        for entry in queued:
            _answer_all(entry, error)

    async def close(self, grace: float) -> None:
        """Write what is queued (waiting up to ``grace`` seconds), then stop.

        A write waiting to be tried again after a database failure is tried
        once more at once; if that fails too, everything queued fails with
        :class:`WriterClosedError`.
        """
        self._closing.set()
        if self._task is None:
            return
        self._pending.set()
        done, _ = await asyncio.wait({self._task}, timeout=grace)
        if not done:
            self._task.cancel()
        self._fail_all(WriterClosedError("the result writer stopped"))


def _answer_all(entry: _Entry, error: BaseException) -> None:
    """Answer ``error`` for every write of ``entry`` not answered yet."""
    entry.outcomes.extend([error] * (len(entry.writes) - len(entry.outcomes)))
    _answer(entry)


def _answer(entry: _Entry) -> None:
    """Report an entry's outcomes to its waiter; a waiter that raises is logged, never
    the writer's end."""
    if entry.close is not None:
        entry.close.answered = True
    try:
        entry.done(entry.outcomes)
    except Exception:
        log.exception("action=write_callback_failed")


def _size(write: ItemWrite) -> int:
    """About what ``write`` holds in memory until written: its data and its spawns'."""
    return len(write.data or b"") + sum(len(child.data) for child in write.spawn)
