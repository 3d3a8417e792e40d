"""``processor check-handler`` against two small handlers served by uvicorn on loopback:
one idempotent (it keeps each answer by Idempotency-Key), which passes, and one that
counts its calls into its answer, which is reported; and a probe that sees a side effect
repeated although the answers agree."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

from processor.handler_check import StepCall, check_handler
from tests.acceptance.harness.processes import run_cli
from tests.support.handler_apps import read_request
from tests.support.servers import answered_probe, send_json, serve_app

CALLS = [StepCall(f"i{n}", n % 2, json.dumps({"n": n}).encode()) for n in range(6)]


class Keyed:
    """Idempotent: the first answer for a key is kept and given again; a side effect
    (``done``) counted once per key."""

    def __init__(self) -> None:
        self.answers: dict[str, Any] = {}
        self.done: Counter[str] = Counter()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and scope["path"] == "/probe":
            query = dict(part.split("=") for part in scope["query_string"].decode().split("&"))
            await send_json(send, 200, {"done": self.done[query["item_id"]]})
            return
        if await answered_probe(scope, send):
            return
        request = await read_request(scope, receive)
        if request.key not in self.answers:
            self.done[request.item_id] += 1
            self.answers[request.key] = {"done": True, "data": {"seen": request.item_id}}
        await send_json(send, 200, self.answers[request.key])


class Counting(Keyed):
    """Not idempotent: its answer says how many calls it has had."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await answered_probe(scope, send):
            return
        request = await read_request(scope, receive)
        self.done[request.item_id] += 1
        await send_json(send, 200, {"done": True, "data": {"calls": sum(self.done.values())}})


class SideEffectTwice(Keyed):
    """Answers the same each time, but does its side effect on every call."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            body = await read_request(scope, receive)
            self.done[body.item_id] += 1
            await send_json(send, 200, {"done": True})
            return
        await super().__call__(scope, receive, send)


async def test_an_idempotent_handler_passes_and_a_counting_one_is_reported() -> None:
    async with serve_app(Keyed()) as url:
        report = await check_handler(url, CALLS, seed=3, probe_url=f"{url}/probe")
    assert report.idempotent, [f.line() for f in report.findings]
    assert report.calls == 12
    async with serve_app(Counting()) as url:
        report = await check_handler(url, CALLS, seed=3, concurrency=4)
    assert {f.item_id for f in report.findings} == {c.item_id for c in CALLS}
    assert all(f.what == "answer" for f in report.findings)


async def test_a_side_effect_repeated_behind_equal_answers_is_reported_by_the_probe() -> None:
    async with serve_app(SideEffectTwice()) as url:
        report = await check_handler(url, CALLS[:2], probe_url=f"{url}/probe")
    assert [(f.item_id, f.what) for f in report.findings] == [("i0", "probe"), ("i1", "probe")]


async def test_the_cli_exits_1_with_a_line_per_call_that_differs(tmp_path: Path) -> None:
    items = tmp_path / "items.ndjson"
    items.write_text("\n".join(json.dumps({"id": c.item_id, "gate": c.gate,
                                           "data": json.loads(c.data)}) for c in CALLS))
    async with serve_app(Keyed()) as url:
        good = await asyncio.to_thread(run_cli, "check-handler", url, "--items", str(items))
    assert good.returncode == 0, good.stderr
    assert "6 items, 12 calls: every repeat answered the same" in good.stdout
    async with serve_app(Counting()) as url:
        bad = await asyncio.to_thread(run_cli, "check-handler", url, "--items", str(items))
    assert bad.returncode == 1, bad.stderr
    assert "item 'i0' gate 0: answer differs: first [200" in bad.stdout
    assert "6 not idempotent" in bad.stdout
