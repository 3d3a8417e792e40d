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

``/svc/<service>/batch`` takes the batch protocol: each entry is answered as a call
would be (and recorded as a ``call`` with its ``batch`` number). ``/svc/<service>/reduce``
takes a reduce gate's call (``pass: all``): it records a ``reduce`` event (the item ids
of the request, its Idempotency-Key), moves each item on with ``"<gate>:r@<reduce>"``
in its trail, and stores the result ``{"reduce": <number>, "items": [ids]}``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.acceptance.harness.handler import _unless_disconnected
from tests.proof.history import Event, History
from tests.proof.plan import BURST, NEXT, REDUCE, SPAWN, WAIT
from tests.support.handler_apps import read_request
from tests.support.servers import answered_probe, send_json
from watcher.waits import TIME_DIGITS

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


def sent_at(token: str, history: History) -> float | None:
    """When the processor built the call, on the run's clock: a completion token begins
    with the milliseconds of the wall clock it was made at (``watcher.waits``), and the
    processor makes a call's token as it builds the request, after the call passed its
    limits (a hold, a pause). ``None`` for a token without that prefix."""
    prefix = token[:TIME_DIGITS]
    if len(prefix) < TIME_DIGITS or not all(c in "0123456789abcdef" for c in prefix):
        return None
    return history.from_wall(int(prefix, 16) / 1000)


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
        self.batches = 0
        self.reduces = 0

    def fail(self, service: str, status: int, count: int, retry_after: int | None) -> None:
        """Answer the next ``count`` calls to ``service`` with ``status``."""
        self.faults[service].append(Fault(status, count, retry_after))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await answered_probe(scope, send):
            return
        path = scope["path"]
        request = await read_request(scope, receive)
        parts = path.split("/")
        service = parts[2] if path.startswith("/svc/") and len(parts) > 2 else path
        if path.endswith("/batch"):
            await self._batch(service, request, receive, send)
            return
        if path.endswith("/reduce"):
            await self._reduce(service, request, receive, send)
            return
        event = self._record(service, request.headers, request.partition_id,
                             request.item_id, request.gate, request.attempt, request.key,
                             request.headers.get("x-completion-token", ""))
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

    def _record(self, service: str, headers: dict[str, str], pid: str, item: str, gate: int,
                attempt: int, key: str, token: str, **extra: Any) -> Event:
        event = self.history.add(
            "call", seq=self.calls, service=service, caller=headers.get("x-caller", ""),
            routes=headers.get("x-routes"), partition=pid, item=item, gate=gate,
            attempt=attempt, key=key, token=token, sent=sent_at(token, self.history),
            started=self.history.now(), trail=None,
            finished=None, status=None, retry_after=None, outcome="pending", answer=None,
            **extra)
        self.calls += 1
        return event

    async def _batch(self, service: str, request: Any, receive: Any, send: Any) -> None:
        """The batch protocol: one call event per entry, answered in order."""
        self.batches += 1
        entries = json.loads(request.body)
        events = []
        for entry in entries:
            event = self._record(service, request.headers, entry["partition_id"],
                                 entry["item_id"], entry["gate"], entry["attempt"],
                                 entry["idempotency_key"], entry.get("completion_token", ""),
                                 batch=self.batches)
            try:
                data = json.loads(base64.b64decode(entry["data_b64"]))
            except ValueError:
                data = None
            if isinstance(data, dict) and isinstance(data.get("t"), list):
                event["trail"] = len(data["t"])
            events.append((event, data))
        status, answer, headers = self._fault(service)
        if status is None:
            work = asyncio.gather(*(self._answer(event, data) for event, data in events))
            if not await _unless_disconnected(work, receive):
                for event, _ in events:
                    event["outcome"], event["finished"] = "abandoned", self.history.now()
                return
            status, answer = 200, [event["answer"] for event, _ in events]
        for event, _ in events:
            event["status"], event["finished"] = status, self.history.now()
            if status == 200:
                event["outcome"] = "ok"
            else:
                event["outcome"], event["answer"] = "fault", answer
                event["retry_after"] = dict(headers).get("retry-after")
        await send_json(send, status, answer, headers=headers)
        if status == 200:
            for event, _ in events:
                if "wait" in event["answer"]:
                    self.on_park(event, event["answer"]["data"])

    async def _reduce(self, service: str, request: Any, receive: Any, send: Any) -> None:
        """A reduce gate's call: every item of the page moved on, the result stored."""
        body = json.loads(request.body)
        seq = self.reduces
        self.reduces += 1
        ids = sorted(entry["item_id"] for entry in body["items"]
                     if entry["status"] == "available")
        event = self.history.add(
            "reduce", seq=seq, service=service, caller=request.headers.get("x-caller", ""),
            partition=body["partition_id"], gate=body["gate"], attempt=body["attempt"],
            key=body["idempotency_key"], pass_=body["pass"], page=body["page"],
            last=body["last"], items=ids, started=self.history.now(), finished=None,
            status=None, outcome="pending")
        status, answer, headers = self._fault(service)
        if status is None:
            await asyncio.sleep(0.05)
            answers = {}
            for entry in body["items"]:
                if entry["status"] != "available":
                    continue
                data = json.loads(base64.b64decode(entry["data_b64"]))
                answers[entry["item_id"]] = leave(data, body["gate"], f"r@{seq}")
            answer = {"items": answers, "result": {"reduce": seq, "items": ids}}
            if body["pass"] == "fold":
                answer = {"accumulator": None}
            status = 200
            event["outcome"] = "ok"
        else:
            event["outcome"] = "fault"
        event["status"], event["finished"] = status, self.history.now()
        await send_json(send, status, answer, headers=headers)

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
        if step == REDUCE:
            event["answer"] = {"error": {"message": "a reduce gate called per item",
                                         "no_retry": True}}
            return
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
