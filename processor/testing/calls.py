"""The test kit's processors: the HTTP processor the service runs, with the calls in
flight counted (so the kit knows when the engine is quiet), and, for the calls-twice
mode, every item's call sent twice, the copies of a read's calls shuffled, and the
answers compared as ``processor check-handler`` compares them
(:func:`processor.handler_check.differing`).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import random
from collections.abc import Sequence
from typing import Any

from processor.handler_check import Answer, Finding, differing
from processor.http.processor import HttpProcessor
from watcher.protocol import ReduceCall, ReduceResult, ReduceShape, Result, WorkItem


class CountedProcessor:
    """``http``, with the calls to it in flight counted in :attr:`in_flight`: what the
    kit's watcher calls (items, reduces, the reduce's shape, the outage probe)."""

    call_tracer = None  # the kit traces no call (watcher.dispatch.spans.find_tracer)

    def __init__(self, http: HttpProcessor) -> None:
        self.http = http
        self.in_flight = 0

    async def _counted(self, call: Any) -> Any:
        self.in_flight += 1
        try:
            return await call
        finally:
            self.in_flight -= 1

    async def process(self, item: WorkItem) -> Result:
        result: Result = await self._counted(self.http.process(item))
        return result

    async def reduce(self, call: ReduceCall) -> ReduceResult:
        result: ReduceResult = await self._counted(self.http.reduce(call))
        return result

    async def reduce_shape(self) -> ReduceShape | None:
        shape: ReduceShape | None = await self._counted(self.http.reduce_shape())
        return shape

    async def probe_handler(self) -> bool:
        return await self.http.probe_handler()


def _plain(value: Any) -> Any:
    """``value`` with its bytes shown as a finding shows them: JSON as its value, other
    UTF-8 as text, anything else as base64."""
    if isinstance(value, bytes):
        try:
            return json.loads(value)
        except ValueError:
            try:
                return value.decode()
            except UnicodeDecodeError:
                return {"data_b64": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {key: _plain(each) for key, each in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(each) for each in value]
    return value


def answer_of(outcome: Result | BaseException) -> Answer:
    """One copy's outcome as :class:`~processor.handler_check.Answer` compares it: a
    result's fields (the unset ones left out), or the error's kind and message (the
    message the engine would store)."""
    if isinstance(outcome, Result):
        fields = dataclasses.asdict(outcome)
        return Answer("result", {key: _plain(value) for key, value in fields.items()
                                 if value not in (None, [], ())})
    return Answer(type(outcome).__name__, str(outcome))


class CallsTwice(CountedProcessor):
    """Every item's call sent twice with the same ``Idempotency-Key`` (and completion
    token): the copies of one read's calls in an order shuffled by ``seed``, one after
    another. The engine gets the first copy's answer; each call whose copies were
    answered differently is added to :attr:`findings`."""

    def __init__(self, http: HttpProcessor, seed: int = 0) -> None:
        super().__init__(http)
        self.random = random.Random(seed)
        self.findings: list[Finding] = []

    async def process(self, item: WorkItem) -> Result:
        (outcome,) = await self.process_batch([item])
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def process_batch(self, items: Sequence[WorkItem]) -> list[Result | Exception]:
        """Each of ``items`` called twice, the copies shuffled; the first copy's answer
        for each (a :class:`Result` or the error it raised)."""
        copies = [(n, copy) for n in range(len(items)) for copy in range(2)]
        self.random.shuffle(copies)
        outcomes: list[list[Result | Exception]] = [[] for _ in items]
        for n, _ in copies:
            try:
                outcomes[n].append(await self._counted(self.http.process(items[n])))
            except asyncio.CancelledError:
                raise
            except Exception as error:  # the engine's answer, as process would raise it
                outcomes[n].append(error)
        for item, both in zip(items, outcomes, strict=True):
            finding = differing(item.id, item.gate, [answer_of(each) for each in both])
            if finding is not None:
                self.findings.append(finding)
        return [both[0] for both in outcomes]
