"""The guarantees of reduce gates, notifications, schedules, handler outages, routes
reloads and SIGTERM hand-overs, each a pure function over a history's :class:`View`
(the rest are in :mod:`tests.proof.checker`, which lists them all in ``GUARANTEES``).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from tests.proof.history import Event
from tests.proof.view import GRACE, View, Violation

# The faults that may cost an attempt with no call reaching the handler (a processor
# gone or frozen between its claim and its call), or leave a schedule's tick to a late
# ticker; a window around one is excused.
PROCESS_FAULTS = frozenset({"kill", "stop", "sigterm", "pg_terminate", "api_kill"})
# A ticker reads the due schedules once a second.
TICK_PERIOD = 1.0
# How long a SIGTERMed processor's calls in flight may run and still be written.
SHUTDOWN_TIMEOUT = 5.0


def _reached(view: View, item: Event, gate: int) -> bool:
    data = item.get("data") or {}
    return data.get("g0", 0) == gate or any(
        e.leaves and e.gate == gate - 1 for e in view.trail(item))


def reduce_once(view: View) -> list[Violation]:
    """A reduce gate's items all leave it by one reduce call per epoch (the last one
    that wrote), and that call named exactly the items that reached the gate; the
    result stored is that call's; every retry of a reduce in one epoch (same gate,
    same items) carries one Idempotency-Key."""
    found: list[Violation] = []
    for pid, create in view.creates.items():
        info = view.final["partitions"].get(pid)
        if info is None or info["status"] != "complete":
            continue
        items = view.final["items"].get(pid, [])
        for gate in create.get("reduce_gates") or ():
            writers = {e.source for item in items for e in view.trail(item)
                       if e.how == "r" and e.gate == gate}
            last = {max((e.source for e in view.trail(item) if e.how == "r"
                         and e.gate == gate), default=None) for item in items
                    if _reached(view, item, gate)}
            if len(last) != 1 or None in last:
                found.append(Violation("reduce-once", f"{pid}: the items at reduce gate "
                                       f"{gate} left it by reduce calls {sorted(map(str, last))}"
                                       f", not one", [view.reduces[s] for s in writers
                                                      if s in view.reduces]))
                continue
            (seq,) = last
            reduce = view.reduces.get(seq)
            at_gate = sorted(item["id"] for item in items if _reached(view, item, gate))
            if reduce is None or reduce["items"] != at_gate:
                found.append(Violation("reduce-once", f"{pid}: reduce call {seq} at gate "
                                       f"{gate} named {reduce and reduce['items']}, the gate "
                                       f"held {at_gate}", [reduce] if reduce else []))
            elif info.get("result") != {"reduce": seq, "items": at_gate}:
                found.append(Violation("reduce-once", f"{pid}: result {info.get('result')} is "
                                       f"not that of reduce call {seq}", [reduce]))
        by_items: dict[tuple[int, tuple[str, ...]], set[str]] = defaultdict(set)
        for reduce in view.reduces.values():
            if reduce["partition"] == pid and not view.done("rewind", pid):
                by_items[(reduce["gate"], tuple(reduce["items"]))].add(reduce["key"])
        for (gate, ids), keys in by_items.items():
            if len(keys) > 1:
                found.append(Violation("reduce-once", f"{pid}: the reduce of gate {gate} over "
                                       f"{list(ids)} sent with {len(keys)} Idempotency-Keys"))
    return found


def notify_once(view: View) -> list[Violation]:
    """Each end of a partition that names a notify URL makes one event, delivered at
    least once, with the same id (and body) on every delivery and a good signature; the
    last event's type is the partition's final status; a partition without a URL has
    none; no more events than ends (its first, and one per retry, rewind or cancel)."""
    found: list[Violation] = []
    by_pid: dict[str, list[Event]] = defaultdict(list)
    for notice in view.history.of("notice"):
        by_pid[notice["partition"]].append(notice)
    schedules = {s["name"]: s for s in view.history.of("schedule")}
    for pid, notices in by_pid.items():
        create = view.creates.get(pid)
        schedule = schedules.get(pid.split("/", 1)[0]) if "/" in pid else None
        named = create.get("notify") if create else (schedule or {}).get("notify")
        if not named:
            found.append(Violation("notify", f"{pid} names no notify URL, yet "
                                   f"{len(notices)} events came", notices[:3]))
            continue
        bodies: dict[str, set[tuple[object, ...]]] = defaultdict(set)
        for notice in notices:
            bodies[notice["id"]].add((notice["body_id"], notice["type"], notice["partition"]))
            if not notice["signed"] or notice["body_id"] != notice["id"]:
                found.append(Violation("notify", f"{pid}: event {notice['id']} unsigned or "
                                       "its body's id is not its header's", [notice]))
        for event_id, seen in bodies.items():
            if len(seen) > 1:
                found.append(Violation("notify", f"{pid}: event {event_id} delivered with "
                                       f"{len(seen)} different bodies", notices))
        ends = 1 + sum(len(view.done(verb, pid)) for verb in ("retry", "rewind", "cancel"))
        if len(bodies) > ends:
            found.append(Violation("notify", f"{pid}: {len(bodies)} events for at most {ends} "
                                   "ends", notices[:6]))
    for pid, info in view.final["partitions"].items():
        create = view.creates.get(pid)
        if create is None or not create.get("notify"):
            continue
        delivered = [n for n in by_pid.get(pid, []) if n["status"] == 200]
        last = max(delivered, key=lambda n: n["at"]) if delivered else None
        if last is None or last["type"] != f"partition.{info['status']}":
            found.append(Violation("notify", f"{pid} ended {info['status']}, last event "
                                   f"delivered: {last and last['type']}", [create]))
    return found


def _db_time(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=None).timestamp()


def schedule_ticks(view: View) -> list[Violation]:
    """A schedule makes one partition per tick across the fleet: each ``NAME/<tick>``
    on the schedule's grid (its first tick plus whole periods), none after its delete;
    every one ends; and no period is lost beyond what a ticker's second, the catch-up
    policy (``skip``: the latest missed tick) and a faulted processor explain."""
    found: list[Violation] = []
    partitions = view.final["partitions"]
    for schedule in view.history.of("schedule"):
        if schedule.get("error") or not schedule.get("first_tick"):
            continue
        name, every = schedule["name"], schedule["every"]
        first = _db_time(schedule["first_tick"])
        deleted = _db_time(schedule["db_deleted"]) if schedule.get("db_deleted") else None
        ticks = sorted(_db_time(pid.split("/", 1)[1].rstrip("Z"))
                       for pid in partitions if pid.startswith(f"{name}/"))
        for pid in partitions:
            if pid.startswith(f"{name}/") and partitions[pid]["status"] not in (
                    "complete", "failed", "cancelled"):
                found.append(Violation("schedule", f"{pid} never ended"))
        for tick in ticks:
            periods = (tick - first) / every
            if periods < -1e-6 or abs(periods - round(periods)) > 1e-6:
                found.append(Violation("schedule", f"{name}: tick {tick - first:+.3f} s from "
                                       f"the first is off its {every} s grid", [schedule]))
            if deleted is not None and tick > deleted + 1e-6:
                found.append(Violation("schedule", f"{name}: tick {tick - first:+.3f} s after "
                                       "its delete", [schedule]))
        offset = _db_time(schedule["db_added"]) - schedule["started"]
        last_due = (deleted if deleted is not None else ticks[-1] if ticks else first)
        expected = [first + n * every for n in range(int((last_due - first) // every) + 1)
                    if first + n * every <= last_due - every - 2 * TICK_PERIOD]
        have = [first - every, *ticks]
        for tick in expected:
            later = [t for t in have if t >= tick - 1e-6]
            made = min(later) if later else None
            if made is not None and made - tick < every + 2 * TICK_PERIOD + GRACE:
                continue  # made, or passed over for a later one a ticker's second late
            start, end = tick - offset - 1.0, tick - offset + every + 2 * TICK_PERIOD
            if any(f["name"] in PROCESS_FAULTS and f["started"] <= end
                   and (f["finished"] or float("inf")) >= start for f in view.faults):
                continue
            found.append(Violation("schedule", f"{name}: no partition for the tick "
                                   f"{tick - first:+.0f} s from the first, nor within "
                                   f"{every + 2 * TICK_PERIOD + GRACE} s after it",
                                   [schedule]))
    return found


def outage_unpaid(view: View) -> list[Violation]:
    """A call that met no answer from its service (connection refused, a cut) spends
    no attempt: an item's attempt number at a gate is at most one more than the calls
    for it there that reached the handler before (each may have spent one), except
    where a processor fault in between may have spent one with no call made."""
    found: list[Violation] = []
    calls: dict[tuple[str, str, int], list[Event]] = defaultdict(list)
    for call in sorted(view.calls.values(), key=lambda c: c["started"]):
        calls[(call["partition"], call["item"], call["gate"])].append(call)
    for (pid, item_id, gate), series in calls.items():
        for n, call in enumerate(series):
            spent = call["attempt"] - 1 - n
            if spent <= 0:
                continue
            since = series[n - 1]["started"] if n else view.creates.get(
                pid, {}).get("started", 0.0)
            excused = sum(1 for f in view.faults if f["name"] in PROCESS_FAULTS
                          and f["started"] <= call["started"]
                          and (f["finished"] or float("inf")) >= since)
            excused += sum(1 for v in view.verbs
                           if v.get("args", {}).get("partition") in (pid, None)
                           and v["started"] <= call["started"] and v["finished"] >= since)
            if spent > excused:
                found.append(Violation(
                    "outage-unpaid", f"{pid}/{item_id} gate {gate}: attempt "
                    f"{call['attempt']} after {n} calls reached the handler, {excused} "
                    "faults or verbs between", [*series[max(0, n - 3):n + 1]]))
                break
    return found


def routes_reloaded(view: View) -> list[Violation]:
    """After a SIGHUP with a rewritten routes file, each processor's calls that start
    :data:`GRACE` later carry the new file's headers."""
    found: list[Violation] = []
    for hup in (f for f in view.faults if f["name"] == "sighup"):
        owners = set(hup.get("owners") or ())
        stale = [c for c in view.calls.values() if c["caller"] in owners
                 and c["started"] > hup["finished"] + GRACE
                 and c.get("routes") is not None and int(c["routes"]) < hup["generation"]
                 and not view.frozen(c["caller"], hup["started"], c["started"])]
        if stale:
            found.append(Violation("routes-reload", f"{len(stale)} calls by "
                                   f"{sorted({c['caller'] for c in stale})} with routes older "
                                   f"than generation {hup['generation']} after its SIGHUP",
                                   [hup, *stale[:4]]))
    return found


# What asyncio reports for a child whose exit status another wait took ("Unknown child
# process pid N, will report returncode 255").
LOST_STATUS = 255


def sigterm_hands_over(view: View) -> list[Violation]:
    """A processor that had started and is sent SIGTERM exits 0, and its calls in flight
    then are answered and not given up (unless a verb or quorum of their partition gave
    them up)."""
    found: list[Violation] = []
    for term in (f for f in view.faults if f["name"] == "sigterm"):
        if not term.get("ready"):
            continue  # SIGTERM before its handlers were installed ends it by default
        lost_status = term.get("exit") == LOST_STATUS and term.get("stopped_cleanly")
        if term.get("exit") != 0 and not lost_status:
            found.append(Violation("handover", f"{term['target']} exited {term.get('exit')} "
                                   "after SIGTERM", [term]))
        quorum = {pid for pid, c in view.creates.items() if c.get("quorum")}
        cut = [c for c in view.calls.values() if c["caller"] == term["target"]
               and c["started"] < term["started"] and c["outcome"] == "abandoned"
               and c["partition"] not in quorum
               and (c["finished"] or 0) - c["started"] < SHUTDOWN_TIMEOUT
               and not any(v["args"].get("partition") in (c["partition"], None)
                           and v["started"] <= (c["finished"] or float("inf"))
                           for v in view.verbs if v["finished"] >= c["started"])]
        if cut:
            found.append(Violation("handover", f"{term['target']}'s {len(cut)} calls in flight "
                                   "at SIGTERM were given up", [term, *cut[:4]]))
    return found
