"""A history read once for the checks: the violations they return, the steps of an
item's trail, and the lookups the checks share (calls by number, completions by
number, creates, the final state, when a processor was frozen).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from tests.proof.history import Event, History

# How long the fleet may take to act on a pause, a Retry-After hold or a cancel: a poll
# (0.1 s here) and a claim loop, on a machine shared by several runs. A loaded CI
# machine (the suite's four workers on two cores) was seen to take 1.3 s to spread a
# hold; the defects this guards against showed calls for the whole of a hold.
GRACE = 2.0
# The least a hold still has to run for a call in it to count (its end is measured from
# the answer here, and set from its receipt by the processor, a little later).
HOLD_MARGIN = 0.1
# The leeway of a not_before: the database's now is read once at create.
NOT_BEFORE_LEEWAY = 0.05


@dataclass(frozen=True)
class Violation:
    """A guarantee broken: which, how, and the events that show it."""

    guarantee: str
    message: str
    excerpt: list[Event] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"[{self.guarantee}] {self.message}"]
        lines += [f"    {_short(event)}" for event in self.excerpt[:8]]
        return "\n".join(lines)


def _short(event: Event) -> str:
    keep = {k: v for k, v in event.items() if k not in ("answer",) or v is None}
    answer = event.get("answer")
    if isinstance(answer, dict):
        keep["answer"] = {k: v for k, v in answer.items() if k != "data"}
    return str(keep)[:400]


@dataclass(frozen=True)
class Entry:
    """One step of an item's trail: at ``gate``, ``how`` (n: a call moved it on, w: a call
    parked it, c: a completion moved it on, r: a reduce call moved it on) from
    ``source`` (a call, completion or reduce call)."""

    gate: int
    how: str
    source: int

    @staticmethod
    def parse(text: str) -> Entry:
        gate, rest = text.split(":", 1)
        how, source = rest.split("@", 1)
        return Entry(int(gate), how, int(source))

    @property
    def leaves(self) -> bool:
        """Whether the step moved the item on from its gate."""
        return self.how in ("n", "c", "r")


class View:
    """A history read once into the lookups the checks share."""

    def __init__(self, history: History) -> None:
        self.history = history
        self.calls = {event["seq"]: event for event in history.of("call")}
        self.completions = history.of("completion")
        self.by_cid: dict[int, list[Event]] = defaultdict(list)
        for event in self.completions:
            self.by_cid[event["cid"]].append(event)
        self.creates = {event["partition"]: event for event in history.of("create")}
        finals = history.of("final")
        self.final: Event = finals[-1] if finals else {"partitions": {}, "items": {},
                                                        "settled": False}
        self.verbs = history.of("verb")
        self.faults = history.of("fault")
        self.reduces = {event["seq"]: event for event in history.of("reduce")}

    def done(self, name: str, pid: str) -> list[Event]:
        """The verbs ``name`` on partition ``pid`` that did not raise."""
        return [v for v in self.verbs if v["name"] == name and not v.get("error")
                and v["args"].get("partition") == pid]

    def rewound(self, pid: str, gate: int, after: float, before: float) -> bool:
        """Whether a rewind of ``pid`` to ``gate`` or below may have come between a
        write at ``after`` and a call or completion begun at ``before`` (a new epoch:
        the step legitimately runs again)."""
        return any(r["args"]["gate"] <= gate and r["finished"] >= after
                   and r["started"] <= before for r in self.done("rewind", pid))

    def source_start(self, entry: Entry) -> float | None:
        """When the call, completion or reduce call that wrote ``entry`` began."""
        if entry.how == "c":
            tries = self.by_cid.get(entry.source)
            return min(t["started"] for t in tries) if tries else None
        event = (self.reduces if entry.how == "r" else self.calls).get(entry.source)
        return None if event is None else event["started"]

    def items(self) -> Iterable[tuple[str, Event]]:
        """(partition, item) of every item read back at the end."""
        for pid, items in self.final["items"].items():
            for item in items:
                yield pid, item

    def trail(self, item: Event) -> list[Entry]:
        """The item's trail (empty for data that is not the proof's)."""
        data = item.get("data")
        if not isinstance(data, dict) or not isinstance(data.get("t"), list):
            return []
        return [Entry.parse(text) for text in data["t"]]

    def written_at(self, pid: str, item_id: str, entry: Entry) -> float | None:
        """The earliest moment the step's write can have happened: when its call was
        answered, or when its completion was first sent."""
        if entry.how in ("n", "w", "r"):
            call = (self.reduces if entry.how == "r" else self.calls).get(entry.source)
            return None if call is None else call["finished"]
        sent = [e["started"] for e in self.by_cid.get(entry.source, ())]
        return min(sent) if sent else None

    @staticmethod
    def made(call: Event) -> float:
        """When the processor made ``call``: when it built the request (``sent``, read
        from its completion token), else when it reached the handler. A call made
        before a hold or a pause may reach the handler well after it on a loaded
        machine (seed 1004824235: 1.66 s), and is no breach of it."""
        sent = call.get("sent")
        return call["started"] if sent is None else min(sent, call["started"])

    def frozen(self, owner: str, start: float, end: float) -> bool:
        """Whether ``owner`` was stopped or killed at some moment in [start, end]."""
        for fault in self.faults:
            if fault["target"] != owner or fault["name"] not in ("stop", "kill", "sigterm"):
                continue
            began = fault["started"]
            ended = fault["finished"] if fault["finished"] is not None else float("inf")
            if fault["name"] in ("kill", "sigterm"):
                ended = float("inf")  # gone for good: its owner never calls again
            if began <= end and ended >= start:
                return True
        return False
