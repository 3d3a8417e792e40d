"""The seeded plan of one run: which partitions to create (their items and each item's
script), and one timeline of actions (operator verbs and faults), all drawn from one
``random.Random(seed)``.

A plan is plain data: it is written to JSON, read back and cut down (``shrink``) without
drawing again, so a smaller plan keeps every choice the seed made for what is left.

Adding an action kind is one entry in :data:`ACTIONS` (its weight and how it draws its
arguments) and one function in :mod:`tests.proof.actors` that performs it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

PIPELINES = ("alpha", "beta")
# The pipelines of the second stream's partitions (see :func:`generate`): ``gamma``'s
# route sends batches (the batch protocol), ``delta``'s service runs on a server of its
# own that a ``service_down`` fault stops (connections refused) and starts again.
EXTRA_PIPELINES = ("gamma", "delta")
ALL_PIPELINES = PIPELINES + EXTRA_PIPELINES
# The service each pipeline's routes send its calls to (by URL path, /svc/<service>).
SERVICE_OF = {"alpha": "alpha", "beta": "beta", "gamma": "gamma", "delta": "delta"}
BATCHED = frozenset({"gamma"})
DOWNABLE = "delta"
KEYS = ("k0", "k1", "k2")

# What an item does when it is called at a gate (see tests/proof/handler.py); ``reduce``
# marks a reduce gate, where no per-item call is made.
NEXT, WAIT, SPAWN, BURST, REDUCE = "next", "wait", "spawn", "burst", "reduce"


@dataclass(frozen=True)
class WaitPlan:
    """What the outside world does with the token of an item parked at a gate.

    ``mode``: ``complete`` (after ``delay`` s, ``racers`` completions at once),
    ``race`` (once every item of the partition is parked, all their completions at
    once), ``timeout`` (nobody completes: the deadline passes). ``via`` names, per
    racer, ``api`` (``POST /v1/completions/<token>`` on ``processor api``) or
    ``client`` (:meth:`processor.AsyncClient.complete`). ``heartbeat``: a heartbeat
    first.
    """

    mode: str = "complete"
    delay: float = 0.5
    racers: int = 1
    via: tuple[str, ...] = ("api",)
    heartbeat: bool = False


@dataclass(frozen=True)
class ItemPlan:
    """One item: its script (what it answers at each gate), how long it parks, how many
    items it spawns, its ``not_before`` (seconds after its partition is created) and,
    per parking gate, what happens to its token."""

    id: str
    script: tuple[str, ...]
    wait_timeout: float = 3.0
    spawn: int = 0
    not_before: float | None = None
    waits: dict[int, WaitPlan] = field(default_factory=dict)


@dataclass(frozen=True)
class PartitionPlan:
    """One partition: its items and settings, and when (seconds into the run) it is
    created."""

    id: str
    at: float
    pipeline: str
    items: tuple[ItemPlan, ...]
    gates: int
    quorum: dict[int, int] = field(default_factory=dict)
    key: str | None = None
    priority: int = 0
    kind: str = "plain"
    reduce_gates: tuple[int, ...] = ()
    notify: bool = False


@dataclass(frozen=True)
class Action:
    """One verb or fault on the timeline: ``kind`` (a name in :data:`ACTIONS`), when
    (seconds into the run) and its arguments."""

    at: float
    kind: str
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def fault(self) -> bool:
        """Whether it is a fault (not an operator verb)."""
        return self.kind in FAULT_KINDS


@dataclass(frozen=True)
class Plan:
    """Everything one run does, drawn from ``seed``."""

    seed: int
    processors: int
    key_limits: dict[str, int]
    partitions: tuple[PartitionPlan, ...]
    actions: tuple[Action, ...]
    duration: float

    def to_json(self) -> str:
        """The plan as one JSON document."""
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Plan:
        """A plan written by :meth:`to_json`."""
        raw = json.loads(text)
        partitions = tuple(
            PartitionPlan(**{**p, "quorum": {int(g): k for g, k in p["quorum"].items()},
                             "items": tuple(_item(i) for i in p["items"]),
                             "reduce_gates": tuple(p.get("reduce_gates", ()))})
            for p in raw["partitions"])
        actions = tuple(Action(**a) for a in raw["actions"])
        return Plan(**{**raw, "partitions": partitions, "actions": actions})

    def without(self, partitions: frozenset[str] = frozenset(),
                actions: frozenset[int] = frozenset()) -> Plan:
        """This plan less some partitions (and the actions aimed at them) and some actions
        (by index)."""
        kept = tuple(p for p in self.partitions if p.id not in partitions)
        names = {p.id for p in kept}
        moves = tuple(a for n, a in enumerate(self.actions) if n not in actions
                      and ("partition" not in a.args or a.args["partition"] in names))
        return replace(self, partitions=kept, actions=moves)

    def size(self) -> str:
        """A short description of its size."""
        items = sum(len(p.items) for p in self.partitions)
        faults = sum(a.fault for a in self.actions)
        return (f"partitions={len(self.partitions)} items={items} "
                f"verbs={len(self.actions) - faults} faults={faults}")


def _item(raw: dict[str, Any]) -> ItemPlan:
    waits = {int(g): WaitPlan(**{**w, "via": tuple(w["via"])})
             for g, w in raw.get("waits", {}).items()}
    return ItemPlan(**{**raw, "script": tuple(raw["script"]), "waits": waits})


# -- the generator ----------------------------------------------------------------------

@dataclass(frozen=True)
class Size:
    """How big a generated plan is."""

    partitions: tuple[int, int] = (5, 8)
    items: tuple[int, int] = (2, 6)
    actions: tuple[int, int] = (6, 12)
    duration: float = 12.0
    processors: int = 3


SMALL = Size()


def _wait_plan(rng: random.Random) -> WaitPlan:
    mode = rng.choices(["complete", "timeout"], weights=[5, 1])[0]
    racers = rng.choices([1, 2, 3], weights=[4, 2, 1])[0]
    return WaitPlan(mode=mode, delay=round(rng.choice([0.0, rng.uniform(0, 2.0)]), 3),
                    racers=racers, via=tuple(rng.choice(["api", "client"])
                                             for _ in range(racers)),
                    heartbeat=rng.random() < 0.3)


def _plain(rng: random.Random, pid: str, at: float, size: Size) -> PartitionPlan:
    gates = rng.randint(1, 3)
    items = []
    for n in range(rng.randint(*size.items)):
        script = tuple(rng.choices([NEXT, WAIT, SPAWN], weights=[5, 3, 1])[0]
                       for _ in range(gates))
        waits = {g: _wait_plan(rng) for g, step in enumerate(script) if step == WAIT}
        items.append(ItemPlan(
            id=f"i{n}", script=script, wait_timeout=round(rng.uniform(1.0, 4.0), 2),
            spawn=rng.randint(1, 3) if SPAWN in script else 0,
            not_before=round(rng.uniform(0.5, 3.0), 2) if rng.random() < 0.15 else None,
            waits=waits))
    return PartitionPlan(id=pid, at=at, pipeline=rng.choice(PIPELINES), items=tuple(items),
                         gates=gates, key=rng.choice([None, *KEYS]),
                         priority=rng.randint(-2, 2))


def _quorum_burst(rng: random.Random, pid: str, at: float, size: Size) -> PartitionPlan:
    """The first k of N items at gate 0, every one answering at the same moment."""
    n = rng.randint(4, 8)
    gates = rng.randint(1, 2)
    items = tuple(ItemPlan(id=f"i{m}", script=(BURST,) + (NEXT,) * (gates - 1))
                  for m in range(n))
    return PartitionPlan(id=pid, at=at, pipeline=rng.choice(PIPELINES), items=items,
                         gates=gates, quorum={0: rng.randint(1, 3)}, kind="quorum_burst",
                         priority=rng.randint(-2, 2))


def _quorum_race(rng: random.Random, pid: str, at: float, size: Size) -> PartitionPlan:
    """The first k of N parked items, every completion sent at once."""
    n = rng.randint(6, 20)
    gates = rng.randint(1, 2)
    racers = rng.choice([1, 1, 2])
    items = tuple(ItemPlan(
        id=f"i{m}", script=(WAIT,) + (NEXT,) * (gates - 1), wait_timeout=30.0,
        waits={0: WaitPlan(mode="race", racers=racers,
                           via=tuple(rng.choice(["api", "client"]) for _ in range(racers)))})
        for m in range(n))
    return PartitionPlan(id=pid, at=at, pipeline=rng.choice(PIPELINES), items=items,
                         gates=gates, quorum={0: rng.randint(1, min(5, n))},
                         kind="quorum_race", priority=rng.randint(-2, 2))


# Partition kinds: weight and maker.
PARTITIONS: dict[str, tuple[int, Callable[[random.Random, str, float, Size], PartitionPlan]]] = {
    "plain": (6, _plain),
    "quorum_burst": (2, _quorum_burst),
    "quorum_race": (2, _quorum_race),
}
# The first letter of a partition's id says its kind.
PREFIX = {"plain": "p", "quorum_burst": "b", "quorum_race": "r"}


def _pid(plan_partitions: list[PartitionPlan], rng: random.Random) -> str | None:
    return rng.choice(plan_partitions).id if plan_partitions else None


def _service_fault(rng: random.Random) -> dict[str, Any]:
    """A service answers a few calls with 429 (and Retry-After), 503 or 502."""
    status = rng.choices([429, 503, 502], weights=[4, 1, 1])[0]
    retry_after = {429: rng.choice([3, 4, 5]), 503: rng.choice([None, 3])}.get(status)
    return {"service": rng.choice(["alpha", "beta", "beta"]), "status": status,
            "count": rng.randint(1, 3), "retry_after": retry_after}


# Action kinds: weight, whether a fault, and how it draws its arguments.
ArgsMaker = Callable[[random.Random, list[PartitionPlan], Size], dict[str, Any]]
ACTIONS: dict[str, tuple[int, bool, ArgsMaker]] = {
    "cancel": (2, False, lambda rng, ps, size: {"partition": _pid(ps, rng)}),
    "retry": (2, False, lambda rng, ps, size: {"partition": _pid(ps, rng)}),
    "pause_partition": (1, False, lambda rng, ps, size: {
        "partition": _pid(ps, rng), "seconds": round(rng.uniform(0.5, 3.0), 2)}),
    "pause_key": (1, False, lambda rng, ps, size: {
        "key": rng.choice(KEYS), "seconds": round(rng.uniform(0.5, 3.0), 2)}),
    "pause_all": (1, False, lambda rng, ps, size: {"seconds": round(rng.uniform(0.5, 2.0), 2)}),
    "kill": (3, True, lambda rng, ps, size: {"slot": rng.randrange(size.processors)}),
    "stop": (2, True, lambda rng, ps, size: {"slot": rng.randrange(size.processors),
                                             "seconds": round(rng.uniform(0.5, 3.0), 2)}),
    "pg_terminate": (1, True, lambda rng, ps, size: {}),
    "api_kill": (1, True, lambda rng, ps, size: {}),
    "api_stop": (1, True, lambda rng, ps, size: {"seconds": round(rng.uniform(0.3, 2.0), 2)}),
    "service_fault": (4, True, lambda rng, ps, size: _service_fault(rng)),
}
FAULT_KINDS = frozenset(kind for kind, (_, fault, _) in ACTIONS.items() if fault)


def _reduce(rng: random.Random, pid: str, at: float, size: Size) -> PartitionPlan:
    """A map, reduce (, map) partition: the reduce gate's one call for the whole gate,
    after per-item steps that spawn and park, on any pipeline (``gamma``: in batches)."""
    gates = rng.randint(2, 3)
    reduce_gate = rng.randint(1, gates - 1)
    items = []
    for n in range(rng.randint(*size.items)):
        script = tuple(REDUCE if g == reduce_gate
                       else rng.choices([NEXT, WAIT, SPAWN], weights=[5, 2, 1])[0]
                       for g in range(gates))
        waits = {g: _wait_plan(rng) for g, step in enumerate(script) if step == WAIT}
        items.append(ItemPlan(id=f"i{n}", script=script,
                              wait_timeout=round(rng.uniform(1.0, 4.0), 2),
                              spawn=rng.randint(1, 2) if SPAWN in script else 0, waits=waits))
    return PartitionPlan(id=pid, at=at, pipeline=rng.choice(ALL_PIPELINES), items=tuple(items),
                         gates=gates, key=rng.choice([None, *KEYS]),
                         priority=rng.randint(-2, 2), kind="reduce",
                         reduce_gates=(reduce_gate,))


def _extra_plain(rng: random.Random, pid: str, at: float, size: Size) -> PartitionPlan:
    """A plain partition on the batch pipeline or the one whose service goes down."""
    return replace(_plain(rng, pid, at, size), pipeline=rng.choice(EXTRA_PIPELINES))


def _extra_quorum(rng: random.Random, pid: str, at: float, size: Size) -> PartitionPlan:
    """A burst quorum answered in batches."""
    return replace(_quorum_burst(rng, pid, at, size), pipeline="gamma")


# The second stream's partition kinds (see :func:`generate`): weight and maker.
EXTRA_PARTITIONS: dict[str, tuple[int, Callable[[random.Random, str, float, Size],
                                                PartitionPlan]]] = {
    "reduce": (4, _reduce),
    "plain": (3, _extra_plain),
    "quorum_burst": (1, _extra_quorum),
}
EXTRA_PREFIX = {"reduce": "m", "plain": "x", "quorum_burst": "y"}


def _plain_pid(ps: list[PartitionPlan], rng: random.Random) -> str | None:
    """A partition a rewind or a set_gate may aim at: not a quorum's (a rewind counts a
    quorum again, which the quorum's property does not follow)."""
    return _pid([p for p in ps if not p.quorum], rng)


def _schedule(rng: random.Random, ps: list[PartitionPlan], size: Size) -> dict[str, Any]:
    every = rng.choice([1, 2, 2, 3])
    script = tuple(rng.choices([NEXT, WAIT], weights=[4, 1])[0]
                   for _ in range(rng.randint(1, 2)))
    return {"name": f"s{rng.randrange(1000):03d}", "every": every,
            "seconds": round(rng.uniform(3 * every, size.duration * 0.7), 2),
            "items": rng.randint(1, 3), "script": list(script),
            "pipeline": rng.choice(ALL_PIPELINES), "notify": rng.random() < 0.5}


# The second stream's action kinds: weight, whether a fault, how it draws its arguments.
EXTRA_ACTIONS: dict[str, tuple[int, bool, ArgsMaker]] = {
    "rewind": (3, False, lambda rng, ps, size: {
        "partition": _plain_pid(ps, rng), "gate": rng.randint(0, 2)}),
    "set_gate": (1, False, lambda rng, ps, size: {"partition": _plain_pid(ps, rng)}),
    "schedule": (2, False, _schedule),
    "service_down": (3, True, lambda rng, ps, size: {
        "seconds": round(rng.uniform(1.0, 4.0), 2)}),
    "sighup": (2, True, lambda rng, ps, size: {}),
    "sigterm": (2, True, lambda rng, ps, size: {"slot": rng.randrange(size.processors)}),
}
FAULT_KINDS = FAULT_KINDS | {kind for kind, (_, fault, _) in EXTRA_ACTIONS.items() if fault}


def generate(seed: int, size: Size = SMALL) -> Plan:
    """The plan of ``seed``: every partition, item, script and action drawn in one order
    from two streams, so the same seed makes the same plan.

    The first stream, ``random.Random(seed)``, draws what the first version of this
    generator drew, unchanged (so a seed kept in ``FOUND_SEEDS`` still makes the plan
    that found its defect); the second, ``random.Random(f"extra/{seed}")``, adds reduce
    partitions, partitions on the batch and outage pipelines, notify URLs, a schedule,
    rewinds, set_gates, services down, SIGHUPs and SIGTERMs."""
    rng = random.Random(seed)
    partitions: list[PartitionPlan] = []
    kinds = list(PARTITIONS)
    for n in range(rng.randint(*size.partitions)):
        kind = rng.choices(kinds, weights=[PARTITIONS[k][0] for k in kinds])[0]
        at = 0.0 if n < 2 else round(rng.uniform(0, size.duration * 0.7), 2)
        partitions.append(PARTITIONS[kind][1](rng, f"{PREFIX[kind]}{n:02d}", at, size))
    partitions.sort(key=lambda p: p.at)
    names = list(ACTIONS)
    actions = []
    for _ in range(rng.randint(*size.actions)):
        kind = rng.choices(names, weights=[ACTIONS[k][0] for k in names])[0]
        actions.append(Action(at=round(rng.uniform(0.3, size.duration), 2), kind=kind,
                              args=ACTIONS[kind][2](rng, partitions, size)))
    limits = {key: rng.randint(1, 4) for key in KEYS}
    extra = random.Random(f"extra/{seed}")
    kinds = list(EXTRA_PARTITIONS)
    base = len(partitions)
    for n in range(extra.randint(2, 4)):
        kind = extra.choices(kinds, weights=[EXTRA_PARTITIONS[k][0] for k in kinds])[0]
        at = round(extra.uniform(0, size.duration * 0.6), 2)
        partitions.append(EXTRA_PARTITIONS[kind][1](
            extra, f"{EXTRA_PREFIX[kind]}{base + n:02d}", at, size))
    partitions = [replace(p, notify=extra.random() < 0.35) for p in partitions]
    partitions.sort(key=lambda p: p.at)
    names = list(EXTRA_ACTIONS)
    for _ in range(extra.randint(2, 5)):
        kind = extra.choices(names, weights=[EXTRA_ACTIONS[k][0] for k in names])[0]
        actions.append(Action(at=round(extra.uniform(0.5, size.duration * 0.8), 2), kind=kind,
                              args=EXTRA_ACTIONS[kind][2](extra, partitions, size)))
    actions.sort(key=lambda a: a.at)
    return Plan(seed=seed, processors=size.processors, key_limits=limits,
                partitions=tuple(partitions), actions=tuple(actions),
                duration=size.duration)
