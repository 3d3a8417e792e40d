"""Counting the SQL statements an engine sends, and timing a watcher's drain from its hooks."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from typing import Any

from sqlalchemy import event

from bench.common import cpu_seconds
from watcher.hooks import Hooks
from watcher.store import Store

# The statement a WITH clause leads to: the first of these after a closing parenthesis.
_AFTER_CTE = re.compile(r"\)\s*(UPDATE|SELECT|INSERT|DELETE)\b", re.IGNORECASE)


class StatementCounter:
    """Counts the statements a store sends, by their first keyword.

    Both paths count: the SQLAlchemy engine's (``before_cursor_execute``) and
    the direct PostgreSQL path's. An ``executemany`` counts once: it is one
    statement as the driver sends it (psycopg pipelines the rows).
    """

    def __init__(self, store: Store) -> None:
        self.total = 0
        self.kinds: Counter[str] = Counter()
        self._engine = store.engine.sync_engine
        self._driver = store.driver
        event.listen(self._engine, "before_cursor_execute", self._count_engine)
        self._driver.add_statement_listener(self._count)

    def _count_engine(self, conn: Any, cursor: Any, statement: str, parameters: Any,
                      context: Any, executemany: bool) -> None:
        self._count(statement)

    def _count(self, statement: str) -> None:
        self.total += 1
        head = statement.lstrip().split(None, 1)
        kind = head[0].upper() if head else "?"
        if kind == "WITH":  # rows a common table expression locks, then the statement
            found = _AFTER_CTE.search(statement)
            kind = found.group(1).upper() if found else kind
        self.kinds[kind] += 1

    def reset(self) -> None:
        """Start counting from zero."""
        self.total = 0
        self.kinds.clear()

    def close(self) -> None:
        """Stop counting."""
        event.remove(self._engine, "before_cursor_execute", self._count_engine)
        self._driver.remove_statement_listener(self._count)


class DrainHooks(Hooks):
    """Records when the last of ``partitions`` closed (the drain's end) and what was done then.

    ``done`` is set when every partition has closed; ``finished_at`` is the
    ``time.perf_counter()`` of that moment, ``cpu_at_end`` this process's CPU
    time then, and ``statements_at_end`` the statement count (if a counter is
    attached).
    """

    def __init__(self, partitions: int, counter: StatementCounter | None = None,
                 on_complete: Any = None) -> None:
        self.partitions = partitions
        self.counter = counter
        self.on_complete = on_complete
        self.closed = 0
        self.failed = 0
        self.completed_items = 0
        self.other_outcomes: Counter[str] = Counter()
        self.finished_at: float | None = None
        self.statements_at_end: int | None = None
        self.kinds_at_end: dict[str, int] = {}
        self.cpu_at_end: float | None = None
        self.done = asyncio.Event()

    def item_outcome(self, partition_id: str, item_id: str, gate: int, outcome: str,
                     seconds: float, *, pipeline: str = "default") -> None:
        if outcome == "complete":
            self.completed_items += 1
            if self.on_complete is not None:
                self.on_complete(self.completed_items)
        else:
            self.other_outcomes[outcome] += 1

    def partition_closed(self, partition_id: str, status: str, *,
                         pipeline: str = "default") -> None:
        self.closed += 1
        if status != "complete":
            self.failed += 1
        if self.closed >= self.partitions and self.finished_at is None:
            self.finished_at = time.perf_counter()
            self.cpu_at_end = cpu_seconds()
            if self.counter is not None:
                self.statements_at_end = self.counter.total
                self.kinds_at_end = dict(self.counter.kinds.most_common())
            self.done.set()
