"""One plan against one database: a migrated namespace of its own, the scripted handler
on loopback, ``processor api`` and the plan's ``processor run`` processes, the timeline
played (creates, verbs, faults), then every pause lifted, the run left to settle, and the
final state read back through the client into the history.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine

from processor import AsyncClient, NewItem, StatefeedError
from tests.acceptance.harness.database import Sessions
from tests.proof.actors import (
    PERFORM,
    Actors,
    Completer,
    DownableServer,
    Fleet,
    NoticeReceiver,
)
from tests.proof.checker import Violation, check
from tests.proof.handler import ScriptedHandler, item_data
from tests.proof.history import Event, History
from tests.proof.plan import BURST, PartitionPlan, Plan
from tests.support.namespaces import fresh_namespace, session_pool
from tests.support.servers import serve_app
from watcher.errors import DatabaseError
from watcher.store.db.urls import parse_database_url

ENDED = ("complete", "failed", "cancelled")
# The log lines of a ``processor run`` whose watcher and schedules' ticker run.
READY_LINES = ("action=watcher_started", "action=ticker_started")
# How long the fleet may take to start (imports, a first connection) on a loaded machine.
FLEET_START_TIMEOUT = 90.0
SETTLE_TIMEOUT = 60.0
# How long the run waits, once every partition ended, for their notifications to be sent
# (a delivery refused once is sent again after --notify-backoff, 1 s, with jitter).
NOTIFY_PATIENCE = 20.0


@dataclass
class Outcome:
    """A run's plan, history and the violations found in it."""

    plan: Plan
    history: History
    violations: list[Violation]

    def faults(self) -> dict[str, int]:
        """How many faults of each kind the run dealt."""
        counts: dict[str, int] = {}
        for event in self.history.of("fault"):
            counts[event["name"]] = counts.get(event["name"], 0) + 1
        return counts


@contextlib.contextmanager
def namespace(db_url: str) -> Iterator[str]:
    """An empty migrated table prefix: borrowed from the test session's pool under pytest,
    else migrated for this run and dropped after it."""
    pool = session_pool()
    if pool is not None:
        with pool.borrow(db_url) as prefix:
            yield prefix
    else:
        with fresh_namespace(db_url) as prefix:
            yield prefix


async def run_plan(plan: Plan, db_url: str, workdir: Path, *,
                   settle_timeout: float = SETTLE_TIMEOUT) -> Outcome:
    """Play ``plan`` on ``db_url`` (processes' files under ``workdir``) and check it."""
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    dialect = parse_database_url(db_url).dialect
    history = History()
    history.add("plan", plan=plan.to_json(), db=dialect, wall=history.wall)
    with namespace(db_url) as prefix:
        await _run(plan, db_url, prefix, workdir, history, dialect, settle_timeout)
    return Outcome(plan, history, check(history))


async def _run(plan: Plan, db_url: str, prefix: str, workdir: Path, history: History,
               dialect: str, settle_timeout: float) -> None:
    async with contextlib.AsyncExitStack() as stack:
        client = AsyncClient(db_url, prefix)
        stack.push_async_callback(client.close)
        sessions = None
        if dialect == "postgresql":
            engine = create_async_engine(parse_database_url(db_url).async_url)
            stack.push_async_callback(engine.dispose)
            sessions = Sessions(engine, f"sfp-{uuid.uuid4().hex[:10]}_")
        completer: list[Completer] = []
        handler = ScriptedHandler(
            history, {p.id: len(p.items) for p in plan.partitions if BURST in p.items[0].script},
            lambda call, data: completer[0].on_park(call, data))
        base_url = await stack.enter_async_context(serve_app(handler))
        down = DownableServer(handler)
        await down.start()
        stack.push_async_callback(down.stop)
        notify_url = await stack.enter_async_context(serve_app(NoticeReceiver(history)))
        fleet = Fleet(workdir, db_url, prefix, base_url, sessions, down_url=down.url)
        stack.push_async_callback(fleet.kill_everyone)
        completer.append(Completer(plan, history, fleet, client))
        for key, limit in plan.key_limits.items():
            await client.set_key_limit(key, limit, define=True)
        await fleet.start_api()
        for slot in range(plan.processors):
            await fleet.start(slot)
        await _fleet_started(fleet)
        actors = Actors(fleet, client, handler, history, down, f"{notify_url}/hook")
        zero = history.now()
        await asyncio.gather(*(_at(history, zero + p.at,
                                   _create(client, history, p, f"{notify_url}/hook"))
                               for p in plan.partitions),
                             *(_at(history, zero + a.at, PERFORM[a.kind](actors, a.args))
                               for a in plan.actions))
        await _lift_pauses(plan, fleet, actors)
        settled = await _settle(client, plan, settle_timeout)
        await _notices_sent(client, NOTIFY_PATIENCE)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await completer[0].drain()
        history.add("final", settled=settled, **await _final(client, plan),
                    tracebacks=[p.owner for p in fleet.everyone if "Traceback" in p.output()],
                    processes=_processes(fleet, history), finished=history.now())


async def _fleet_started(fleet: Fleet) -> None:
    """Wait until every ``processor run`` of the fleet has started its watcher and its
    schedules' ticker: the plan's timeline is for a fleet that runs. (A start on a
    loaded machine was seen to take 12 s, the plan's first seconds played to no one.)"""
    for proc in fleet.slots.values():
        for line in READY_LINES:
            await proc.wait_log(line, timeout=FLEET_START_TIMEOUT)


def _processes(fleet: Fleet, history: History) -> list[Event]:
    """Each process of the run: when it was spawned, when it logged its start
    (``action=starting``) and when its ticker started, on the run's clock, and its exit."""
    found = []
    for proc in fleet.everyone:
        log = proc.stderr()
        found.append({"owner": proc.owner, "spawned": history.since_start(proc.started_at),
                      "ready": _logged_at(log, "action=starting", history),
                      "ticking": _logged_at(log, "action=ticker_started", history),
                      "exit": proc.process.returncode})
    return found


def _logged_at(log: str, fragment: str, history: History) -> float | None:
    """When ``log``'s first line holding ``fragment`` was written, on the run's clock."""
    for line in log.splitlines():
        if fragment in line:
            try:
                moment = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            except ValueError:
                return None
            return history.from_wall(moment.timestamp())
    return None


async def _at(history: History, at: float, work: Any) -> None:
    """Run ``work`` at ``at`` seconds into the run (the plan's own timing)."""
    await asyncio.sleep(max(0.0, at - history.now()))
    await work


async def _create(client: AsyncClient, history: History, partition: PartitionPlan,
                  notify_url: str) -> None:
    # The database's now was read after ``asked``: a not_before of now + s is no earlier
    # than asked + s on the run's clock, so a call before that is early for sure.
    asked = history.now()
    db_now = await client.now()
    if db_now.tzinfo is None:
        db_now = db_now.replace(tzinfo=UTC)
    items, not_before = [], {}
    for item in partition.items:
        when = None
        if item.not_before is not None:
            when = db_now + timedelta(seconds=item.not_before)
            not_before[item.id] = round(asked + item.not_before, 4)
        data = item_data(item.script, spawn=item.spawn, wait_timeout=item.wait_timeout)
        items.append(NewItem(item.id, json.dumps(data).encode(), not_before=when))
    event = history.add("create", partition=partition.id, started=history.now(),
                        not_before=not_before, quorum=partition.quorum, key=partition.key,
                        layout=partition.kind, gates=partition.gates,
                        pipeline=partition.pipeline, reduce_gates=list(partition.reduce_gates),
                        notify=partition.notify)
    try:
        await client.create_partition(partition.id, items, quorum=partition.quorum or None,
                                      key=partition.key, priority=partition.priority,
                                      pipeline=partition.pipeline,
                                      reduce_gates=partition.reduce_gates,
                                      notify=notify_url if partition.notify else None)
    except StatefeedError as error:
        event["error"] = f"{type(error).__name__}: {error}"[:300]
    event["finished"] = history.now()


async def _lift_pauses(plan: Plan, fleet: Fleet, actors: Actors) -> None:
    """End every pause the timeline may have left (a resume after a verb that failed)."""
    fleet.resume_everyone()
    for proc in list(fleet.slots.values()):
        if not proc.running:
            await fleet.start(next(s for s, p in fleet.slots.items() if p is proc))
    client = actors.client
    with contextlib.suppress(StatefeedError):
        await client.resume_all()
    for key in plan.key_limits:
        with contextlib.suppress(StatefeedError):
            await client.resume_key(key)
    for partition in plan.partitions:
        with contextlib.suppress(StatefeedError):
            await client.resume(partition.id)


async def _settle(client: AsyncClient, plan: Plan, timeout: float) -> bool:  # noqa: ASYNC109
    """Wait until every partition (the plan's, and the schedules') has ended; returns
    whether they all did in time."""
    try:
        async with asyncio.timeout(timeout):
            while True:
                try:
                    infos = await client.partitions(limit=10_000)
                except DatabaseError:  # a fault ended this session too: ask again
                    await asyncio.sleep(0.2)
                    continue
                open_ = [i for i in infos if i.status not in ENDED]
                if not open_:
                    return True
                await asyncio.sleep(0.2)
    except TimeoutError:
        return False


async def _notices_sent(client: AsyncClient, timeout: float) -> bool:  # noqa: ASYNC109
    """Wait until no notification is pending; returns whether none was in time."""
    try:
        async with asyncio.timeout(timeout):
            while True:
                with contextlib.suppress(StatefeedError):
                    counts = await client.notification_counts()
                    if not counts.get("pending"):
                        return True
                await asyncio.sleep(0.3)
    except TimeoutError:
        return False


async def _final(client: AsyncClient, plan: Plan) -> dict[str, Any]:
    partitions: dict[str, Event] = {}
    items: dict[str, list[Event]] = {}
    for info in await client.partitions(limit=10_000):
        try:
            result = info.result_json()
        except ValueError:
            result = "not json"
        partitions[info.id] = {"status": info.status, "gate": info.gate,
                               "counts": dict(info.counts), "result": result}
        items[info.id] = []
        async for item in client.iter_items(info.id):
            try:
                data = json.loads(item.data)
            except ValueError:
                data = None
            items[info.id].append({"id": item.id, "status": item.status, "gate": item.gate,
                                   "parent": item.parent, "data": data,
                                   "last_error": item.last_error, "attempts": item.attempts})
    return {"partitions": partitions, "items": items}
