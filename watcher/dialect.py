"""Where the clock, row locking and lock-conflict errors used to live (kept for imports).

Each database's SQL now lives in its own module under :mod:`watcher.drivers`:
the elements in :mod:`watcher.drivers.sql`, their renderings per database in
:mod:`watcher.drivers.sqlite`, :mod:`~watcher.drivers.postgresql`,
:mod:`~watcher.drivers.mysql` and :mod:`~watcher.drivers.mssql`, and the
conflict codes in :mod:`watcher.drivers.conflicts`.
"""

from __future__ import annotations

from watcher.drivers.conflicts import is_lock_conflict
from watcher.drivers.sql import db_now, db_now_plus, lock_unless_busy
from watcher.drivers.sqlite import SQLITE_NOW

__all__ = ["SQLITE_NOW", "db_now", "db_now_plus", "is_lock_conflict", "lock_unless_busy"]
