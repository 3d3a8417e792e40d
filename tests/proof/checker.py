"""Each guarantee as a pure function over a history (:mod:`tests.proof.history`),
returning its violations, each with a minimal excerpt of the events that show it.

Times are on the run's clock. Where a guarantee allows the fleet a moment to learn of
something (a pause, a hold, a cancel), :data:`GRACE` is that moment; a processor frozen
by SIGSTOP (or killed) near the moment is let off, since what it had under way before
the freeze arrives late by design.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from tests.proof.features import (
    notify_once,
    outage_unpaid,
    reduce_once,
    routes_reloaded,
    schedule_ticks,
    sigterm_hands_over,
)
from tests.proof.history import Event, History
from tests.proof.view import GRACE, HOLD_MARGIN, NOT_BEFORE_LEEWAY, Entry, View, Violation

__all__ = ["GRACE", "GUARANTEES", "Violation", "check"]


# -- the guarantees ---------------------------------------------------------------------

def steps_applied_once(view: View) -> list[Violation]:
    """Each step is applied exactly once per rewind epoch: every step of every item's
    trail was written from a call answered for that very step (a completion of its wait
    that was not refused, or a reduce call that named the item), no gate is left twice
    unless a rewind to it or below came between, and repeated calls for one step share
    one Idempotency-Key per epoch (a rewind or a retry begins one; one key names one
    step)."""
    found: list[Violation] = []
    for pid, item in view.items():
        left: dict[int, Entry] = {}
        for entry in view.trail(item):
            name = f"{pid}/{item['id']} step {entry}"
            if (entry.leaves and entry.gate in left
                    and not view.rewound(pid, entry.gate,
                                         view.written_at(pid, item["id"], left[entry.gate])
                                         or 0.0, view.source_start(entry) or 0.0)):
                found.append(Violation("exactly-once", f"{name}: gate {entry.gate} left "
                                       f"twice ({left[entry.gate]} and {entry})", [item]))
            if entry.leaves:
                left[entry.gate] = entry
            wrong = _not_written_by_its_source(view, pid, item, entry)
            if wrong is not None:
                found.append(Violation("exactly-once", f"{name}: {wrong[0]}", wrong[1]))
    keys: dict[tuple[Any, ...], set[str]] = defaultdict(set)
    steps: dict[str, set[tuple[Any, ...]]] = defaultdict(set)
    for call in view.calls.values():
        if call["trail"] is None or not call["key"]:
            continue
        step = (call["partition"], call["item"], call["gate"], call["trail"])
        keys[step].add(call["key"])
        steps[call["key"]].add(step)
    for step, named in keys.items():
        if len(named) > 1 + _epochs_between(view, step):
            found.append(Violation("exactly-once", f"step {step} sent with {len(named)} "
                                   f"Idempotency-Keys", _calls_for(view, step)))
    for key, named_steps in steps.items():
        if len(named_steps) > 1:
            found.append(Violation("exactly-once", f"key {key} sent for {len(named_steps)} "
                                   f"steps: {sorted(named_steps)}"))
    return found


def _not_written_by_its_source(view: View, pid: str, item: Event, entry: Entry
                               ) -> tuple[str, list[Event]] | None:
    """What is wrong with the source of a trail's step (``None``: nothing)."""
    if entry.how in ("n", "w"):
        call = view.calls.get(entry.source)
        if (call is None or call["outcome"] != "ok" or call["partition"] != pid
                or call["item"] != item["id"] or call["gate"] != entry.gate
                or ("wait" in (call["answer"] or {})) != (entry.how == "w")):
            return "not written by a call answered for it", [item, *([call] if call else [])]
    elif entry.how == "r":
        reduce = view.reduces.get(entry.source)
        if (reduce is None or reduce["outcome"] != "ok" or reduce["partition"] != pid
                or reduce["gate"] != entry.gate or item["id"] not in reduce["items"]):
            return ("not written by a reduce call that named it",
                    [item, *([reduce] if reduce else [])])
    else:
        tries = view.by_cid.get(entry.source, [])
        if (not tries or any(t["partition"] != pid or t["item"] != item["id"]
                             or t["gate"] != entry.gate for t in tries)):
            return "no completion made it", [item, *tries]
        if all(t["status"] in (409, 404, 400) for t in tries):
            return "applied, yet every try was refused", [item, *tries]
    return None


def _epochs_between(view: View, step: tuple[Any, ...]) -> int:
    """How many verbs that start an item's step afresh came between the step's calls: a
    rewind of its partition to its gate or below, or a retry of its failed items. A
    step's key is its item's version less its failed attempts
    (``watcher.protocol.step_key``); both verbs move the version on and reset the
    attempts, so each may add one key (a handler that stored a failure under the old
    key would answer it again). A verb counts from :data:`GRACE` before the first call
    (one sent before it may reach the handler late) to the start of the last, unless it
    reset no item."""
    pid, _, gate, _ = step
    starts = [c["started"] for c in _calls_for(view, step)]
    verbs = [*(r for r in view.done("rewind", pid) if r["args"]["gate"] <= gate),
             *view.done("retry", pid)]
    return sum(1 for v in verbs if v["finished"] >= min(starts) - GRACE
               and v["started"] <= max(starts) and "items_reset=0," not in v.get("answer", ""))


def _calls_for(view: View, step: tuple[Any, ...]) -> list[Event]:
    return [c for c in view.calls.values()
            if (c["partition"], c["item"], c["gate"], c["trail"]) == step]


def gate_order(view: View) -> list[Violation]:
    """No call at gate h of a partition starts before every step that moved an item of
    it on from a gate below h has been written (within one rewind epoch, and unless an
    operator's set_gate moved the partition on to h before the call)."""
    found: list[Violation] = []
    writes: dict[str, list[tuple[float, int, str, Entry]]] = defaultdict(list)
    for pid, item in view.items():
        for entry in view.trail(item):
            at = view.written_at(pid, item["id"], entry) if entry.leaves else None
            if at is not None:
                writes[pid].append((at, entry.gate, item["id"], entry))
    for call in view.calls.values():
        pid = call["partition"]
        moved = any(v["args"].get("gate", -1) >= call["gate"] and v["started"] <= call["started"]
                    for v in view.done("set_gate", pid))
        for at, gate, item_id, entry in writes.get(pid, ()):
            if moved or view.rewound(pid, gate, call["started"], at):
                continue
            if gate < call["gate"] and call["started"] < at:
                found.append(Violation(
                    "gate-order", f"call {call['seq']} at gate {call['gate']} of "
                    f"{call['partition']} started at {call['started']} before "
                    f"{item_id} left gate {gate} ({entry}) at {at}", [call]))
                break
    return found


def spawn_once(view: View) -> list[Violation]:
    """The items an answer spawns exist exactly once, with their parent, if and only if
    that answer was written."""
    found: list[Violation] = []
    for pid, items in view.final["items"].items():
        by_id: dict[str, list[Event]] = defaultdict(list)
        for item in items:
            by_id[item["id"]].append(item)
        spawned_by: dict[str, str] = {}
        for item in items:
            for entry in view.trail(item):
                call = view.calls.get(entry.source) if entry.how == "n" else None
                for child in ((call or {}).get("answer") or {}).get("spawn", ()):
                    spawned_by[child["id"]] = item["id"]
                    copies = by_id.get(child["id"], [])
                    if len(copies) != 1 or copies[0]["parent"] != item["id"]:
                        found.append(Violation("spawn-once", f"{pid}/{child['id']} spawned by "
                                               f"the written step {entry} of {item['id']} "
                                               f"exists {len(copies)} times", [call, *copies]))
        for item in items:
            if item["parent"] is not None and spawned_by.get(item["id"]) != item["parent"]:
                found.append(Violation("spawn-once", f"{pid}/{item['id']} exists, but no "
                                       f"written step of {item['parent']} spawned it", [item]))
    return found


def waits_once(view: View) -> list[Violation]:
    """A wait is completed at most once: one 200 per token at most, and every try that
    starts after a 200 was answered gets 409."""
    found: list[Violation] = []
    by_token: dict[str, list[Event]] = defaultdict(list)
    for event in view.completions:
        by_token[event["token"]].append(event)
    for token, tries in by_token.items():
        wins = [t for t in tries if t["status"] == 200]
        if len(wins) > 1:
            found.append(Violation("wait-once", f"token …{token[-8:]} completed "
                                   f"{len(wins)} times", wins))
        if wins:
            first = min(w["finished"] for w in wins)
            late = [t for t in tries if t["started"] > first and t["status"] not in (409, "cut")]
            if late:
                found.append(Violation("wait-once", f"token …{token[-8:]}: a try after its "
                                       f"completion answered {late[0]['status']}, not 409",
                                       [*wins, *late]))
    return found


def quorum_exact(view: View) -> list[Violation]:
    """Exactly k items pass a quorum gate ``{gate: k}`` (at most k while the partition is
    open, failed or cancelled): the others are skipped."""
    found: list[Violation] = []
    for pid, create in view.creates.items():
        for gate_text, k in (create.get("quorum") or {}).items():
            gate = int(gate_text)
            items = view.final["items"].get(pid, [])
            passed = [item for item in items
                      if any(e.leaves and e.gate == gate for e in view.trail(item))]
            status = view.final["partitions"].get(pid, {}).get("status")
            if len(passed) > k or (status == "complete" and len(passed) != k
                                   and len(items) >= k):
                found.append(Violation(
                    "quorum-exact", f"{pid}: {len(passed)} items passed gate {gate} of "
                    f"quorum {k} (partition {status}, {len(items)} items)",
                    [create, *passed[: k + 2]]))
    return found


def retry_after_honoured(view: View) -> list[Violation]:
    """No call to a service is made while its Retry-After hold runs, from any processor
    (once the fleet has had :data:`GRACE` to learn of it): a call counts from when its
    processor built it (:meth:`View.made`), not from when it reached the handler."""
    found: list[Violation] = []
    holds = [c for c in view.calls.values()
             if c["status"] in (429, 503) and c.get("retry_after")]
    for hold in holds:
        start = hold["finished"] + GRACE
        end = hold["finished"] + float(hold["retry_after"]) - HOLD_MARGIN
        if view.frozen(hold["caller"], hold["started"] - 0.5, start):
            continue  # the processor that was told may not have told the fleet
        inside = [c for c in view.calls.values()
                  if c["service"] == hold["service"] and start < view.made(c) < end
                  and not view.frozen(c["caller"], hold["finished"], c["started"])]
        if inside:
            callers = sorted({c["caller"] for c in inside})
            told = sorted({c["caller"] for c in view.calls.values()
                           if c["service"] == hold["service"]
                           and c["started"] < hold["finished"]})
            found.append(Violation(
                "retry-after", f"{len(inside)} calls to {hold['service']} by {callers} "
                f"during the {hold['retry_after']} s hold answered at {hold['finished']} "
                f"to {hold['caller']} (callers of {hold['service']} before it: {told})",
                [hold, *inside]))
    return found


def key_limits(view: View) -> list[Violation]:
    """The calls in flight for a key never exceed its limit."""
    found: list[Violation] = []
    plan_limits = _plan(view).get("key_limits", {})
    key_of = {pid: create.get("key") for pid, create in view.creates.items()}
    by_key: dict[str, list[Event]] = defaultdict(list)
    for call in view.calls.values():
        key = key_of.get(call["partition"])
        if key is not None and key in plan_limits:
            by_key[key].append(call)
    end_of_run = view.final.get("finished", float("inf"))
    for key, calls in by_key.items():
        moments = sorted([(c["started"], 1, c["seq"]) for c in calls]
                         + [(c["finished"] if c["finished"] is not None else end_of_run,
                             -1, c["seq"]) for c in calls], key=lambda m: (m[0], m[1]))
        running: set[int] = set()
        ended: set[int] = set()  # a call answered at once ends the moment it starts
        for _, step, seq in moments:
            if step == 1 and seq not in ended:
                running.add(seq)
                if len(running) > plan_limits[key]:
                    found.append(Violation(
                        "key-limit", f"key {key}: {len(running)} calls in flight, limit "
                        f"{plan_limits[key]}", [view.calls[s] for s in sorted(running)]))
                    break
            else:
                running.discard(seq)
                ended.add(seq)
    return found


def _plan(view: View) -> dict[str, Any]:
    plans = view.history.of("plan")
    return json.loads(plans[0]["plan"]) if plans else {}


def nothing_lost(view: View) -> list[Violation]:
    """Every partition created ends (complete, failed or cancelled) within the run's
    patience, and every item of a complete partition is explained by its trail:
    complete after leaving each gate from its first to its last, or skipped."""
    found: list[Violation] = []
    partitions = view.final["partitions"]
    for pid, create in view.creates.items():
        if create.get("error"):
            continue
        info = partitions.get(pid)
        if info is None:
            found.append(Violation("nothing-lost", f"{pid} was created and is gone", [create]))
        elif info["status"] not in ("complete", "failed", "cancelled"):
            found.append(Violation("nothing-lost", f"{pid} never ended: {info}", [create]))
    for pid, item in view.items():
        if partitions[pid]["status"] != "complete" or item["status"] == "skipped":
            continue
        data = item.get("data") or {}
        first, last = data.get("g0", 0), data.get("last", 0)
        gates = [e.gate for e in view.trail(item) if e.leaves]
        if view.done("rewind", pid):  # each epoch leaves the gates from its own
            gates = sorted(set(gates)) if gates and gates[-1] == last else gates
        if item["status"] != "complete" or gates != list(range(first, last + 1)):
            found.append(Violation("nothing-lost", f"{pid}/{item['id']} {item['status']} at "
                                   f"gate {item['gate']} in a complete partition, gates left "
                                   f"{gates}", [{k: v for k, v in item.items() if k != 'data'}]))
    return found


def not_before_kept(view: View) -> list[Violation]:
    """No item is called before its ``not_before`` (by the database clock), unless a
    rewind of its partition to its gate or below began before the call: a rewind sends
    its items back ready at once (docs/how-to/rewind.md)."""
    found: list[Violation] = []
    for pid, create in view.creates.items():
        rewinds = view.done("rewind", pid)
        for item_id, at in (create.get("not_before") or {}).items():
            early = [c for c in view.calls.values() if c["partition"] == pid
                     and c["item"] == item_id and c["started"] < at - NOT_BEFORE_LEEWAY
                     and not any(r["args"]["gate"] <= c["gate"]
                                 and r["started"] <= c["started"] for r in rewinds)]
            if early:
                found.append(Violation("not-before", f"{pid}/{item_id} called at "
                                       f"{early[0]['started']}, not before {at}",
                                       [create, *early]))
    return found


def pauses_hold(view: View) -> list[Violation]:
    """A paused partition, key or fleet starts no call from :data:`GRACE` after the
    pause until its resume."""
    found: list[Violation] = []
    key_of = {pid: create.get("key") for pid, create in view.creates.items()}
    resumes = [v for v in view.verbs if v["name"].startswith("resume_")]
    for pause in view.verbs:
        if not pause["name"].startswith("pause_") or pause.get("error"):
            continue
        scope = pause["name"][len("pause_"):]
        if pause.get("answer") == "False":
            continue  # nothing to pause (a finished partition)
        resume = next((r for r in resumes if r["name"] == f"resume_{scope}"
                       and r["args"] == pause["args"] and r["started"] >= pause["finished"]),
                      None)
        start = pause["finished"] + GRACE
        end = resume["started"] if resume else float("inf")
        args = pause["args"]
        inside = [c for c in view.calls.values() if start < view.made(c) < end
                  and (scope == "all"
                       or (scope == "partition" and c["partition"] == args.get("partition"))
                       or (scope == "key" and key_of.get(c["partition"]) == args.get("key")))
                  and not view.frozen(c["caller"], pause["started"], c["started"])]
        if inside:
            found.append(Violation("pause", f"{len(inside)} calls started during the "
                                   f"{pause['name']} {pause['args']}", [pause, *inside[:4]]))
    return found


def cancel_stops(view: View) -> list[Violation]:
    """Nothing of a cancelled partition is written after the cancel, and no call for it
    starts from :data:`GRACE` after (until a retry resumes it)."""
    found: list[Violation] = []
    for cancel in view.verbs:
        if cancel["name"] != "cancel" or cancel.get("answer") != "True":
            continue
        pid = cancel["args"]["partition"]
        after = cancel["finished"]
        retry = min((v["started"] for v in view.verbs if v["name"] in ("retry", "rewind")
                     and v["args"].get("partition") == pid and v["started"] >= after),
                    default=float("inf"))
        for item in view.final["items"].get(pid, []):
            for entry in view.trail(item):
                at = view.written_at(pid, item["id"], entry)
                source = (view.reduces.get(entry.source) if entry.how == "r"
                          else view.calls.get(entry.source) if entry.how != "c"
                          else (view.by_cid.get(entry.source) or [None])[0])
                began = (source or {}).get("started")
                if began is not None and after < began < retry:
                    found.append(Violation("cancel", f"{pid}/{item['id']} step {entry} written "
                                           f"from a call or completion begun at {began} (written "
                                           f"from {at}), after the cancel", [cancel, source]))
        late = [c for c in view.calls.values() if c["partition"] == pid
                and after + GRACE < view.made(c) < retry
                and not view.frozen(c["caller"], cancel["started"], c["started"])]
        if late:
            found.append(Violation("cancel", f"{len(late)} calls for {pid} after its cancel",
                                   [cancel, *late[:4]]))
    return found


GUARANTEES: dict[str, Callable[[View], list[Violation]]] = {
    "exactly-once": steps_applied_once,
    "gate-order": gate_order,
    "spawn-once": spawn_once,
    "wait-once": waits_once,
    "quorum-exact": quorum_exact,
    "retry-after": retry_after_honoured,
    "key-limit": key_limits,
    "nothing-lost": nothing_lost,
    "not-before": not_before_kept,
    "pause": pauses_hold,
    "cancel": cancel_stops,
    "reduce-once": reduce_once,
    "notify": notify_once,
    "schedule": schedule_ticks,
    "outage-unpaid": outage_unpaid,
    "routes-reload": routes_reloaded,
    "handover": sigterm_hands_over,
}


def check(history: History, only: Iterable[str] | None = None) -> list[Violation]:
    """Every guarantee's violations in ``history`` (or those of the ``only`` names)."""
    view = View(history)
    names = list(only) if only is not None else list(GUARANTEES)
    return [violation for name in names for violation in GUARANTEES[name](view)]
