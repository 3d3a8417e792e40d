"""The history of one run: every handler call, completion, heartbeat, operator verb,
fault and create, and the final state read back through the client, as events.

An event is a plain dict with a ``kind`` and times in seconds on the run's one clock
(this process's monotonic clock, from the start of the run): the handler, the completer,
the operator and the faults all run in this process, so their times compare. Times of
the database clock (a ``not_before``) are turned into the run's clock once, at create,
by the offset measured then (:meth:`History.db_offset`).

Kinds and their fields:

- ``plan``: ``plan`` (the plan's JSON), ``db`` (the dialect), ``wall`` (the run's start
  on the wall clock, the clock of the processes' log lines).
- ``call``: ``seq``, ``service``, ``caller``, ``partition``, ``item``, ``gate``,
  ``attempt``, ``key`` (Idempotency-Key), ``token``, ``sent`` (when the processor built
  the request, read from its completion token's time; ``None`` when unknown),
  ``started`` (when it reached the handler), ``finished``, ``status``, ``retry_after``,
  ``outcome`` (ok, fault, abandoned), ``answer``.
- ``completion`` / ``heartbeat``: ``cid``, ``token``, ``partition``, ``item``, ``gate``,
  ``via``, ``started``, ``finished``, ``status`` (HTTP status, or ``cut``).
- ``verb``: ``name``, ``args``, ``started``, ``finished``, ``answer`` or ``error``.
- ``fault``: ``name``, ``args``, ``started``, ``finished``, ``target`` (an owner).
- ``create``: ``partition``, ``started``, ``finished``, ``not_before`` (item -> run time).
- ``final``: ``partitions`` (id -> status, gate, counts), ``items`` (pid -> list of
  id, status, gate, parent, data (parsed JSON), last_error), ``settled``, ``processes``
  (per process: ``owner``, ``spawned``, ``ready`` and ``ticking``: when it logged its
  start and its ticker's, or ``None``; ``exit``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

Event = dict[str, Any]


class History:
    """The events of one run, in the order they were recorded."""

    def __init__(self, events: Iterable[Event] = ()) -> None:
        self.events: list[Event] = list(events)
        self._start = time.monotonic()
        self.wall = time.time()  # the same moment on the wall clock (the logs' clock)

    def now(self) -> float:
        """Seconds since the run started, on the run's clock."""
        return round(time.monotonic() - self._start, 4)

    def since_start(self, monotonic: float) -> float:
        """A moment of this process's monotonic clock on the run's clock."""
        return round(monotonic - self._start, 4)

    def from_wall(self, wall: float) -> float:
        """A moment of the wall clock (a log line's time) on the run's clock."""
        return round(wall - self.wall, 4)

    def add(self, kind: str, **fields: Any) -> Event:
        """Record an event (returned, so a call's answer can be filled in later)."""
        event = {"kind": kind, **fields}
        self.events.append(event)
        return event

    def of(self, kind: str) -> list[Event]:
        """The events of one kind."""
        return [event for event in self.events if event["kind"] == kind]

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def dump(self, path: Path) -> None:
        """Write the events as JSON lines."""
        with path.open("w") as out:
            for event in self.events:
                out.write(json.dumps(event, sort_keys=True, default=str) + "\n")

    @staticmethod
    def load(path: Path) -> History:
        """Read a history written by :meth:`dump`."""
        return History(json.loads(line) for line in path.read_text().splitlines() if line)
