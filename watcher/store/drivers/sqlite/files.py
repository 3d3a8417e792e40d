"""The SQLite file a store opened, and whether its path still names that file."""

from __future__ import annotations

import logging
import os
import sqlite3
import time

log = logging.getLogger(__name__)

# How often the database file's identity is checked, at most (see DatabaseFile).
FILE_CHECK_INTERVAL = 1.0


def file_identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``, or ``None`` when there is none."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino


class DatabaseFile:
    """The SQLite file a store opened, and whether its path still names that file.

    SQLite goes on using an open file after it is deleted or replaced (moved
    over, restored from a backup): every write would then go to a file no longer
    at the path, and be lost. The file's identity (device, inode) is taken when
    the first connection opens it; a later connection that finds another file
    there is refused, and :meth:`check` (on readiness checks, and at most every
    :data:`FILE_CHECK_INTERVAL` s before statements) compares the path's.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        # An in-memory database has no file to lose.
        self.watched = bool(path) and path != ":memory:" and not path.startswith("file:")
        self.identity: tuple[int, int] | None = None
        self.problem: str | None = None
        self._next_check = 0.0

    def opened(self) -> None:
        """A connection just opened the path: remember its file, or refuse another.

        Raises:
            sqlite3.OperationalError: the path names another file than the first
                connection opened.
        """
        if not self.watched:
            return
        identity = file_identity(self.path)
        if self.identity is None:
            self.identity = identity
        elif identity != self.identity:
            raise sqlite3.OperationalError(self._lost(identity))

    def check(self) -> str | None:
        """Compare the path's file with the one opened; returns the problem, if any."""
        self._next_check = time.monotonic() + FILE_CHECK_INTERVAL
        if self.identity is None:
            return None
        identity = file_identity(self.path)
        if identity == self.identity:
            if self.problem is not None:
                log.warning("action=database_file_restored path=%s", self.path)
            self.problem = None
            return None
        return self._lost(identity)

    def require(self) -> None:
        """Check (at most every :data:`FILE_CHECK_INTERVAL` s) before a statement.

        Raises:
            sqlite3.OperationalError: the file was deleted or replaced.
        """
        if time.monotonic() >= self._next_check:
            self.check()
        if self.problem is not None:
            raise sqlite3.OperationalError(self.problem)

    def _lost(self, identity: tuple[int, int] | None) -> str:
        if self.problem is None:
            how = "deleted" if identity is None else "replaced by another file"
            self.problem = (
                f"the SQLite database file {self.path} was {how} while this process had it "
                "open; nothing more is written to the old file (its writes would be lost). "
                "Put the file back, or restart the processor to use the file now at the path")
            log.error("action=database_file_lost path=%s how=%s", self.path,
                      "deleted" if identity is None else "replaced")
        return self.problem
