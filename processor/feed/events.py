"""The live feed's events: their ids, their JSON payloads, and the Server-Sent Events
text that carries them (written by the API, read by ``processor watch``). Pure: no I/O.

An event id is ``VERSION:GATE`` or ``VERSION:GATE:TAG``: the partition's version
(which every write to the partition row raises, and which never goes down) and its
gate when the event was observed, and a tag telling apart events of one
observation (``c<n>`` for counts, ``r`` for the result, ``e`` for the end). Ids
compare by version, so a client that resumes with ``Last-Event-ID`` is sent the
gate moves observed at a later version, and none it has seen.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from processor.wire.values import data_value

# The kinds of events, in the order one observation sends them.
STATE, GATE, COUNTS, RESULT, END = "state", "gate", "counts", "result", "end"
FINISHED = ("complete", "failed", "cancelled")
DELETED = "deleted"  # the end of a partition deleted while it was followed
END_TAG = "e"
# A result bigger than this is announced by its size only (GET /v1/partitions/{id} has it).
MAX_RESULT_BYTES = 64 * 1024
# Item statuses that are settled at their gate (the item will not run there again).
SETTLED = ("complete", "failed", "skipped")
_ID = re.compile(r"([0-9]{1,18}):([0-9]{1,10})(?::(c[0-9]{1,18}|r|e))?")


class BadEventIdError(ValueError):
    """A ``Last-Event-ID`` that is not one of the feed's ids."""


@dataclass(frozen=True, slots=True)
class EventId:
    """Where a client is in the feed: the version and gate of the last event it got,
    and that event's tag (``""`` for a state or gate event)."""

    version: int
    gate: int
    tag: str = ""

    def __str__(self) -> str:
        return f"{self.version}:{self.gate}" + (f":{self.tag}" if self.tag else "")

    @property
    def ended(self) -> bool:
        """The client has had the end: there is nothing more to send it."""
        return self.tag == END_TAG

    @classmethod
    def parse(cls, text: str) -> EventId:
        """The id ``text`` names.

        Raises:
            BadEventIdError: it is not ``VERSION:GATE`` or ``VERSION:GATE:TAG``.
        """
        match = _ID.fullmatch(text)
        if match is None:
            raise BadEventIdError(
                f"Last-Event-ID {text[:40]!r} is not an id this feed sent (VERSION:GATE or "
                "VERSION:GATE:TAG); reconnect without it to start afresh")
        return cls(int(match[1]), int(match[2]), match[3] or "")


@dataclass(frozen=True, slots=True)
class Event:
    """One event of the feed: its kind (the SSE ``event:`` field), id and JSON data."""

    kind: str
    id: EventId
    data: Mapping[str, Any]

    def frame(self) -> bytes:
        """The event as Server-Sent Events text (one ``data:`` line: JSON has no newline)."""
        body = json.dumps(self.data, separators=(",", ":"), ensure_ascii=False)
        return f"id: {self.id}\nevent: {self.kind}\ndata: {body}\n\n".encode()


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A partition as one poll saw it: status, gate, version, items per gate and status,
    the result (``None``: none) and the last reduce error."""

    id: str
    status: str
    gate: int
    version: int
    gates: Mapping[int, Mapping[str, int]] = field(default_factory=dict)
    result: bytes | None = None
    last_error: str | None = None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED or self.status == DELETED

    def counts(self) -> dict[str, int]:
        """Items per status, over every gate."""
        total: dict[str, int] = {}
        for statuses in self.gates.values():
            for status, count in statuses.items():
                total[status] = total.get(status, 0) + count
        return dict(sorted(total.items()))

    def event_id(self, tag: str = "") -> EventId:
        return EventId(self.version, self.gate, tag)


def gates_view(gates: Mapping[int, Mapping[str, int]]) -> list[dict[str, Any]]:
    """Per gate, oldest first: its items per status, ``total`` (items at this gate or a
    later one) and ``passed`` (those at a later gate, or settled at this one): what a
    progress bar per gate draws."""
    order = sorted(gates)
    rows = []
    for n, gate in enumerate(order):
        later = sum(sum(gates[other].values()) for other in order[n + 1:])
        here = gates[gate]
        settled = sum(here.get(status, 0) for status in SETTLED)
        rows.append({"gate": gate, "items": dict(sorted(here.items())),
                     "total": later + sum(here.values()), "passed": later + settled})
    return rows


def state_event(snapshot: Snapshot) -> Event:
    """The first event of a fresh connection: where the partition is now."""
    return Event(STATE, snapshot.event_id(), {
        "status": snapshot.status, "gate": snapshot.gate, "version": snapshot.version,
        "counts": snapshot.counts(), "gates": gates_view(snapshot.gates)})


def gate_event(version: int, from_gate: int, to_gate: int, *, gap: bool = False) -> Event:
    """A gate move seen at ``version`` (``gap``: moves the feed did not see may lie
    between, when it resumed from before it began watching)."""
    return Event(GATE, EventId(version, to_gate), {
        "from": from_gate, "to": to_gate, "version": version, "gap": gap})


def counts_event(snapshot: Snapshot, sequence: int) -> Event:
    """The item counts of ``snapshot`` (the ``sequence``-th poll that saw them change)."""
    return Event(COUNTS, snapshot.event_id(f"c{sequence}"), {
        "gate": snapshot.gate, "counts": snapshot.counts(), "gates": gates_view(snapshot.gates)})


def end_events(snapshot: Snapshot) -> list[Event]:
    """The result (when there is one) and the end of a finished partition."""
    events = []
    if snapshot.result is not None:
        size = len(snapshot.result)
        shown = ({"size": size, "truncated": True} if size > MAX_RESULT_BYTES
                 else {"size": size, "truncated": False, **data_value(snapshot.result, "result")})
        events.append(Event(RESULT, snapshot.event_id("r"), shown))
    events.append(Event(END, snapshot.event_id(END_TAG), {
        "status": snapshot.status, "gate": snapshot.gate, "version": snapshot.version,
        "counts": snapshot.counts(), "gates": gates_view(snapshot.gates),
        "last_error": snapshot.last_error}))
    return events


def comment(text: str) -> bytes:
    """An SSE comment line (a heartbeat: clients ignore it, proxies see traffic)."""
    return f": {text}\n\n".encode()


def retry_field(milliseconds: int) -> bytes:
    """The SSE ``retry:`` field: how long an EventSource waits before it reconnects."""
    return f"retry: {milliseconds}\n\n".encode()


# -- reading a stream (processor watch) ------------------------------------------------

@dataclass(frozen=True, slots=True)
class Received:
    """An event as a client read it: kind, id (``None``: the event had none) and data."""

    kind: str
    id: str | None
    data: str

    def json(self) -> Any:
        """The data as JSON.

        Raises:
            ValueError: it is not JSON.
        """
        return json.loads(self.data)


def parse_stream(lines: Iterable[str]) -> Iterator[Received]:
    """The events in the text lines of an SSE stream (line ends removed), as the
    EventSource standard reads them: comments and ``retry:`` skipped, ``data:`` lines
    joined, an event dispatched at a blank line."""
    kind, event_id = "", None
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield Received(kind or "message", event_id, "\n".join(data))
            kind, event_id, data = "", None, []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            kind = value
        elif name == "data":
            data.append(value)
        elif name == "id" and "\0" not in value:
            event_id = value
