"""The recording handler: an ASGI app that follows the HTTP handler contract and logs
every call with its own monotonic timestamps.

Its default behaviour is a *pass counter*: every item needs ``passes``
successful calls at each of ``gates`` gates, and each answer appends
``"gate:pass@call"`` to the item's ``trail``, so the data persisted at the end
says exactly which call's result was written for every step.

``POST .../reduce`` requests (a partition's reduce gate) are answered by a
*reduce counter* (see :class:`ReduceRequest`): the accumulator counts and sums
the items folded and lists the fold requests that made it (``chain``), and each
item's answer appends ``"gate:R@request"`` to its trail and counts the applies
in ``reduced``, so a page folded twice, a fold that skipped the stored
accumulator or an answer written twice shows in what the database holds.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from tests.support.handler_apps import Request, read_request
from tests.support.servers import answered_probe, read_body, send_json

REDUCE_PATH = "/reduce"


@dataclass
class Call(Request):
    """One request the handler received, who sent it, and what it answered.

    ``started`` is taken when the request reaches the app, ``finished`` just before
    the response body is handed to the server (so nothing the processor does with
    the answer can happen before it). Both are this process's ``time.monotonic()``.
    """

    seq: int
    caller: str
    started: float
    finished: float | None = None
    status: int | None = None
    outcome: str = "pending"  # ok, transient, poison, custom, cancelled, abandoned

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


@dataclass
class ReduceRequest:
    """One reduce request (``POST <handler URL>/reduce``) the handler received, who sent
    it, and what it answered (``answer``, the JSON payload).

    ``key`` is the ``Idempotency-Key`` header and ``body_key`` the body's
    ``idempotency_key``; ``items`` are (item id, data) in request order. Times as
    in :class:`Call`.
    """

    seq: int
    caller: str
    started: float
    partition_id: str
    gate: int
    attempt: int
    key: str
    body_key: str
    pass_: str
    page: int
    last: bool
    accumulator: Any
    items: list[tuple[str, bytes]]
    finished: float | None = None
    status: int | None = None
    outcome: str = "pending"  # as for Call
    answer: Any = None

    @property
    def ok(self) -> bool:
        """Whether the handler answered with a 2xx."""
        return self.status is not None and 200 <= self.status < 300

    @property
    def item_ids(self) -> list[str]:
        """The ids of the request's items, in request order."""
        return [item_id for item_id, _ in self.items]


def item_number(item_id: str) -> int:
    """The number in an item id (``item12`` -> 12; 0 without digits): what the reduce
    counter sums."""
    digits = re.sub(r"[^0-9]", "", item_id)
    return int(digits) if digits else 0


def empty_accumulator() -> dict[str, Any]:
    """The reduce counter's accumulator before the first item is folded."""
    return {"count": 0, "total": 0, "chain": []}


def initial_data() -> bytes:
    """The data every pass-counter item starts with."""
    return json.dumps({"g": 0, "p": 0, "trail": []}).encode()


def expected_trail(gates: int, passes: int) -> list[str]:
    """The steps a pass-counter item goes through, in order: ``["0:1", "0:2", "1:1", ...]``."""
    return [f"{g}:{p}" for g in range(gates) for p in range(1, passes + 1)]


class RecordingHandler:
    """The pass-counter handler (see the module docstring); every call is logged.

    The URL path ``/p/<owner>`` names the caller. Options:

    - ``failure_rate``: share of calls answered 500 at random (seeded by ``seed``).
    - ``delay``: seconds each call takes, or a function of the call.
    - ``hold``: a function of the call returning an event to wait on first (or None).
    - ``poison``: item ids always answered with ``poison_status``.
    - ``respond``: a function of the call returning ``(status, payload)`` to answer
      instead of the pass counter (or ``None`` to fall through to it).

    Reduce requests are logged in ``reduces`` and answered by the reduce counter;
    ``failure_rate`` applies to them too. ``reduce_next_gate`` is where reduced
    items go (``None``: they complete); ``reduce_hold``, ``reduce_delay`` and
    ``reduce_respond`` work as ``hold``, ``delay`` and ``respond`` do, for
    :class:`ReduceRequest`.
    """

    def __init__(self, *, gates: int = 2, passes: int = 2, failure_rate: float = 0.0,
                 seed: int = 0, delay: float | Callable[[Call], float] = 0.0,
                 hold: Callable[[Call], asyncio.Event | None] | None = None,
                 poison: Iterable[str] = (), poison_status: int = 500,
                 respond: Callable[[Call], Reply | None] | None = None,
                 reduce_next_gate: int | None = None,
                 reduce_hold: Callable[[ReduceRequest], asyncio.Event | None] | None = None,
                 reduce_delay: float | Callable[[ReduceRequest], float] = 0.0,
                 reduce_respond: Callable[[ReduceRequest], Reply | None] | None = None
                 ) -> None:
        self.gates = gates
        self.passes = passes
        self.failure_rate = failure_rate
        self.rng = random.Random(seed)
        self.delay = delay
        self.hold = hold
        self.poison = frozenset(poison)
        self.poison_status = poison_status
        self.respond = respond
        self.reduce_next_gate = reduce_next_gate
        self.reduce_hold = reduce_hold
        self.reduce_delay = reduce_delay
        self.reduce_respond = reduce_respond
        self.calls: list[Call] = []
        self.reduces: list[ReduceRequest] = []
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

    def reduces_in_flight(self, caller: str | None = None) -> list[ReduceRequest]:
        """Reduce requests received and not answered yet."""
        return [request for request in self.reduces
                if request.finished is None and request.outcome == "pending"
                and (caller is None or request.caller == caller)]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await answered_probe(scope, send):
            return
        path = scope["path"]
        if path.endswith(REDUCE_PATH):
            await self._serve_reduce(scope, receive, send)
            return
        call = await read_request(scope, receive, Call, seq=-1,
                                  caller=path[len("/p/"):] if path.startswith("/p/") else path,
                                  started=time.monotonic())
        # Numbered with no await before it is logged, so every number is unique.
        call.seq = len(self.calls)
        self.calls.append(call)
        try:
            if not await _unless_disconnected(self._wait(call), receive):
                call.outcome = "abandoned"  # the processor hung up (cancelled, killed)
                return
            status, payload, outcome = self.answer(call)
        except BaseException:
            call.outcome = "cancelled"
            raise
        call.status, call.outcome = status, outcome
        call.finished = time.monotonic()
        await send_json(send, status, payload)

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

    def answer(self, call: Call) -> tuple[int, Any, str]:
        """What the handler answers ``call``: (status, payload, outcome)."""
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
        # Other keys (the reduce counter's) are carried along unchanged.
        kept = {key: value for key, value in state.items() if key not in ("g", "p", "trail")}
        if passes < self.passes:
            return 200, {"data": {**kept, "g": call.gate, "p": passes, "trail": trail}}, "ok"
        if call.gate + 1 < self.gates:
            return 200, {"gate": call.gate + 1,
                         "data": {**kept, "g": call.gate + 1, "p": 0, "trail": trail}}, "ok"
        return 200, {"done": True,
                     "data": {**kept, "g": call.gate, "p": passes, "trail": trail}}, "ok"


    # -- reduces ---------------------------------------------------------------

    async def _serve_reduce(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope["path"][:-len(REDUCE_PATH)]
        request = _read_reduce(scope, await read_body(receive), seq=-1,
                               caller=path[len("/p/"):] if path.startswith("/p/") else path,
                               started=time.monotonic())
        # Numbered with no await before it is logged, so every number is unique.
        request.seq = len(self.reduces)
        self.reduces.append(request)
        try:
            if not await _unless_disconnected(self._wait_reduce(request), receive):
                request.outcome = "abandoned"
                return
            status, payload, outcome = self.answer_reduce(request)
        except BaseException:
            request.outcome = "cancelled"
            raise
        request.status, request.outcome, request.answer = status, outcome, payload
        request.finished = time.monotonic()
        await send_json(send, status, payload)

    async def _wait_reduce(self, request: ReduceRequest) -> None:
        event = (None if self.reduce_hold is None or self._released
                 else self.reduce_hold(request))
        if event is not None:
            self._holds.add(event)
            if self._released:
                event.set()
            await event.wait()
        delay = self.reduce_delay
        seconds = delay(request) if callable(delay) else delay
        if seconds > 0:
            await asyncio.sleep(seconds)

    def answer_reduce(self, request: ReduceRequest) -> tuple[int, Any, str]:
        """What the handler answers a reduce request: (status, payload, outcome).

        The reduce counter: fold adds the page's items to the accumulator
        (``count``, ``total`` of their numbers, ``chain`` of fold requests); the
        last fold page, and a one-call (``all``) reduce, return it as the
        partition result; apply (and ``all``) answer every item of the page.
        """
        if self.reduce_respond is not None:
            custom = self.reduce_respond(request)
            if custom is not None:
                return custom[0], custom[1], "custom"
        if self.failure_rate and self.rng.random() < self.failure_rate:
            return 500, {"error": {"message": "transient reduce failure, try again"}}, \
                "transient"
        name = f"reduce {request.seq} ({request.partition_id} {request.pass_} {request.page})"
        if request.pass_ == "apply":
            accumulator = request.accumulator
            if not isinstance(accumulator, dict):
                self.violations.append(f"{name}: apply without the final accumulator: "
                                       f"{accumulator!r:.80}")
                return 400, {"error": {"message": "no accumulator", "no_retry": True}}, "custom"
        else:
            start = request.accumulator
            if request.pass_ == "all" or request.page == 0:
                if start is not None:
                    self.violations.append(f"{name}: a first page came with an accumulator")
                start = empty_accumulator()
            elif not isinstance(start, dict):
                self.violations.append(f"{name}: page {request.page} came without the "
                                       "accumulator of the page before")
                return 400, {"error": {"message": "no accumulator", "no_retry": True}}, "custom"
            accumulator = {
                "count": start["count"] + len(request.items),
                "total": start["total"] + sum(item_number(i) for i in request.item_ids),
                "chain": [*start["chain"], request.seq],
            }
            if request.pass_ == "fold":
                payload: dict[str, Any] = {"accumulator": accumulator}
                if request.last:
                    payload["result"] = accumulator
                return 200, payload, "ok"
        answers = {item_id: self._reduced(request, item_id, data, accumulator)
                   for item_id, data in request.items}
        payload = {"items": answers}
        if request.pass_ == "all":
            payload["result"] = accumulator
        return 200, payload, "ok"

    def _reduced(self, request: ReduceRequest, item_id: str, data: bytes,
                 accumulator: dict[str, Any]) -> dict[str, Any]:
        """One item's answer from the reduce counter."""
        try:
            state = json.loads(data)
        except ValueError:
            state = None
        if not isinstance(state, dict) or "trail" not in state:
            self.violations.append(f"reduce {request.seq}: item {item_id} data is not "
                                   f"pass-counter state: {data[:80]!r}")
            state = {"g": request.gate, "p": 0, "trail": []}
        elif state["g"] != request.gate:
            self.violations.append(f"reduce {request.seq} ({request.partition_id}/{item_id}): "
                                   f"gate {request.gate} but data says gate {state['g']}")
        target = self.reduce_next_gate
        reduced = {**state, "g": request.gate if target is None else target, "p": 0,
                   "trail": [*state["trail"], f"{request.gate}:R@{request.seq}"],
                   "reduced": int(state.get("reduced", 0)) + 1,
                   "count": accumulator["count"]}
        if target is None:
            return {"done": True, "data": reduced}
        return {"gate": target, "data": reduced}


def _read_reduce(scope: dict[str, Any], body: bytes, **extra: Any) -> ReduceRequest:
    """A reduce request from its headers and JSON body (a field that is missing reads
    as empty, so a request that breaks the contract is still logged)."""
    headers = {key.decode("latin-1").lower(): value.decode("latin-1")
               for key, value in scope["headers"]}
    try:
        document = json.loads(body)
    except ValueError:
        document = {}
    if not isinstance(document, dict):
        document = {}
    items = [(entry.get("item_id", ""), base64.b64decode(entry.get("data_b64", "")))
             for entry in document.get("items") or []]
    return ReduceRequest(partition_id=document.get("partition_id", ""),
                         gate=int(document.get("gate", -1)),
                         attempt=int(document.get("attempt", 0)),
                         key=unquote(headers.get("idempotency-key", "")),
                         body_key=document.get("idempotency_key", ""),
                         pass_=document.get("pass", ""), page=int(document.get("page", -1)),
                         last=bool(document.get("last")), accumulator=document.get("accumulator"),
                         items=items, **extra)


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
