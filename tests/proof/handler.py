"""The scripted handler: an ASGI app serving every service of the run at
``/svc/<service>``, answering each call from the item's own data, and recording each call
in the history.

An item's data carries its script (``s``: one step per gate), its last gate
(``last``), how many items it spawns (``sp``), how long it parks (``wt``) and its
trail (``t``): each answer appends ``"<gate>:<how>@<source>"``, where ``how`` is
``n`` (a call moved it on; ``source`` is the call's number), ``w`` (a call parked it)
or ``c`` (a completion by token moved it on; ``source`` is the completion's number,
written by the completer). So the data the run leaves behind says which call or
completion made each step.

Steps: ``next`` moves the item to the next gate (or completes it at its last);
``spawn`` does too, and spawns ``sp`` items at the gate; ``wait`` parks it (the
first time at that gate: a call after its deadline moves it on); ``burst`` moves it on
once every item of its partition at that gate has been called (or 2 s have passed), so
all the answers arrive at the same moment.

A service fault (``fail``) makes the next calls to a service answer an HTTP status
(with ``Retry-After`` when given) and write nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.acceptance.harness.handler import _unless_disconnected
from tests.proof.history import Event, History
from tests.proof.plan import BURST, NEXT, SPAWN, WAIT
from tests.support.handler_apps import read_request
from tests.support.servers import answered_probe, send_json

BURST_PATIENCE = 2.0


def item_data(script: tuple[str, ...], *, spawn: int = 0, wait_timeout: float = 3.0,
              first_gate: int = 0) -> dict[str, Any]:
    """The data an item starts with (``first_gate``: a spawned item's gate, where its
    trail begins)."""
    return {"s": list(script), "last": len(script) - 1, "sp": spawn, "wt": wait_timeout,
            "t": [], "g0": first_gate}


def leave(data: dict[str, Any], gate: int, entry: str) -> dict[str, Any]:
    """The answer that moves an item on from ``gate`` with ``entry`` in its trail."""
    moved = {**data, "t": [*data["t"], f"{gate}:{entry}"]}
    if gate >= data["last"]:
        return {"done": True, "data": moved}
    return {"gate": gate + 1, "data": moved}


@dataclass
class Fault:
    """The next ``count`` calls to a service answer ``status`` (with ``retry_after``)."""

    status: int
    count: int
    retry_after: int | None


class ScriptedHandler:
    """The handler of a proof run (see the module docstring).

    ``burst_size`` gives the number of items of each burst partition;
    ``on_park(call_event, data)`` is told of each parking answer (the completer's cue).
    """

    def __init__(self, history: History, burst_size: dict[str, int],
                 on_park: Callable[[Event, dict[str, Any]], None]) -> None:
        self.history = history
        self.burst_size = burst_size
        self.on_park = on_park
        self.faults: dict[str, list[Fault]] = defaultdict(list)
        self._arrived: dict[tuple[str, int], set[str]] = defaultdict(set)
        self._bursts: dict[tuple[str, int], asyncio.Event] = defaultdict(asyncio.Event)
        self.calls = 0

    def fail(self, service: str, status: int, count: int, retry_after: int | None) -> None:
        """Answer the next ``count`` calls to ``service`` with ``status``."""
        self.faults[service].append(Fault(status, count, retry_after))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await answered_probe(scope, send):
            return
        path = scope["path"]
        request = await read_request(scope, receive)
        service = path.split("/")[2] if path.startswith("/svc/") else path
        event = self.history.add(
            "call", seq=self.calls, service=service, caller=request.headers.get("x-caller", ""),
            partition=request.partition_id, item=request.item_id, gate=request.gate,
            attempt=request.attempt, key=request.key,
            token=request.headers.get("x-completion-token", ""), started=self.history.now(),
            trail=None,
            finished=None, status=None, retry_after=None, outcome="pending", answer=None)
        self.calls += 1
        status, answer, headers = self._fault(service)
        try:
            data = json.loads(request.body)
        except ValueError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("t"), list):
            event["trail"] = len(data["t"])  # which step of the item this call is for
        if status is None:
            answered = await _unless_disconnected(self._answer(event, data), receive)
            if not answered:
                event["outcome"] = "abandoned"
                event["finished"] = self.history.now()
                return
            status, answer = 200, event["answer"]
            event["outcome"] = "ok"
        else:
            event["outcome"], event["answer"] = "fault", answer
            event["retry_after"] = dict(headers).get("retry-after")
        event["status"] = status
        event["finished"] = self.history.now()
        await send_json(send, status, answer, headers=headers)
        if event["outcome"] == "ok" and "wait" in answer:
            self.on_park(event, answer["data"])

    def _fault(self, service: str) -> tuple[int | None, Any, list[tuple[str, str]]]:
        queue = self.faults.get(service)
        if not queue:
            return None, None, []
        fault = queue[0]
        fault.count -= 1
        if fault.count <= 0:
            queue.pop(0)
        headers = [] if fault.retry_after is None else [("retry-after", str(fault.retry_after))]
        return fault.status, {"error": {"message": f"fault {fault.status}"}}, headers

    async def _answer(self, event: Event, data: Any) -> None:
        """Fill in the call's answer, after the step's own time."""
        gate, pid, item = event["gate"], event["partition"], event["item"]
        digest = hashlib.sha256(f"{pid}/{item}/{gate}/{event['attempt']}".encode()).digest()
        await asyncio.sleep(digest[0] / 255 * 0.2)  # the step's work: 0 to 0.2 s
        if not isinstance(data, dict) or "s" not in data:
            event["answer"] = {"error": {"message": "not proof data", "no_retry": True}}
            return
        step = data["s"][gate] if 0 <= gate < len(data["s"]) else NEXT
        parked_before = any(entry.startswith(f"{gate}:w@") for entry in data["t"])
        if step == WAIT and not parked_before:
            event["answer"] = {"wait": {"timeout": data["wt"]},
                               "data": {**data, "t": [*data["t"], f"{gate}:w@{event['seq']}"]}}
            return
        if step == BURST:
            place = (pid, gate)
            self._arrived[place].add(item)
            if len(self._arrived[place]) >= self.burst_size.get(pid, 1):
                self._bursts[place].set()
            try:
                async with asyncio.timeout(BURST_PATIENCE):
                    await self._bursts[place].wait()
            except TimeoutError:
                pass
        answer = leave(data, gate, f"n@{event['seq']}")
        if step == SPAWN and data["sp"]:
            answer["spawn"] = [
                {"id": f"{item}.c{n}", "data": item_data((NEXT,) * len(data["s"]),
                                                          first_gate=gate)}
                for n in range(data["sp"])]
        event["answer"] = answer
