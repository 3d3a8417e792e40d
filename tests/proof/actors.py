"""Who acts on a run besides the processors: the fleet of processes (started, killed,
stopped), the completer (completions and heartbeats by token, through ``processor api``
and through the client, racing one another and the deadlines), and the operator's verbs
and the faults of the plan's timeline (one function per action kind, in :data:`PERFORM`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import signal
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from processor import (
    AlreadyCompletedError,
    AsyncClient,
    CompletionRefusedError,
    NewItem,
    StatefeedError,
    WaitNotFoundError,
)
from processor.notify.signing import EVENT_ID_HEADER, HEADER, verify
from tests.acceptance.harness.database import Sessions, with_query
from tests.acceptance.harness.processes import FAST, Processor, spawn
from tests.proof.handler import ScriptedHandler, item_data, leave
from tests.proof.history import Event, History
from tests.proof.plan import ALL_PIPELINES, BATCHED, DOWNABLE, SERVICE_OF, Plan
from tests.support.engine import wait_until
from tests.support.servers import free_port, read_body, send_json, serve_app

# How often a completion that met a cut connection or a 404 (its parking answer not
# written yet) is tried again, and how long between tries.
COMPLETION_TRIES = 4
COMPLETION_PAUSE = 0.5
# How long the completer of a race waits for every item of the partition to park.
RACE_PATIENCE = 8.0


# The notify secret of the run's processors (the receiver verifies every POST with it).
NOTIFY_SECRET = "proof-notify-secret"
# How long a SIGTERMed processor has to hand over before it is killed.
SIGTERM_PATIENCE = 15.0


def routes_file(path: Path, base_url: str, owner: str, *, down_url: str | None = None,
                generation: int = 0) -> Path:
    """A routes file: each pipeline to its own service, every processor naming the same
    URL (so a ``Retry-After`` hold is shared), itself in an ``X-Caller`` header and the
    file's ``generation`` in ``X-Routes`` (a SIGHUP's rewrite moves it on). ``gamma``
    sends batches; ``delta`` goes to ``down_url``, the server a ``service_down`` stops."""
    lines = []
    for pipeline in ALL_PIPELINES:
        base = down_url if pipeline == DOWNABLE and down_url else base_url
        lines += ["[[pipeline]]", f'name = "{pipeline}"', "", "[[pipeline.route]]",
                  'gate = "*"', f'url = "{base}/svc/{SERVICE_OF[pipeline]}"',
                  f'headers = {{ X-Caller = "{owner}", X-Routes = "{generation}" }}']
        if pipeline in BATCHED:
            lines.append("batch_size = 4")
        lines.append("")
    path.write_text("\n".join(lines))
    return path


class DownableServer:
    """The handler app served on a port of its own, stopped (connections refused, calls
    in flight cut) and started again on the same port by a ``service_down`` fault."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._stack: contextlib.AsyncExitStack | None = None

    async def start(self) -> None:
        stack = contextlib.AsyncExitStack()
        for _ in range(50):  # the port may linger a moment after a stop
            try:
                await stack.enter_async_context(serve_app(self.app, port=self.port))
                break
            except (OSError, SystemExit):
                await asyncio.sleep(0.1)
        self._stack = stack

    async def stop(self) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            await stack.aclose()


class NoticeReceiver:
    """The webhook receiver of the run's notify URLs: records every POST as a ``notice``
    event (its event id, type, partition, whether its signature verified) and answers
    500 to the first delivery of about one event in three, so those are sent again."""

    def __init__(self, history: History) -> None:
        self.history = history
        self._refused: set[str] = set()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        try:
            event = json.loads(body)
        except ValueError:
            event = {}
        event_id = headers.get(EVENT_ID_HEADER.lower(), "")
        refuse = (event_id not in self._refused
                  and hashlib.sha256(event_id.encode()).digest()[0] % 3 == 0)
        if refuse:
            self._refused.add(event_id)
        self.history.add(
            "notice", id=event_id, body_id=event.get("id"), type=event.get("type"),
            partition=event.get("partition_id"), at=self.history.now(),
            signed=verify(NOTIFY_SECRET.encode(), headers.get(HEADER.lower(), ""), body,
                          time.time()),
            status=500 if refuse else 200)
        await send_json(send, 500 if refuse else 200, {"ok": not refuse})


class Fleet:
    """The run's processes: ``processor run`` in numbered slots (a killed one is replaced
    by a new owner in its slot) and one ``processor api`` on a fixed port."""

    def __init__(self, workdir: Path, db_url: str, prefix: str, base_url: str,
                 sessions: Sessions | None, down_url: str | None = None) -> None:
        self.workdir = workdir
        self.down_url = down_url
        self.routes_generation = 0
        self.db_url = db_url
        self.prefix = prefix
        self.base_url = base_url
        self.sessions = sessions
        self.slots: dict[int, Processor] = {}
        self.everyone: list[Processor] = []
        self._generation: dict[int, int] = defaultdict(int)
        self.api: Processor | None = None
        self.api_port = free_port()
        self.api_url = f"http://127.0.0.1:{self.api_port}/"
        # One fault at a time on the API (two restarts would race for its port).
        self.api_lock = asyncio.Lock()

    def _url(self, owner: str) -> str:
        if self.sessions is None:
            return self.db_url
        return with_query(self.db_url, application_name=self.sessions.app_name(owner))

    async def start(self, slot: int) -> Processor:
        """Start a processor in ``slot`` (a new owner id each time)."""
        self._generation[slot] += 1
        owner = f"p{slot}g{self._generation[slot]}"
        routes = self.write_routes(owner)
        proc = await spawn(owner, ["run", "--routes", str(routes), "--db-url", self._url(owner),
                                   "--table-prefix", self.prefix, "--owner-id", owner,
                                   "--health-port", "0", "--notify-allow-private",
                                   "--notify-backoff", "1s", *FAST], self.workdir,
                           env={"PROCESSOR_NOTIFY_SECRET": NOTIFY_SECRET})
        self.slots[slot] = proc
        self.everyone.append(proc)
        return proc

    def write_routes(self, owner: str) -> Path:
        """Write ``owner``'s routes file at the fleet's routes generation."""
        return routes_file(self.workdir / f"{owner}.toml", self.base_url, owner,
                           down_url=self.down_url, generation=self.routes_generation)

    async def start_api(self) -> None:
        """Start ``processor api`` on the fleet's port and wait until it answers (on a new
        port when another process took the old one while the API was down)."""
        for _ in range(3):
            api = await spawn(f"api{len(self.everyone)}",
                              ["api", "--db-url", self._url("api"),
                               "--table-prefix", self.prefix,
                               "--host", "127.0.0.1", "--port", str(self.api_port)],
                              self.workdir)
            self.api = api
            self.everyone.append(api)

            def announced(api: Processor = api) -> bool:
                if not api.running and "Address already in use" in api.output():
                    return True
                assert api.running, api.output()[-2000:]
                return re.search(r"http://127\.0\.0\.1:\d+/v1/", api.output()) is not None

            await wait_until(announced, timeout=30, message="processor api to start")
            if api.running:
                return
            self.api_port = free_port()
            self.api_url = f"http://127.0.0.1:{self.api_port}/"
        raise AssertionError("processor api found no free port")

    def resume_everyone(self) -> None:
        """SIGCONT every process a fault left stopped."""
        for proc in self.everyone:
            if proc.running and proc.paused:
                proc.resume()

    async def kill_everyone(self) -> None:
        """kill -9 every process and reap it."""
        for proc in self.everyone:
            proc.kill()
        for proc in self.everyone:
            with contextlib.suppress(ProcessLookupError):
                await proc.process.wait()


class Completer:
    """Completes parked items by token as the plan says (``WaitPlan``), recording every
    completion and heartbeat with its answer."""

    def __init__(self, plan: Plan, history: History, fleet: Fleet, client: AsyncClient) -> None:
        self.history = history
        self.fleet = fleet
        self.client = client
        self.items = {(p.id, item.id): item for p in plan.partitions for item in p.items}
        self.sizes = {p.id: len(p.items) for p in plan.partitions}
        self.cids = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self._parked: dict[str, dict[str, tuple[Event, dict[str, Any]]]] = defaultdict(dict)
        self._all_parked: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self._fired: set[str] = set()

    def on_park(self, call: Event, data: dict[str, Any]) -> None:
        """The handler parked an item (``call``, answered with ``data``): act on its token."""
        item = self.items.get((call["partition"], call["item"]))
        wait = item.waits.get(call["gate"]) if item else None
        if wait is None or wait.mode == "timeout":
            return
        if wait.mode == "race":
            pid = call["partition"]
            first = not self._parked[pid]
            self._parked[pid][call["item"]] = (call, data)
            if pid in self._fired:
                self._spawn(self._complete_all(call, data))
            elif len(self._parked[pid]) >= self.sizes[pid]:
                self._all_parked[pid].set()
            if first:
                self._spawn(self._race(pid))
            return
        self._spawn(self._complete_all(call, data, delay=wait.delay))

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def drain(self) -> None:
        """Wait for every completion under way."""
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)

    async def _race(self, pid: str) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(RACE_PATIENCE):
                await self._all_parked[pid].wait()
        self._fired.add(pid)
        await asyncio.gather(*(self._complete_all(call, data)
                               for call, data in self._parked[pid].values()))

    async def _complete_all(self, call: Event, data: dict[str, Any], delay: float = 0.0) -> None:
        item = self.items[(call["partition"], call["item"])]
        wait = item.waits[call["gate"]]
        if delay:
            await asyncio.sleep(delay)  # the outside world's own time: the plan's input
        if wait.heartbeat:
            await self._once("heartbeat", call, wait.via[0], {"timeout": item.wait_timeout})
        racers = []
        for via in wait.via:
            self.cids += 1
            answer = leave(data, call["gate"], f"c@{self.cids}")
            racers.append(self._once("completion", call, via, answer, cid=self.cids))
        await asyncio.gather(*racers)

    async def _once(self, kind: str, call: Event, via: str, body: dict[str, Any],
                    cid: int = 0) -> None:
        """One completion (or heartbeat), tried again after a cut or a 404."""
        for _ in range(COMPLETION_TRIES):
            event = self.history.add(kind, cid=cid, token=call["token"],
                                     partition=call["partition"], item=call["item"],
                                     gate=call["gate"], via=via, started=self.history.now(),
                                     finished=None, status=None)
            if via == "api":
                status = await self._by_api(kind, call["token"], body)
            else:
                status = await self._by_client(kind, call["token"], body)
            event["status"], event["finished"] = status, self.history.now()
            if status not in ("cut", 404):
                return
            await asyncio.sleep(COMPLETION_PAUSE)

    async def _by_api(self, kind: str, token: str, body: dict[str, Any]) -> int | str:
        path = f"v1/completions/{token}" + ("/heartbeat" if kind == "heartbeat" else "")
        try:
            async with httpx.AsyncClient(base_url=self.fleet.api_url, timeout=10) as http:
                return (await http.post(path, json=body)).status_code
        except httpx.TransportError:
            return "cut"

    async def _by_client(self, kind: str, token: str, body: dict[str, Any]) -> int | str:
        try:
            if kind == "heartbeat":
                await self.client.heartbeat(token, body["timeout"])
            elif body.get("done"):
                await self.client.complete(token, done=True, data=body["data"])
            else:
                await self.client.complete(token, done=False, gate=body["gate"],
                                           data=body["data"])
        except AlreadyCompletedError:
            return 409
        except WaitNotFoundError:
            return 404
        except CompletionRefusedError:
            return 400
        except StatefeedError:
            return "cut"
        return 200


# -- the timeline's actions -------------------------------------------------------------

class Actors:
    """What the timeline's actions act on."""

    def __init__(self, fleet: Fleet, client: AsyncClient, handler: ScriptedHandler,
                 history: History, down: DownableServer | None = None,
                 notify_url: str = "") -> None:
        self.fleet = fleet
        self.client = client
        self.handler = handler
        self.history = history
        self.down = down
        self.notify_url = notify_url
        # One service_down at a time (two would race for its port).
        self.down_lock = asyncio.Lock()

    async def verb(self, name: str, work: Awaitable[Any], **args: Any) -> None:
        """Run an operator verb and record it with its answer or error."""
        event = self.history.add("verb", name=name, args=args, started=self.history.now())
        try:
            event["answer"] = str(await work)
        except StatefeedError as error:
            event["error"] = f"{type(error).__name__}: {error}"[:300]
        event["finished"] = self.history.now()

    def fault(self, name: str, args: dict[str, Any], target: str = "") -> Event:
        """Record a fault as it starts (its ``finished`` set by the caller)."""
        return self.history.add("fault", name=name, args=args, target=target,
                                started=self.history.now(), finished=None)


async def _cancel(a: Actors, args: dict[str, Any]) -> None:
    await a.verb("cancel", a.client.cancel(args["partition"]), **args)


async def _retry(a: Actors, args: dict[str, Any]) -> None:
    await a.verb("retry", a.client.retry_failed(args["partition"]), **args)


async def _paused(a: Actors, args: dict[str, Any], scope: str,
                  pause: Callable[[], Awaitable[Any]],
                  resume: Callable[[], Awaitable[Any]]) -> None:
    await a.verb(f"pause_{scope}", pause(), **args)
    await asyncio.sleep(args["seconds"])
    await a.verb(f"resume_{scope}", resume(), **args)


async def _pause_partition(a: Actors, args: dict[str, Any]) -> None:
    pid = args["partition"]
    await _paused(a, args, "partition", lambda: a.client.pause(pid),
                  lambda: a.client.resume(pid))


async def _pause_key(a: Actors, args: dict[str, Any]) -> None:
    key = args["key"]
    await _paused(a, args, "key", lambda: a.client.pause_key(key),
                  lambda: a.client.resume_key(key))


async def _pause_all(a: Actors, args: dict[str, Any]) -> None:
    await _paused(a, args, "all", a.client.pause_all, a.client.resume_all)


async def _kill(a: Actors, args: dict[str, Any]) -> None:
    victim = a.fleet.slots[args["slot"]]
    event = a.fault("kill", args, victim.owner)
    victim.kill()
    with contextlib.suppress(ProcessLookupError):
        await victim.process.wait()
    await a.fleet.start(args["slot"])
    event["finished"] = a.history.now()


async def _stop(a: Actors, args: dict[str, Any]) -> None:
    victim = a.fleet.slots[args["slot"]]
    if victim.paused or not victim.running:
        return
    event = a.fault("stop", args, victim.owner)
    victim.pause()
    await asyncio.sleep(args["seconds"])
    if victim.running:
        victim.resume()
    event["finished"] = a.history.now()


async def _pg_terminate(a: Actors, args: dict[str, Any]) -> None:
    if a.fleet.sessions is None:
        return  # PostgreSQL only
    event = a.fault("pg_terminate", args)
    event["detail"] = await a.fleet.sessions.terminate()
    event["finished"] = a.history.now()


async def _api_kill(a: Actors, args: dict[str, Any]) -> None:
    async with a.fleet.api_lock:
        assert a.fleet.api is not None
        event = a.fault("api_kill", args, a.fleet.api.owner)
        a.fleet.api.kill()
        with contextlib.suppress(ProcessLookupError):
            await a.fleet.api.process.wait()
        await a.fleet.start_api()
        event["finished"] = a.history.now()


async def _api_stop(a: Actors, args: dict[str, Any]) -> None:
    async with a.fleet.api_lock:
        api = a.fleet.api
        assert api is not None
        event = a.fault("api_stop", args, api.owner)
        api.process.send_signal(signal.SIGSTOP)
        api.paused = True
        await asyncio.sleep(args["seconds"])
        api.resume()
        event["finished"] = a.history.now()


async def _service_fault(a: Actors, args: dict[str, Any]) -> None:
    event = a.fault("service_fault", args, args["service"])
    a.handler.fail(args["service"], args["status"], args["count"], args["retry_after"])
    event["finished"] = event["started"]


async def _rewind(a: Actors, args: dict[str, Any]) -> None:
    await a.verb("rewind", a.client.rewind(args["partition"], args["gate"]), **args)


async def _set_gate(a: Actors, args: dict[str, Any]) -> None:
    pid = args["partition"]
    try:
        gate = (await a.client.partition(pid)).gate + 1
    except StatefeedError:
        return
    await a.verb("set_gate", a.client.set_gate(pid, gate), **args, gate=gate)


async def _schedule(a: Actors, args: dict[str, Any]) -> None:
    """Add a schedule ticking every ``every`` s, delete it ``seconds`` later; record
    each with the database's now around it (the ticks are on the database's clock)."""
    items = [NewItem(f"i{n}", json.dumps(item_data(tuple(args["script"]))).encode())
             for n in range(args["items"])]
    before = a.history.now()
    event = a.history.add("schedule", name=args["name"], every=args["every"],
                          notify=args["notify"], started=before, finished=None, error=None)
    try:
        event["db_added"] = (await a.client.now()).isoformat()
        info = await a.client.add_schedule(
            args["name"], every=args["every"], items=items, pipeline=args["pipeline"],
            notify=a.notify_url if args["notify"] else None)
    except StatefeedError as error:
        event["error"] = f"{type(error).__name__}: {error}"[:300]
        return
    event["first_tick"] = info.next_at.isoformat() if info.next_at else None
    event["finished"] = a.history.now()
    await asyncio.sleep(args["seconds"])
    event["delete_started"] = a.history.now()
    try:
        await a.client.delete_schedule(args["name"])
        # The database's time once the delete committed: a tick before it is the
        # schedule's own (a delete slowed by a loaded machine took 4.6 s once).
        event["db_deleted"] = (await a.client.now()).isoformat()
    except StatefeedError as error:
        event["error"] = f"delete: {type(error).__name__}: {error}"[:300]
    event["deleted"] = a.history.now()


async def _service_down(a: Actors, args: dict[str, Any]) -> None:
    """The ``delta`` service's server stopped (its calls in flight cut, connections
    refused) for ``seconds``, then started again on its port."""
    if a.down is None:
        return
    async with a.down_lock:
        event = a.fault("service_down", args, DOWNABLE)
        await a.down.stop()
        event["down"] = a.history.now()
        await asyncio.sleep(args["seconds"])
        await a.down.start()
        event["finished"] = a.history.now()


async def _sighup(a: Actors, args: dict[str, Any]) -> None:
    """Every processor's routes file rewritten (its X-Routes header's generation moved
    on), then SIGHUP to each: calls started after it carry the new generation."""
    fleet = a.fleet
    fleet.routes_generation += 1
    event = a.fault("sighup", args)
    event["generation"] = fleet.routes_generation
    owners = []
    for proc in list(fleet.slots.values()):
        if proc.running:
            fleet.write_routes(proc.owner)
            with contextlib.suppress(ProcessLookupError):
                proc.process.send_signal(signal.SIGHUP)
            owners.append(proc.owner)
    event["owners"] = owners
    event["finished"] = a.history.now()


async def _sigterm(a: Actors, args: dict[str, Any]) -> None:
    """SIGTERM to a processor: it hands over (its calls in flight finish and are written,
    exit status 0); a new one starts in its slot."""
    victim = a.fleet.slots[args["slot"]]
    if victim.paused or not victim.running:
        return
    event = a.fault("sigterm", args, victim.owner)
    # Before its first log line its signal handlers are not installed yet: SIGTERM then
    # ends it at once (the default action), which no hand-over promises to survive.
    event["ready"] = "action=starting" in victim.output()
    victim.process.send_signal(signal.SIGTERM)
    try:
        async with asyncio.timeout(SIGTERM_PATIENCE):
            event["exit"] = await victim.process.wait()
    except TimeoutError:
        event["exit"] = "timeout"
        victim.kill()
        with contextlib.suppress(ProcessLookupError):
            await victim.process.wait()
    event["exited"] = a.history.now()
    # asyncio's child watcher has been seen to lose a child's status under load and
    # report 255 ("Unknown child process"): the processor's own last words say whether it
    # stopped as a hand-over does.
    event["stopped_cleanly"] = "action=watcher_stopped" in victim.stderr()
    await a.fleet.start(args["slot"])
    event["finished"] = a.history.now()


# One function per action kind of tests.proof.plan.ACTIONS and EXTRA_ACTIONS.
PERFORM: dict[str, Callable[[Actors, dict[str, Any]], Awaitable[None]]] = {
    "cancel": _cancel,
    "retry": _retry,
    "pause_partition": _pause_partition,
    "pause_key": _pause_key,
    "pause_all": _pause_all,
    "kill": _kill,
    "stop": _stop,
    "pg_terminate": _pg_terminate,
    "api_kill": _api_kill,
    "api_stop": _api_stop,
    "service_fault": _service_fault,
    "rewind": _rewind,
    "set_gate": _set_gate,
    "schedule": _schedule,
    "service_down": _service_down,
    "sighup": _sighup,
    "sigterm": _sigterm,
}
