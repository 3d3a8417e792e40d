"""The hot connection's write-ahead log, kept short: checkpoints in a worker thread.

The hot connection never checkpoints (``wal_autocheckpoint=0``): a checkpoint
writes the database file and syncs it, which must not block the event loop.
:class:`Checkpoints` counts the hot path's commits and, every
:data:`CHECKPOINT_EVERY`, runs one in a worker thread on a connection of its
own. PASSIVE checkpoints copy what no reader still needs and never wait on a
lock; a log found over :data:`WAL_SIZE_LIMIT` is emptied with TRUNCATE instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3

log = logging.getLogger(__name__)

# A checkpoint is started in a worker thread after this many commits of the hot path,
# and at once when the WAL is found over WAL_SIZE_LIMIT (looked at every
# SIZE_CHECK_EVERY commits: one stat per few batches).
CHECKPOINT_EVERY = 64
SIZE_CHECK_EVERY = 4
# Past this size the WAL is checkpointed with TRUNCATE, which waits (up to
# TRUNCATE_WAIT, holding new writers back) for readers to leave the old frames and
# then empties the file: PASSIVE checkpoints alone never reset a WAL that some
# reader always uses, and it grows without end. After any reset the file is cut
# back to this size (journal_size_limit).
WAL_SIZE_LIMIT = 16 * 1024 * 1024
TRUNCATE_WAIT = 1.0


class Checkpoints:
    """Checkpoints the log of the database at ``path`` as the hot path commits (see the
    module docstring). ``running`` is the checkpoint under way, if any."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._commits = 0
        self.running: asyncio.Future[None] | None = None
        self.truncating = False  # the checkpoint under way empties the log
        self._conn: sqlite3.Connection | None = None
        self._closed = False

    def committed(self) -> None:
        """Count a commit; after :data:`CHECKPOINT_EVERY`, or with the WAL over
        :data:`WAL_SIZE_LIMIT`, checkpoint in a worker thread."""
        self._commits += 1
        if self.running is not None or self._closed:
            return
        if self._commits % SIZE_CHECK_EVERY and self._commits < CHECKPOINT_EVERY:
            return
        truncate = self._log_size() > WAL_SIZE_LIMIT
        if not truncate and self._commits < CHECKPOINT_EVERY:
            return
        self._commits = 0
        self.truncating = truncate
        self.running = asyncio.get_running_loop().run_in_executor(None, self.run, truncate)
        self.running.add_done_callback(self._done)

    async def wait_truncate(self) -> None:
        """While a TRUNCATE checkpoint waits for readers, the next write waits for it
        (up to :data:`TRUNCATE_WAIT`): a writer that kept the write lock busy would
        starve it, and the log would grow on."""
        running = self.running
        if running is not None and self.truncating:
            await asyncio.wait({running}, timeout=TRUNCATE_WAIT)

    def run(self, truncate: bool) -> None:
        """One checkpoint, PASSIVE or (``truncate``) TRUNCATE: a blocking call, for a
        worker thread.

        Raises:
            sqlite3.Error: the checkpoint failed (the next one tries again).
        """
        if self._conn is None:
            conn = sqlite3.connect(self._path, timeout=TRUNCATE_WAIT, isolation_level=None,
                                   check_same_thread=False)
            conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
            self._conn = conn
        mode = "TRUNCATE" if truncate else "PASSIVE"
        busy, _, _ = self._conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
        if busy and truncate:
            log.debug("action=checkpoint_blocked (a reader held the log past %s s)",
                      TRUNCATE_WAIT)

    def _log_size(self) -> int:
        try:
            return os.stat(self._path + "-wal").st_size
        except FileNotFoundError:
            return 0

    def _done(self, future: asyncio.Future[None]) -> None:
        self.running = None
        self.truncating = False
        if not future.cancelled() and future.exception() is not None:
            # The next one will try again; the engine's connections checkpoint too.
            log.debug("action=checkpoint_failed error=%s", type(future.exception()).__name__)

    async def close(self) -> None:
        """Start no more checkpoints; wait for the one under way and close the connection."""
        self._closed = True
        if self.running is not None:
            with contextlib.suppress(Exception):
                await self.running
        if self._conn is not None:
            self._conn.close()
            self._conn = None
