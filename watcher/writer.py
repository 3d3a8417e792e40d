"""Group commit of item results: many guarded item writes per transaction.

Results arriving while a transaction is in progress are written together by
the next one, so under load the number of transactions per item falls well
below one, and under light load a result is written at once.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy.exc import SQLAlchemyError

from watcher.dialect import is_lock_conflict
from watcher.records import ItemWrite
from watcher.store import Store

log = logging.getLogger(__name__)

RETRY_DELAYS = (0.05, 0.2, 0.5, 1.0, 2.0, 5.0)


class WriterClosedError(RuntimeError):
    """The writer stopped before this result could be written; the item will run again."""


class ResultWriter:
    """Writes item results for one owner, batching whatever is queued."""

    def __init__(self, store: Store, owner: str, *, batch_size: int) -> None:
        self.store = store
        self.owner = owner
        self.batch_size = batch_size
        self._queue: list[tuple[ItemWrite, asyncio.Future[bool]]] = []
        self._pending = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    def start(self) -> None:
        """Start the background flush task (idempotent)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"result-writer-{self.owner}")

    async def submit(self, write: ItemWrite) -> bool:
        """Queue ``write`` and wait until it is written.

        Returns whether it was applied (``False``: the item moved on or the
        lease was lost, so the result was fenced off).

        Raises:
            WriterClosedError: the writer stopped before the write could be made.
        """
        if self._closing:
            raise WriterClosedError("the result writer is stopping")
        self.start()
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._queue.append((write, future))
        self._pending.set()
        return await future

    async def _run(self) -> None:
        failures = 0
        while True:
            await self._pending.wait()
            self._pending.clear()
            while self._queue:
                batch = self._queue[: self.batch_size]
                try:
                    applied = await self.store.items_apply([w for w, _ in batch], self.owner)
                except SQLAlchemyError as error:
                    if is_lock_conflict(error):
                        # A deadlock victim: the batch was rolled back whole; write it again.
                        log.debug("action=result_write_conflict owner=%s", self.owner)
                        await asyncio.sleep(RETRY_DELAYS[0])
                        continue
                    if failures == 0:
                        log.warning("action=result_write_failed owner=%s pending=%d error=%s",
                                    self.owner, len(self._queue), type(error).__name__)
                    failures += 1
                    if self._closing:
                        self._fail_all(WriterClosedError(
                            "the database failed while the watcher was stopping"))
                        return
                    await asyncio.sleep(RETRY_DELAYS[min(failures, len(RETRY_DELAYS)) - 1])
                    continue
                except Exception as error:  # a bug: fail this batch, keep the writer alive
                    log.exception("action=result_write_error owner=%s", self.owner)
                    del self._queue[: len(batch)]
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(error)
                    continue
                if failures:
                    log.warning("action=result_write_recovered owner=%s", self.owner)
                    failures = 0
                del self._queue[: len(batch)]
                for (_, future), ok in zip(batch, applied, strict=True):
                    if not future.done():
                        future.set_result(ok)
            if self._closing:
                return

    def _fail_all(self, error: Exception) -> None:
        queued, self._queue = self._queue, []
        for _, future in queued:
            if not future.done():
                future.set_exception(error)

    async def close(self, grace: float) -> None:
        """Write what is queued (waiting up to ``grace`` seconds), then stop."""
        self._closing = True
        if self._task is None:
            return
        self._pending.set()
        done, _ = await asyncio.wait({self._task}, timeout=grace)
        if not done:
            self._task.cancel()
        self._fail_all(WriterClosedError("the result writer stopped"))
