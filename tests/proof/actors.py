"""Who acts on a run besides the processors: the fleet of processes (started, killed,
stopped), the completer (completions and heartbeats by token, through ``processor api``
and through the client, racing one another and the deadlines), and the operator's verbs
and the faults of the plan's timeline (one function per action kind, in :data:`PERFORM`).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from processor import (
    AlreadyCompletedError,
    AsyncClient,
    CompletionRefusedError,
    StatefeedError,
    WaitNotFoundError,
)
from tests.acceptance.harness.database import Sessions, with_query
from tests.acceptance.harness.processes import FAST, Processor, spawn
from tests.proof.handler import ScriptedHandler, leave
from tests.proof.history import Event, History
from tests.proof.plan import PIPELINES, SERVICE_OF, Plan
from tests.support.engine import wait_until
from tests.support.servers import free_port

# How often a completion that met a cut connection or a 404 (its parking answer not
# written yet) is tried again, and how long between tries.
COMPLETION_TRIES = 4
COMPLETION_PAUSE = 0.5
# How long the completer of a race waits for every item of the partition to park.
RACE_PATIENCE = 8.0


def routes_file(path: Path, base_url: str, owner: str) -> Path:
    """A routes file: each pipeline to its own service, every processor naming the same
    URL (so a ``Retry-After`` hold is shared) and itself in an ``X-Caller`` header."""
    lines = []
    for pipeline in PIPELINES:
        lines += ["[[pipeline]]", f'name = "{pipeline}"', "", "[[pipeline.route]]",
                  'gate = "*"', f'url = "{base_url}/svc/{SERVICE_OF[pipeline]}"',
                  f'headers = {{ X-Caller = "{owner}" }}', ""]
    path.write_text("\n".join(lines))
    return path


class Fleet:
    """The run's processes: ``processor run`` in numbered slots (a killed one is replaced
    by a new owner in its slot) and one ``processor api`` on a fixed port."""

    def __init__(self, workdir: Path, db_url: str, prefix: str, base_url: str,
                 sessions: Sessions | None) -> None:
        self.workdir = workdir
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
        routes = routes_file(self.workdir / f"{owner}.toml", self.base_url, owner)
        proc = await spawn(owner, ["run", "--routes", str(routes), "--db-url", self._url(owner),
                                   "--table-prefix", self.prefix, "--owner-id", owner,
                                   "--health-port", "0", *FAST], self.workdir)
        self.slots[slot] = proc
        self.everyone.append(proc)
        return proc

    async def start_api(self) -> None:
        """Start ``processor api`` on the fleet's port and wait until it answers."""
        self.api = await spawn(f"api{len(self.everyone)}",
                               ["api", "--db-url", self.db_url, "--table-prefix", self.prefix,
                                "--host", "127.0.0.1", "--port", str(self.api_port)],
                               self.workdir)
        self.everyone.append(self.api)
        api = self.api

        def announced() -> bool:
            assert api.running, api.output()[-2000:]
            return re.search(r"http://127\.0\.0\.1:\d+/v1/", api.output()) is not None

        await wait_until(announced, timeout=30, message="processor api to start")

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
                 history: History) -> None:
        self.fleet = fleet
        self.client = client
        self.handler = handler
        self.history = history

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


# One function per action kind of tests.proof.plan.ACTIONS.
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
}
