"""A multi-process harness: real ``processor run`` subprocesses on real PostgreSQL,
driven against a recording handler served by uvicorn on loopback.

The pieces:

- :class:`RecordingHandler`, an ASGI handler that follows the HTTP handler
  contract and logs every call with its own monotonic timestamps (request start,
  response release), the caller, partition, item, gate, attempt, idempotency key
  and outcome. Its default behaviour is a *pass counter*: every item needs
  ``passes`` successful calls at each of ``gates`` gates, and each answer appends
  ``"gate:pass@call"`` to the item's ``trail``, so the data persisted at the end
  says exactly which call's result was written for every step.
- :class:`Processor`, one ``processor run`` subprocess with a unique owner id,
  its own handler URL path (``/p/<owner>``, so the handler knows who called),
  its own ``application_name`` (so its PostgreSQL sessions can be found), output
  in files (a stopped or killed process can never block on a pipe) and
  start/stop/kill -9/SIGSTOP/SIGCONT.
- :class:`Cluster`, a fresh table prefix (migrated on entry, dropped on exit), the
  handler server, an :class:`processor.AsyncClient` and SQL helpers
  (``pg_terminate_backend``, session states); it kills every process it started.
- :class:`TcpProxy`, a loopback TCP proxy in front of PostgreSQL that can refuse
  or cut connections: a database outage the test controls.
- Pure checks over the call log and the final items (:func:`item_problems`,
  :func:`key_problems`, :func:`gate_order_problems`, :func:`causality_problems`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import httpx
import uvicorn
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from processor import AsyncClient, ItemInfo, NewItem, PartitionInfo
from tests.conftest import POSTGRES_URL
from tests.support.engine import wait_until
from tests.support.servers import free_port, serve_app
from watcher.dburl import parse_database_url
from watcher.migrate import downgrade, upgrade

PROCESSOR = str(Path(sys.executable).with_name("processor"))

LEASE = 2.0
POLL = 0.1
# Fast settings for every processor the harness starts, unless a test overrides them.
FAST = ("--poll-interval", str(POLL), "--lease-duration", str(LEASE), "--retry-backoff", "0.05",
        "--max-retries", "8", "--shutdown-timeout", "5", "--concurrency", "16")
SETTLED = ("complete", "failed")


# --------------------------------------------------------------------------- the handler


@dataclass
class Call:
    """One request the handler received, and what it answered.

    ``started`` is taken when the request reaches the app, ``finished`` just before
    the response body is handed to the server (so nothing the processor does with
    the answer can happen before it). Both are this process's ``time.monotonic()``.
    """

    seq: int
    caller: str
    partition_id: str
    item_id: str
    gate: int
    attempt: int
    key: str
    body: bytes
    headers: dict[str, str]
    started: float
    finished: float | None = None
    status: int | None = None
    outcome: str = "pending"  # ok, transient, poison, custom, cancelled

    @property
    def ok(self) -> bool:
        """Whether the handler answered with a 2xx."""
        return self.status is not None and 200 <= self.status < 300

    def state(self) -> dict[str, Any] | None:
        """The pass-counter state the call was given, or ``None`` for other data."""
        try:
            value = json.loads(self.body)
        except ValueError:
            return None
        return value if isinstance(value, dict) and "trail" in value else None

    @property
    def step(self) -> tuple[int, int] | None:
        """(gate, passes already made at that gate) of the input, for pass-counter data."""
        state = self.state()
        return None if state is None else (self.gate, int(state["p"]))


Reply = tuple[int, Any]  # status, JSON payload (or bytes for a raw body)


def initial_data() -> bytes:
    """The data every pass-counter item starts with."""
    return json.dumps({"g": 0, "p": 0, "trail": []}).encode()


def expected_trail(gates: int, passes: int) -> list[str]:
    """The steps a pass-counter item goes through, in order: ``["0:1", "0:2", "1:1", ...]``."""
    return [f"{g}:{p}" for g in range(gates) for p in range(1, passes + 1)]


class RecordingHandler:
    """The pass-counter handler (see the module docstring); every call is logged.

    - ``failure_rate``: share of calls answered 500 at random (seeded by ``seed``).
    - ``delay``: seconds each call takes, or a function of the call.
    - ``hold``: a function of the call returning an event to wait on first (or None).
    - ``poison``: item ids always answered with ``poison_status``.
    - ``respond``: a function of the call returning ``(status, payload)`` to answer
      instead of the pass counter (or ``None`` to fall through to it).
    """

    def __init__(self, *, gates: int = 2, passes: int = 2, failure_rate: float = 0.0,
                 seed: int = 0, delay: float | Callable[[Call], float] = 0.0,
                 hold: Callable[[Call], asyncio.Event | None] | None = None,
                 poison: Iterable[str] = (), poison_status: int = 500,
                 respond: Callable[[Call], Reply | None] | None = None) -> None:
        self.gates = gates
        self.passes = passes
        self.failure_rate = failure_rate
        self.rng = random.Random(seed)
        self.delay = delay
        self.hold = hold
        self.poison = frozenset(poison)
        self.poison_status = poison_status
        self.respond = respond
        self.calls: list[Call] = []
        self.violations: list[str] = []
        self._released = False
        self._holds: set[asyncio.Event] = set()

    def release_all(self) -> None:
        """Stop holding calls, now and from now on (so the server can shut down)."""
        self._released = True
        for event in self._holds:
            event.set()

    def calls_by(self, caller: str) -> list[Call]:
        """The calls one processor made."""
        return [call for call in self.calls if call.caller == caller]

    def in_flight(self, caller: str | None = None) -> list[Call]:
        """Calls received and not answered yet."""
        return [call for call in self.calls if call.finished is None and call.outcome == "pending"
                and (caller is None or call.caller == caller)]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] == "GET":
            await _reply(send, 200, {"status": "ok"})
            return
        started = time.monotonic()
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        path = scope["path"]
        caller = path[len("/p/"):] if path.startswith("/p/") else path
        call = Call(len(self.calls), caller, unquote(headers.get("x-partition-id", "")),
                    unquote(headers.get("x-item-id", "")), int(headers.get("x-gate", "-1")),
                    int(headers.get("x-attempt", "0")), unquote(headers.get("idempotency-key", "")),
                    body, headers, started)
        self.calls.append(call)
        try:
            if not await _unless_disconnected(self._wait(call), receive):
                call.outcome = "abandoned"  # the processor hung up (cancelled, killed)
                return
            status, payload, outcome = self._answer(call)
        except BaseException:
            call.outcome = "cancelled"
            raise
        call.status, call.outcome = status, outcome
        call.finished = time.monotonic()
        await _reply(send, status, payload)

    async def _wait(self, call: Call) -> None:
        event = None if self.hold is None or self._released else self.hold(call)
        if event is not None:
            self._holds.add(event)
            if self._released:
                event.set()
            await event.wait()
        seconds = self.delay(call) if callable(self.delay) else self.delay
        if seconds > 0:
            await asyncio.sleep(seconds)

    def _answer(self, call: Call) -> tuple[int, Any, str]:
        if self.respond is not None:
            custom = self.respond(call)
            if custom is not None:
                return custom[0], custom[1], "custom"
        if call.item_id in self.poison:
            return self.poison_status, {"error": {"message": f"poison item {call.item_id}"}}, \
                "poison"
        if self.failure_rate and self.rng.random() < self.failure_rate:
            return 500, {"error": {"message": "transient failure, try again"}}, "transient"
        state = call.state()
        if state is None:
            self.violations.append(f"call {call.seq}: data is not pass-counter state: "
                                   f"{call.body[:80]!r}")
            return 400, {"error": {"message": "unexpected data", "no_retry": True}}, "custom"
        if state["g"] != call.gate:
            # The item's data and its gate were not written together.
            self.violations.append(f"call {call.seq} ({call.partition_id}/{call.item_id}): "
                                   f"X-Gate {call.gate} but data says gate {state['g']}")
        passes = int(state["p"]) + 1
        trail = [*state["trail"], f"{call.gate}:{passes}@{call.seq}"]
        if passes < self.passes:
            return 200, {"data": {"g": call.gate, "p": passes, "trail": trail}}, "ok"
        if call.gate + 1 < self.gates:
            return 200, {"gate": call.gate + 1,
                         "data": {"g": call.gate + 1, "p": 0, "trail": trail}}, "ok"
        return 200, {"done": True, "data": {"g": call.gate, "p": passes, "trail": trail}}, "ok"


async def _unless_disconnected(work: Any, receive: Any) -> bool:
    """Run ``work`` unless the client disconnects first; returns whether it completed."""
    done = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({done, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (done, gone):
            task.cancel()
        await asyncio.gather(done, gone, return_exceptions=True)
    return done.done() and not done.cancelled() and done.exception() is None


async def _disconnected(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _reply(send: Any, status: int, payload: Any) -> None:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


# --------------------------------------------------------------------------- checks


def trail_of(item: ItemInfo) -> list[tuple[str, int]]:
    """The persisted trail of a pass-counter item: (step, call that produced it)."""
    entries = json.loads(item.data)["trail"]
    return [(entry.split("@")[0], int(entry.split("@")[1])) for entry in entries]


def item_problems(items: Sequence[ItemInfo], calls: Sequence[Call], *, gates: int,
                  passes: int) -> list[str]:
    """Why the final items are not exactly what the pass counter must produce.

    Every item must be complete at the last gate with exactly the expected steps in
    its trail (a lost update skips a step, a double-applied or stale result
    repeats one), and every step must have been written from a successful call
    made for that very step.
    """
    want = expected_trail(gates, passes)
    problems: list[str] = []
    for item in items:
        name = f"{item.partition_id}/{item.id}"
        if item.status != "complete" or item.gate != gates - 1:
            problems.append(f"{name}: {item.status} at gate {item.gate}, "
                            f"last_error={item.last_error!r}")
            continue
        trail = trail_of(item)
        steps = [step for step, _ in trail]
        if steps != want:
            problems.append(f"{name}: trail {steps} != {want}")
            continue
        for step, seq in trail:
            gate, made = (int(part) for part in step.split(":"))
            call = calls[seq] if seq < len(calls) else None
            if (call is None or not call.ok or call.partition_id != item.partition_id
                    or call.item_id != item.id or call.step != (gate, made - 1)):
                problems.append(f"{name}: step {step} was written from call {seq} "
                                f"({call!r:.200}), which was not a successful call for it")
    return problems


def key_problems(calls: Sequence[Call]) -> list[str]:
    """Repeated calls for one step must carry one Idempotency-Key; other steps, other keys."""
    keys_of_step: dict[tuple[str, str, tuple[int, int]], set[str]] = defaultdict(set)
    step_of_key: dict[str, set[tuple[str, str, tuple[int, int]]]] = defaultdict(set)
    for call in calls:
        if call.step is None:
            continue
        step = (call.partition_id, call.item_id, call.step)
        keys_of_step[step].add(call.key)
        step_of_key[call.key].add(step)
    problems = [f"step {step} was sent with {len(keys)} keys: {sorted(keys)}"
                for step, keys in keys_of_step.items() if len(keys) != 1]
    problems += [f"key {key} was sent for {len(steps)} steps: {sorted(steps)}"
                 for key, steps in step_of_key.items() if len(steps) != 1]
    return problems


def gate_order_problems(calls: Sequence[Call], item_ids: dict[str, list[str]], *,
                        passes: int) -> list[str]:
    """Calls at gate g+1 that started before every item's gate g had been settled.

    The guarantee is about *dispatch*: a partition dispatches gate g+1 only after
    every item at gate g is settled in the database. An item's gate g settles
    through the call for its last pass there, so for every call at gate g+1 each
    item of the partition must already have had such a call answered with
    success (its ``finished`` before the gate-g+1 call's ``started``). A late
    duplicate at gate g from a processor that lost its lease is allowed.
    """
    settled_at: dict[tuple[str, str, int], float] = {}
    for call in calls:
        if call.ok and call.step is not None and call.step[1] == passes - 1:
            key = (call.partition_id, call.item_id, call.gate)
            assert call.finished is not None
            settled_at[key] = min(settled_at.get(key, call.finished), call.finished)
    problems: list[str] = []
    for call in calls:
        if call.gate <= 0 or call.partition_id not in item_ids:
            continue
        for item_id in item_ids[call.partition_id]:
            done = settled_at.get((call.partition_id, item_id, call.gate - 1))
            if done is None or done >= call.started:
                problems.append(
                    f"call {call.seq} ({call.partition_id}/{call.item_id} gate {call.gate} by "
                    f"{call.caller}) started at {call.started:.3f} but item {item_id} settled "
                    f"gate {call.gate - 1} at {done if done is None else round(done, 3)}")
    return problems


def causality_problems(calls: Sequence[Call]) -> list[str]:
    """Every call's input must come from a result the handler had already answered."""
    problems: list[str] = []
    for call in calls:
        state = call.state()
        if not state or not state["trail"]:
            continue
        source = int(state["trail"][-1].split("@")[1])
        earlier = calls[source] if source < call.seq else None
        if earlier is None or earlier.finished is None or earlier.finished >= call.started:
            problems.append(f"call {call.seq} got data written from call {source}, which had "
                            "not been answered when it started")
    return problems


def duplicate_calls(calls: Sequence[Call]) -> int:
    """Successful calls beyond one per step: the cost of at-least-once delivery."""
    ok = [call for call in calls if call.ok and call.step is not None]
    return len(ok) - len({(c.partition_id, c.item_id, c.step) for c in ok})


# --------------------------------------------------------------------------- processes


def with_query(url: str, **params: str) -> str:
    """``url`` with query parameters added (psycopg takes them as connection options)."""
    parts = urlsplit(url)
    extra = "&".join(f"{key}={value}" for key, value in params.items())
    query = f"{parts.query}&{extra}" if parts.query else extra
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


@dataclass
class Processor:
    """One ``processor run`` subprocess."""

    owner: str
    process: asyncio.subprocess.Process
    stdout_path: Path
    stderr_path: Path
    health_port: int
    started_at: float = field(default_factory=time.monotonic)
    paused: bool = False

    @property
    def pid(self) -> int:
        """The process id."""
        return self.process.pid

    @property
    def running(self) -> bool:
        """Whether the process has not exited (a paused process is running)."""
        return self.process.returncode is None

    def stderr(self) -> str:
        """Everything the process wrote on stderr so far."""
        return self.stderr_path.read_text(errors="replace")

    def output(self) -> str:
        """stdout and stderr so far."""
        return self.stdout_path.read_text(errors="replace") + self.stderr()

    def kill(self) -> None:
        """kill -9: no graceful stop, leases are left to expire."""
        if self.running:
            self.process.send_signal(signal.SIGKILL)

    def pause(self) -> None:
        """SIGSTOP: the process freezes with everything it holds."""
        self.process.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT."""
        self.process.send_signal(signal.SIGCONT)
        self.paused = False

    async def wait(self, timeout: float) -> int:  # noqa: ASYNC109
        """Wait for the exit; returns the code. Raises AssertionError on timeout."""
        try:
            async with asyncio.timeout(timeout):
                return await self.process.wait()
        except TimeoutError:
            raise AssertionError(f"processor {self.owner} did not exit within {timeout} s:\n"
                                 f"{self.stderr()[-3000:]}") from None

    async def terminate(self, timeout: float = 20) -> int:  # noqa: ASYNC109
        """SIGTERM and wait for the exit; returns the exit code."""
        if self.running:
            if self.paused:
                self.resume()
            self.process.send_signal(signal.SIGTERM)
        return await self.wait(timeout)

    async def wait_log(self, fragment: str, timeout: float = 20) -> str:  # noqa: ASYNC109
        """Wait until stderr contains ``fragment``; return the first line holding it."""
        def found() -> str | None:
            for line in self.stderr().splitlines():
                if fragment in line:
                    return line
            if not self.running:
                raise AssertionError(f"processor {self.owner} exited "
                                     f"({self.process.returncode}) before logging {fragment!r}:"
                                     f"\n{self.stderr()[-3000:]}")
            return None
        try:
            return await wait_until(found, timeout=timeout, message=f"{self.owner}: {fragment}")
        except AssertionError as error:
            raise AssertionError(f"{error}; its log:\n{self.stderr()[-3000:]}") from None

    async def get(self, path: str) -> httpx.Response:
        """GET from the health port. Raises httpx errors when nobody answers."""
        assert self.health_port, f"processor {self.owner} runs without a health port"
        async with httpx.AsyncClient(timeout=5) as http:
            return await http.get(f"http://127.0.0.1:{self.health_port}{path}")

    async def metrics(self) -> dict[str, float]:
        """The Prometheus samples, keyed by name with labels (``x_total{outcome="ok"}``)."""
        samples: dict[str, float] = {}
        for line in (await self.get("/metrics")).text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples


class Cluster:
    """Processors, a handler and a fresh table prefix on the test PostgreSQL database.

    ``async with Cluster(tmp_path, handler) as cluster``: migrates the prefix and
    serves the handler; on exit kills every process still running, stops the
    server and drops the prefix's tables.
    """

    def __init__(self, tmp_path: Path, handler: RecordingHandler | Any | None = None, *,
                 db_url: str = POSTGRES_URL, name: str = "h") -> None:
        self.tmp_path = tmp_path
        self.handler = handler
        self.db_url = db_url
        self.prefix = f"{name}{uuid.uuid4().hex[:10]}_"
        self.processors: list[Processor] = []
        self.base_url = ""
        self.client: AsyncClient
        self.sql: AsyncEngine
        self._stack = contextlib.AsyncExitStack()
        self._numbers = itertools.count(1)

    async def __aenter__(self) -> Cluster:
        await asyncio.to_thread(upgrade, self.db_url, self.prefix)
        self._stack.push_async_callback(asyncio.to_thread, downgrade, self.db_url, self.prefix)
        self.client = AsyncClient(self.db_url, self.prefix)
        self._stack.push_async_callback(self.client.close)
        self.sql = create_async_engine(parse_database_url(self.db_url).async_url)
        self._stack.push_async_callback(self.sql.dispose)
        if self.handler is not None:
            self.base_url = await self._stack.enter_async_context(serve_app(self.handler))
            if isinstance(self.handler, RecordingHandler):
                # Held calls would keep the server from shutting down.
                self._stack.callback(self.handler.release_all)
        self._stack.push_async_callback(self.kill_all)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def kill_all(self) -> None:
        """kill -9 every processor still running and reap it."""
        for proc in self.processors:
            proc.kill()
        for proc in self.processors:
            with contextlib.suppress(ProcessLookupError):
                await proc.process.wait()

    def app_name(self, owner: str = "") -> str:
        """The PostgreSQL application_name of a processor's sessions (a prefix of it if '')."""
        return f"sft-{self.prefix}{owner}"[:63]

    async def start(self, owner: str | None = None, *args: str, health: bool = False,
                    db_url: str | None = None, handler_url: str | None = None,
                    fast: bool = True, env: dict[str, str] | None = None) -> Processor:
        """Start ``processor run`` with a unique owner id (``p<n>`` unless given)."""
        owner = owner or f"p{next(self._numbers)}"
        if db_url is None:
            db_url = with_query(self.db_url, application_name=self.app_name(owner))
        if handler_url is None:
            handler_url = f"{self.base_url}/p/{owner}"
        health_port = free_port() if health else 0
        stdout_path = self.tmp_path / f"{owner}.out"
        stderr_path = self.tmp_path / f"{owner}.err"
        command = [PROCESSOR, "run", "--handler-url", handler_url, "--db-url", db_url,
                   "--table-prefix", self.prefix, "--owner-id", owner,
                   "--health-host", "127.0.0.1", "--health-port", str(health_port),
                   *(FAST if fast else ()), *args]
        with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
            process = await asyncio.create_subprocess_exec(
                *command, stdout=out, stderr=err, stdin=asyncio.subprocess.DEVNULL,
                env={**os.environ, **(env or {})})
        proc = Processor(owner, process, stdout_path, stderr_path, health_port)
        self.processors.append(proc)
        return proc

    async def start_many(self, count: int, *args: str, health: bool = False
                         ) -> list[Processor]:
        """Start ``count`` processors and wait until each one's watcher runs."""
        procs = [await self.start(None, *args, health=health) for _ in range(count)]
        await asyncio.gather(*(proc.wait_log("action=watcher_started") for proc in procs))
        return procs

    # -- data -------------------------------------------------------------------

    async def create(self, partitions: int, items: int, *, name: str = "part",
                     data: bytes | None = None) -> dict[str, list[str]]:
        """Create pass-counter partitions; returns partition id -> item ids."""
        layout = {f"{name}{n:03d}": [f"item{m}" for m in range(items)]
                  for n in range(partitions)}
        for partition_id, item_ids in layout.items():
            await self.client.create_partition(
                partition_id, [NewItem(item_id, data or initial_data()) for item_id in item_ids])
        return layout

    async def partitions(self) -> dict[str, PartitionInfo]:
        """Every partition of the namespace by id."""
        return {info.id: info for info in await self.client.partitions(limit=10_000)}

    async def items(self, partition_ids: Iterable[str]) -> list[ItemInfo]:
        """Every item of the given partitions."""
        found: list[ItemInfo] = []
        for partition_id in partition_ids:
            found += await self.client.items(partition_id)
        return found

    async def wait_settled(self, partition_ids: Iterable[str], timeout: float  # noqa: ASYNC109
                           ) -> dict[str, PartitionInfo]:
        """Wait until every partition is complete or failed; returns them."""
        ids = set(partition_ids)

        async def settled() -> dict[str, PartitionInfo] | None:
            infos = await self.partitions()
            return infos if all(infos[pid].status in SETTLED for pid in ids) else None

        try:
            return await wait_until(settled, timeout=timeout, interval=0.1,
                                    message=f"{len(ids)} partitions to settle")
        except AssertionError:
            infos = await self.partitions()
            open_ = {pid: (infos[pid].status, infos[pid].gate, infos[pid].owner,
                           infos[pid].counts) for pid in sorted(ids)
                     if infos[pid].status not in SETTLED}
            raise AssertionError(
                f"partitions not settled after {timeout} s: {open_}\n" + self.log_tail()
            ) from None

    async def live_owners(self) -> dict[str, list[str]]:
        """Owner -> the available partitions it holds with an unexpired lease (DB clock)."""
        now = await self.client.store.now()
        owners: dict[str, list[str]] = defaultdict(list)
        for info in await self.client.partitions(status="available", limit=10_000):
            if info.owner and info.until > now:
                owners[info.owner].append(info.id)
        return dict(owners)

    def log_tail(self, lines: int = 25) -> str:
        """The last lines of every processor's stderr, for failure messages."""
        return "\n".join(
            f"--- {proc.owner} (exit {proc.process.returncode}):\n"
            + "\n".join(proc.stderr().splitlines()[-lines:])
            for proc in self.processors)

    # -- SQL --------------------------------------------------------------------

    async def query(self, statement: str, **params: Any) -> list[Any]:
        """Run one SQL statement on a connection of the test's own."""
        async with self.sql.begin() as conn:
            result = await conn.execute(text(statement), params)
            return list(result.all()) if result.returns_rows else []

    async def terminate_sessions(self, owner: str = "") -> int:
        """pg_terminate_backend every session of ``owner`` (or of all the processors)."""
        name = self.app_name(owner)
        rows = await self.query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend' AND left(application_name, :n) = :name",
            n=len(name), name=name)
        return sum(1 for (done,) in rows if done)

    async def session_states(self, owner: str) -> list[str]:
        """The states of ``owner``'s PostgreSQL sessions (idle, active, idle in transaction)."""
        rows = await self.query(
            "SELECT coalesce(state, '') FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = :name",
            name=self.app_name(owner))
        return [state for (state,) in rows]

    async def pause_outside_transaction(self, proc: Processor, attempts: int = 50) -> None:
        """SIGSTOP ``proc`` at a moment it holds no open transaction.

        A process frozen inside a transaction keeps its row locks, and every
        other processor's write to those rows waits for it without a timeout
        (``test_a_stuck_row_lock_costs_only_its_own_partition``); callers that
        test something else pause at a clean point instead.
        """
        for _ in range(attempts):
            proc.pause()
            states = await wait_until(
                lambda: self._settled_states(proc.owner), timeout=10,
                message=f"{proc.owner}'s queries to finish")
            if not any(state.startswith("idle in transaction") for state in states):
                return
            proc.resume()
            await wait_until(lambda: self.no_transaction(proc.owner), timeout=10,
                             message=f"{proc.owner} to leave its transaction")
        raise AssertionError(f"could not pause {proc.owner} outside a transaction")

    async def _settled_states(self, owner: str) -> list[str] | None:
        states = await self.session_states(owner)
        return None if "active" in states else states or ["none"]

    async def no_transaction(self, owner: str) -> bool:
        """Whether none of ``owner``'s sessions runs a query or holds a transaction open."""
        return not any(s.startswith("idle in transaction") or s == "active"
                       for s in await self.session_states(owner))


# --------------------------------------------------------------------------- proxy


class TcpProxy:
    """A loopback TCP proxy to a target: ``forward``, ``stall`` (connections stay open
    but no byte moves: a network partition), ``reject`` (accept and close at once:
    the server is down) and ``cut`` (close every open connection).

    ``accepted`` counts connection attempts, so a test can see retries happen.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.mode = "reject"
        self.accepted = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._flowing = asyncio.Event()

    async def __aenter__(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self.cut()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def forward(self) -> None:
        """Pass connections through to the target (and release stalled traffic)."""
        self.mode = "forward"
        self._flowing.set()

    def stall(self) -> None:
        """Keep connections (and accept new ones) but move no data until :meth:`forward`."""
        self.mode = "stall"
        self._flowing.clear()

    def reject(self) -> None:
        """Accept new connections and close them at once (the database is down)."""
        self.mode = "reject"

    def cut(self) -> None:
        """Close every open connection, both ways."""
        for writer in list(self._links):
            writer.transport.abort()
        self._links.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.mode == "reject":
            writer.transport.abort()
            return
        # Registered at once, so a cut() while the upstream connects closes it too.
        self._links.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        if writer not in self._links:  # cut meanwhile
            up_writer.transport.abort()
            return
        self._links.add(up_writer)
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                await self._flowing.wait()
                sink.write(data)
                await sink.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            sink.transport.abort()
            self._links.discard(sink)


def postgres_address() -> tuple[str, int]:
    """Host and port of the test PostgreSQL server."""
    url = parse_database_url(POSTGRES_URL).async_url
    return url.host or "127.0.0.1", url.port or 5432


def via(url: str, port: int, *, password: str | None = None) -> str:
    """``url`` pointed at 127.0.0.1:``port`` (and with ``password``, if given)."""
    parsed = parse_database_url(url).async_url.set(host="127.0.0.1", port=port,
                                                   drivername="postgresql")
    if password is not None:
        parsed = parsed.set(password=password)
    return parsed.render_as_string(hide_password=False)


def closed_port() -> int:
    """A loopback port nobody listens on (it was free a moment ago)."""
    return free_port()


# --------------------------------------------------------------------------- TLS


@contextlib.asynccontextmanager
async def serve_tls(app: Any, certfile: Path, keyfile: Path) -> AsyncIterator[str]:
    """Serve ``app`` over HTTPS on loopback; yields ``https://127.0.0.1:PORT``."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", lifespan="off",
        access_log=False, ssl_certfile=str(certfile), ssl_keyfile=str(keyfile)))
    task = asyncio.create_task(server.serve())
    try:
        await wait_until(lambda: server.started or task.done(), timeout=10,
                         message="TLS server start")
        if task.done():
            task.result()
        yield f"https://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(task, timeout=10)


def warning_lines(log: str) -> list[str]:
    """The WARNING lines of a processor's log."""
    return [line for line in log.splitlines() if " WARNING " in line]
