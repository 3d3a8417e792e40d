"""The recording handler: an ASGI app that follows the HTTP handler contract and logs
every call with its own monotonic timestamps.

Its default behaviour is a *pass counter*: every item needs ``passes``
successful calls at each of ``gates`` gates, and each answer appends
``"gate:pass@call"`` to the item's ``trail``, so the data persisted at the end
says exactly which call's result was written for every step.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tests.support.handler_apps import Request, read_request
from tests.support.servers import send_json


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
            await send_json(send, 200, {"status": "ok"})
            return
        path = scope["path"]
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
