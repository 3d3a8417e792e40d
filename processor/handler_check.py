"""``processor check-handler``: is a handler's step idempotent, as the guarantees ask?

statefeed calls a handler at least once per step (docs/explanation/guarantees.md), and
every repeat carries the same ``Idempotency-Key``. This sends each call of a set of
items twice (or ``repeats`` times) with the same key, the copies shuffled among the other
items' so they arrive out of order, and reports every call whose answers differ (status
or JSON body), and, with a probe URL, every call whose side effects the probe sees
change between its first and its last copy.

It checks what it can see from outside: equal answers for equal keys, and what a probe
reports. A handler whose side effect is invisible to both (an e-mail sent twice) can
still pass; write a probe that shows it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from watcher.protocol import step_key
from watcher.waits import new_completion_token


@dataclass(frozen=True)
class StepCall:
    """One step to call: an item (id, gate, data bytes) of the checked partition."""

    item_id: str
    gate: int
    data: bytes


@dataclass(frozen=True)
class Answer:
    """What one copy of a call was answered: status and body (JSON, or the text)."""

    status: int | str
    body: Any

    def same(self, other: Answer) -> bool:
        return self.status == other.status and self.body == other.body


@dataclass
class Finding:
    """A call whose copies were answered differently (``what`` = ``answer``) or whose
    side effects the probe saw change after a repeat (``what`` = ``probe``)."""

    item_id: str
    gate: int
    what: str
    first: Any
    later: Any

    def line(self) -> str:
        return (f"item {self.item_id!r} gate {self.gate}: {self.what} differs: first "
                f"{_short(self.first)}, then {_short(self.later)}")


@dataclass
class Report:
    """What a check found: the calls made, and each difference."""

    calls: int = 0
    items: int = 0
    findings: list[Finding] = field(default_factory=list)

    @property
    def idempotent(self) -> bool:
        return not self.findings


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str) if not isinstance(value, str) \
        else value
    return text if len(text) <= 200 else text[:197] + "..."


def read_items(path: Path) -> list[StepCall]:
    """The items of an NDJSON file as ``processor create --items`` takes it: one JSON
    object a line with ``id``, an optional ``gate`` (0) and ``data`` (any JSON) or
    ``data_b64``.

    Raises:
        ValueError: a line is not such an object (the message names the line).
    """
    calls = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            if "data_b64" in raw:
                data = base64.b64decode(raw["data_b64"], validate=True)
            else:
                data = json.dumps(raw.get("data"), separators=(",", ":")).encode()
            gate = raw.get("gate", 0)
            if not isinstance(raw["id"], str) or type(gate) is not int or gate < 0:
                raise ValueError("id must be a string, gate a whole number")
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{path} line {number}: not an item ({error})") from None
        calls.append(StepCall(raw["id"], gate, data))
    return calls


def differing(item_id: str, gate: int, answers: Sequence[Answer | None]) -> Finding | None:
    """The finding for one call whose copies (in the order they were sent; ``None``: a
    copy not sent) were not all answered alike: the first answer, and the first later
    one that differs from it. ``None`` when they agree. What ``processor check-handler``
    and the test kit's calls-twice mode (:mod:`processor.testing`) both report."""
    first = answers[0] if answers else None
    for later in answers[1:]:
        if first is not None and later is not None and not first.same(later):
            return Finding(item_id, gate, "answer", [first.status, first.body],
                           [later.status, later.body])
    return None


async def _send(http: httpx.AsyncClient, url: str, partition: str, call: StepCall,
                headers: dict[str, str]) -> Answer:
    """One copy of a call, as a processor makes it (docs/reference/http-contract.md)."""
    sent = {**headers, "Content-Type": "application/octet-stream",
            "X-Partition-Id": quote(partition, safe=""),
            "X-Item-Id": quote(call.item_id, safe=""), "X-Gate": str(call.gate),
            "X-Attempt": "1", "Idempotency-Key": step_key(partition, call.item_id, 1),
            "X-Completion-Token": new_completion_token()}
    try:
        response = await http.post(url, content=call.data, headers=sent)
    except httpx.HTTPError as error:
        return Answer("no answer", f"{type(error).__name__}: {error}")
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    return Answer(response.status_code, body)


async def _probe(http: httpx.AsyncClient, probe_url: str, partition: str,
                 call: StepCall) -> Any:
    try:
        response = await http.get(probe_url, params={"partition_id": partition,
                                                     "item_id": call.item_id,
                                                     "gate": call.gate})
        return {"status": response.status_code, "body": response.text}
    except httpx.HTTPError as error:
        return f"no answer: {type(error).__name__}"


async def check_handler(url: str, calls: Sequence[StepCall], *, repeats: int = 2,
                        seed: int = 0, partition: str = "check-handler",
                        probe_url: str | None = None, headers: dict[str, str] | None = None,
                        timeout: float = 30.0, concurrency: int = 1) -> Report:  # noqa: ASYNC109
    """Send each of ``calls`` ``repeats`` times to ``url`` with one Idempotency-Key per
    call, every copy shuffled (by ``seed``) among the others, ``concurrency`` at a time;
    with ``probe_url``, GET it (``?partition_id=&item_id=&gate=``) after the first and
    after the last copy of each call. Returns what differed.

    Raises:
        ValueError: ``repeats`` is below 2, ``concurrency`` below 1, or two calls share
            an item id.
    """
    if repeats < 2 or concurrency < 1:
        raise ValueError("repeats must be 2 or more, concurrency 1 or more")
    if len({c.item_id for c in calls}) != len(calls):
        raise ValueError("two items share an id: each call is named by its item id")
    order = [(n, copy) for n in range(len(calls)) for copy in range(repeats)]
    random.Random(seed).shuffle(order)
    # The copies of one call keep their numbers in the order they are sent.
    sent_so_far = [0] * len(calls)
    numbered = []
    for n, _ in order:
        numbered.append((n, sent_so_far[n]))
        sent_so_far[n] += 1
    answers: list[list[Answer | None]] = [[None] * repeats for _ in calls]
    probes: list[list[Any]] = [[None, None] for _ in calls]
    report = Report(items=len(calls))
    gate = asyncio.Semaphore(concurrency)
    locks = [asyncio.Lock() for _ in calls]  # a probe reads after its own call's copy

    async def one(n: int, copy: int, http: httpx.AsyncClient) -> None:
        async with gate, locks[n]:
            answers[n][copy] = await _send(http, url, partition, calls[n], headers or {})
            report.calls += 1
            if probe_url and copy in (0, repeats - 1):
                probes[n][0 if copy == 0 else 1] = await _probe(http, probe_url, partition,
                                                                calls[n])

    async with httpx.AsyncClient(timeout=timeout) as http:
        if concurrency == 1:
            for n, copy in numbered:
                await one(n, copy, http)
        else:
            await asyncio.gather(*(one(n, copy, http) for n, copy in numbered))
    for n, call in enumerate(calls):
        finding = differing(call.item_id, call.gate, answers[n])
        if finding is not None:
            report.findings.append(finding)
        if probe_url and probes[n][0] != probes[n][1]:
            report.findings.append(Finding(call.item_id, call.gate, "probe", probes[n][0],
                                           probes[n][1]))
    return report
