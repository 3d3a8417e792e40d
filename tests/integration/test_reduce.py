"""Reduce gates end to end: a real Watcher and HttpProcessor against handlers served by
uvicorn on loopback (the handlers SDK, and raw recording handlers), on real SQLite,
PostgreSQL and MariaDB.

Each test asserts what the database ends up holding (items, the partition's
status, result and error) and what the reduce handler received.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

import handlers
from handlers import Item, Reduce, Reduced, ReducePage, Result
from processor import AsyncClient, InvalidInputError, NewItem
from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from tests.support.engine import running, wait_until
from tests.support.servers import serve_app
from watcher import Watcher, WatcherConfig
from watcher.errors import GateError
from watcher.protocol import ReduceCall, ReduceResult, WorkItem
from watcher.protocol import Result as EngineResult

FAST = {"poll_interval": 0.05, "lease_duration": 3.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2, "shutdown_timeout": 5.0}
WAIT = 30.0


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


@contextlib.asynccontextmanager
async def engine(make_store: Callable[..., Any], app: Any, *, max_retries: int = 5,
                 page_items: int = 100) -> AsyncIterator[None]:
    """Serve ``app`` with uvicorn and run a watcher whose HttpProcessor calls it."""
    async with serve_app(app) as url:
        processor = HttpProcessor(HttpProcessorConfig(handler_url=url + "/"))
        watcher = Watcher(make_store(), processor, WatcherConfig(
            owner_id="w1", max_retries=max_retries, reduce_page_items=page_items, **FAST))
        try:
            async with running(watcher) as (task,):
                yield
                assert not task.done(), "the watcher stopped by itself (crashed?)"
        finally:
            await processor.aclose()


def to_gate_one(item: Item) -> Result:
    """Gate 0: carry the item's number to gate 1."""
    return Result(gate=1, data={"n": item.json()})


def numbered(count: int) -> list[NewItem]:
    return [NewItem(f"i{n:02}", json.dumps(n).encode()) for n in range(count)]


@dataclass
class Recorder:
    """Wraps a reduce function and records every page it was asked to reduce."""

    reduce: Callable[[ReducePage], Any]
    pages: list[ReducePage] = field(default_factory=list)

    async def __call__(self, page: ReducePage) -> Any:
        self.pages.append(page)
        value = self.reduce(page)
        return await value if hasattr(value, "__await__") else value

    def seen(self) -> list[tuple[str, int, int]]:
        """(pass, page, item count) of each call, in order."""
        return [(p.pass_, p.page, len(p.items)) for p in self.pages]


async def test_one_call_reduce_applies_item_answers_default_and_result(
        make_store: Callable[..., Any], client: AsyncClient) -> None:
    def total(page: ReducePage) -> Reduced:
        values = {item.id: item.json()["n"] for item in page.items}
        return Reduced(items={"i03": Result(gate=2, data={"kept": True})},
                       default=Result(done=True), result={"sum": sum(values.values())})

    recorder = Recorder(total)
    app = handlers.app({0: to_gate_one, 2: lambda item: Result(done=True)},
                       reduce=recorder)
    await client.create_partition("p", numbered(8), reduce_gates=[1])
    async with engine(make_store, app):
        info = await client.wait("p", timeout=WAIT)
    assert info.status == "complete" and info.counts == {"complete": 8}
    assert info.result_json() == {"sum": sum(range(8))}
    assert info.reduce_gates == (1,) and info.reduce is None
    assert recorder.seen() == [("all", 0, 8)]
    items = {item.id: item for item in await client.items("p")}
    assert json.loads(items["i03"].data) == {"kept": True} and items["i03"].gate == 2
    assert all(items[f"i{n:02}"].gate == 1 for n in range(8) if n != 3)


def keep_largest(best: list[int] | None, items: list[Item]) -> list[int]:
    return sorted((best or []) + [item.json()["n"] for item in items], reverse=True)[:3]


def mark_top(best: list[int], items: list[Item]) -> dict[str, Result]:
    return {item.id: Result(done=True, data={"top": item.json()["n"] in best})
            for item in items}


async def test_big_gate_is_reduced_in_a_fold_pass_then_an_apply_pass(
        make_store: Callable[..., Any], client: AsyncClient) -> None:
    recorder = Recorder(Reduce(fold=keep_largest, apply=mark_top))
    app = handlers.app(to_gate_one, reduce=recorder)
    await client.create_partition("p", numbered(10), reduce_gates=[1])
    async with engine(make_store, app, page_items=4):
        info = await client.wait("p", timeout=WAIT)
    assert info.status == "complete" and info.counts == {"complete": 10}
    assert info.result_json() == [9, 8, 7]
    assert recorder.seen() == [("fold", 0, 4), ("fold", 1, 4), ("fold", 2, 2),
                               ("apply", 0, 4), ("apply", 1, 4), ("apply", 2, 2)]
    assert [p.last for p in recorder.pages] == [False, False, True] * 2
    assert recorder.pages[1].accumulator == [3, 2, 1]
    assert all(p.accumulator == [9, 8, 7] for p in recorder.pages[3:])
    keys = {p.idempotency_key for p in recorder.pages}
    assert len(keys) == 6
    tops = {item.id: json.loads(item.data)["top"] for item in await client.items("p")}
    assert {item_id for item_id, top in tops.items() if top} == {"i07", "i08", "i09"}


async def test_a_failing_reduce_is_retried_with_the_same_key(
        make_store: Callable[..., Any], client: AsyncClient) -> None:
    def flaky(page: ReducePage) -> Reduced:
        if page.attempt < 3:
            raise handlers.Retry("warming up")
        return Reduced(result={"attempt": page.attempt})

    recorder = Recorder(flaky)
    app = handlers.app(to_gate_one, reduce=recorder)
    await client.create_partition("p", numbered(3), reduce_gates=[1])
    async with engine(make_store, app):
        info = await client.wait("p", timeout=WAIT)
    assert info.status == "complete" and info.result_json() == {"attempt": 3}
    assert [p.attempt for p in recorder.pages] == [1, 2, 3]
    assert len({p.idempotency_key for p in recorder.pages}) == 1
    assert info.last_error is None


async def test_reduce_that_keeps_failing_fails_the_partition_and_retry_failed_resumes(
        make_store: Callable[..., Any], client: AsyncClient) -> None:
    broken = {"page": 1}
    ranking = Reduce(fold=keep_largest, apply=mark_top)
    recorder = Recorder(ranking)

    async def reduce(page: ReducePage) -> Any:
        if page.pass_ == "fold" and page.page == broken["page"]:
            raise handlers.Fail("the ranking model is missing")
        return await recorder(page)

    app = handlers.app(to_gate_one, reduce=Recorder(reduce))
    await client.create_partition("p", numbered(9), reduce_gates=[1])
    async with engine(make_store, app, page_items=3):
        info = await client.wait("p", timeout=WAIT)
        assert info.status == "failed"
        assert "the ranking model is missing" in (info.last_error or "")
        assert "gate 1 reduce fold page 1" in (info.last_error or "")
        assert info.counts == {"available": 9}
        assert info.reduce is not None and info.reduce.pass_ == "fold"
        broken["page"] = -1
        report = await client.retry_failed("p")
        assert (report.items_reset, report.reduce_rearmed, report.reopened) == (0, True, True)
        assert (report.items_rerun, report.gate) == (0, 1), "resumes from its stored page"
        info = await client.wait("p", timeout=WAIT)
    assert info.status == "complete" and info.result_json() == [8, 7, 6]
    # Page 0 of the fold was stored before the failure: it is not sent again.
    assert recorder.seen() == [("fold", 0, 3), ("fold", 1, 3), ("fold", 2, 3),
                               ("apply", 0, 3), ("apply", 1, 3), ("apply", 2, 3)]


async def test_a_retry_after_a_fan_in_with_failures_reduces_the_whole_gate_again(
        make_store: Callable[..., Any], client: AsyncClient) -> None:
    """The demo's case: two unreadable items fail at gate 0 of a "continue" partition,
    which ranks the others and completes. After the fix, retry re-opens it at gate 0;
    wait() waits; the reduce runs again over all eight (a new call: new keys), and the
    result counts every item."""
    unreadable = {"i02", "i05"}

    def extract(item: Item) -> Result:
        if item.id in unreadable:
            raise handlers.Fail("unreadable scan")
        return Result(gate=1)

    def total(page: ReducePage) -> Reduced:
        return Reduced(result={
            "sum": sum(item.json() for item in page.items if not item.failed),
            "failed": sorted(item.id for item in page.items if item.failed)})

    recorder = Recorder(total)
    app = handlers.app(extract, reduce=recorder)
    await client.create_partition("p", numbered(8), reduce_gates=[1],
                                  on_item_failure="continue")
    async with engine(make_store, app, max_retries=0):
        info = await client.wait("p", timeout=WAIT)
        assert info.status == "complete" and info.counts == {"complete": 6, "failed": 2}
        assert info.result_json() == {"sum": 28 - 2 - 5, "failed": ["i02", "i05"]}
        unreadable.clear()
        report = await client.retry_failed("p")
        assert (report.status_before, report.gate_before, report.gate) == ("complete", 1, 0)
        assert (report.items_reset, report.items_rerun) == (2, 6)
        info = await client.wait("p", timeout=WAIT)
    assert info.status == "complete" and info.counts == {"complete": 8}
    assert info.result_json() == {"sum": 28, "failed": []}
    first, second = recorder.pages
    assert [item.id for item in second.items] == [f"i{n:02}" for n in range(8)]
    assert not any(item.failed for item in second.items)
    assert second.idempotency_key != first.idempotency_key


@pytest.mark.parametrize(("answer", "problem"), [
    (Reduced(items={"nope": Result(done=True)}), "names item 'nope'"),
    (Reduced(items={"i00": Result()}), "leaves the item at the reduce gate 1"),
    (Reduced(default=Result(gate=0, done=True)), "below the reduce gate 1"),
])
async def test_malformed_reduce_answer_writes_nothing_and_says_why(
        make_store: Callable[..., Any], client: AsyncClient, answer: Reduced,
        problem: str) -> None:
    app = handlers.app(to_gate_one, reduce=lambda page: answer)
    await client.create_partition("p", numbered(3), reduce_gates=[1])
    async with engine(make_store, app, max_retries=1):
        info = await client.wait("p", timeout=WAIT)
    assert info.status == "failed" and info.result is None
    assert problem in (info.last_error or ""), info.last_error
    assert "malformed reduce answer" in (info.last_error or "")
    items = await client.items("p")
    assert {(item.status, item.gate) for item in items} == {("available", 1)}


async def test_raw_reduce_handler_answer_types_are_checked(
        make_store: Callable[..., Any], client: AsyncClient) -> None:
    bodies = [b'{"items": [1, 2]}', b'{"result": 1, "result_b64": "AA=="}', b"[]",
              b'{"items": {"i00": {"done": "yes"}}}', b"[" * 100_000]
    sent: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] == "/reduce":
            sent.append(json.loads(body))
            reply = bodies[min(len(sent), len(bodies)) - 1]
        else:
            reply = b'{"gate": 1}'
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": reply})

    await client.create_partition("p", numbered(2), reduce_gates=[1])
    async with engine(make_store, app, max_retries=len(bodies) - 1):
        info = await client.wait("p", timeout=WAIT)
    assert info.status == "failed"
    assert "nested too deeply" in (info.last_error or "")
    assert len(sent) == len(bodies)
    assert sent[0]["pass"] == "all" and [e["item_id"] for e in sent[0]["items"]] == [
        "i00", "i01"]
    assert {(item.status, item.gate) for item in await client.items("p")} == {
        ("available", 1)}


async def test_continue_policy_reduces_the_settled_items_and_shows_the_failed_ones(
        make_store: Callable[..., Any], client: AsyncClient) -> None:
    def gate_zero(item: Item) -> Result:
        if item.json() in (2, 5):
            raise handlers.Fail(f"resume {item.id} is unreadable")
        return to_gate_one(item)

    def count(page: ReducePage) -> Reduced:
        failed = {item.id: item.last_error for item in page.items if item.failed}
        return Reduced(result={"ranked": sum(not item.failed for item in page.items),
                               "failed": failed})

    app = handlers.app(gate_zero, reduce=count)
    await client.create_partition("p", numbered(8), reduce_gates=[1],
                                  on_item_failure="continue")
    async with engine(make_store, app):
        info = await client.wait("p", timeout=WAIT)
    assert info.status == "complete"
    assert info.counts == {"complete": 6, "failed": 2}
    result = info.result_json()
    assert result["ranked"] == 6
    assert set(result["failed"]) == {"i02", "i05"}
    assert "i02 is unreadable" in result["failed"]["i02"]


async def test_default_policy_still_fails_the_partition_before_the_reduce(
        make_store: Callable[..., Any], client: AsyncClient) -> None:
    recorder = Recorder(lambda page: Reduced())

    def gate_zero(item: Item) -> Result:
        if item.json() == 1:
            raise handlers.Fail("unreadable")
        return to_gate_one(item)

    await client.create_partition("p", numbered(3), reduce_gates=[1])
    async with engine(make_store, handlers.app(gate_zero, reduce=recorder)):
        info = await client.wait("p", timeout=WAIT)
    assert info.status == "failed" and info.gate == 0
    assert recorder.pages == []


async def test_partition_settings_are_validated_and_nothing_is_written(
        client: AsyncClient) -> None:
    for gates, fragment in (([-1], "reduce gate"), (["1"], "reduce gate"), ([True], "reduce gate"),
                            (5, "list"), ([1, 1], "twice")):
        with pytest.raises(InvalidInputError, match=fragment):
            await client.create_partition("bad", numbered(1), reduce_gates=gates)
    with pytest.raises(InvalidInputError, match="on_item_failure"):
        await client.create_partition("bad", numbered(1), on_item_failure="ignore")
    assert await client.partitions() == []


async def test_items_cannot_be_added_at_a_reduce_gate_the_partition_reached(
        client: AsyncClient) -> None:
    await client.create_partition("p", [NewItem("a", b"1", gate=1)], reduce_gates=[1])
    with pytest.raises(GateError, match="reduce gate"):
        await client.add_items("p", [NewItem("b", b"2", gate=1)])
    assert await client.add_items("p", [NewItem("c", b"3", gate=2)]) is False
    assert [item.id for item in await client.items("p")] == ["a", "c"]


# --------------------------------------------------------------------------- library mode


async def library_step(item: WorkItem) -> EngineResult:
    return EngineResult(gate=1, data=json.dumps({"n": json.loads(item.data)}).encode())


async def test_library_mode_takes_a_reduce_function_beside_process(
        make_store: Callable[..., Any], client: AsyncClient) -> None:
    calls: list[ReduceCall] = []

    async def reduce(call: ReduceCall) -> ReduceResult:
        calls.append(call)
        if call.pass_ == "fold":
            previous = json.loads(call.accumulator) if call.accumulator else 0
            total = previous + sum(json.loads(item.data)["n"] for item in call.items)
            return ReduceResult(accumulator=json.dumps(total).encode(),
                                result=json.dumps({"total": total}).encode() if call.last
                                else None)
        return ReduceResult(default=EngineResult(done=True, data=call.accumulator))

    watcher = Watcher(make_store(), library_step,
                      WatcherConfig(owner_id="lib", reduce_page_items=5, **FAST), reduce=reduce)
    await client.create_partition("p", numbered(12), reduce_gates=[1])
    async with running(watcher):
        info = await client.wait("p", timeout=WAIT)
    assert info.status == "complete" and info.result_json() == {"total": sum(range(12))}
    assert [(c.pass_, c.page, len(c.items)) for c in calls] == [
        ("fold", 0, 5), ("fold", 1, 5), ("fold", 2, 2),
        ("apply", 0, 5), ("apply", 1, 5), ("apply", 2, 2)]
    assert {item.data for item in await client.items("p")} == {str(sum(range(12))).encode()}


async def test_a_watcher_without_a_reducer_fails_the_partition_and_says_why(
        make_store: Callable[..., Any], client: AsyncClient) -> None:
    watcher = Watcher(make_store(), library_step, WatcherConfig(owner_id="lib", **FAST))
    await client.create_partition("p", numbered(2), reduce_gates=[1])
    async with running(watcher):
        info = await client.wait("p", timeout=WAIT)
    assert info.status == "failed" and info.gate == 1
    assert "has no reducer" in (info.last_error or "")


async def test_reduce_gates_after_the_first_and_a_chain_of_reduces(
        make_store: Callable[..., Any], client: AsyncClient) -> None:
    """Gate 0 items, a reduce at gate 1 that sends some on to gate 2, then a reduce at 2."""
    seen: list[tuple[int, list[str]]] = []

    async def reduce(call: ReduceCall) -> ReduceResult:
        seen.append((call.gate, [item.id for item in call.items]))
        if call.gate == 1:
            return ReduceResult(items={"i00": EngineResult(gate=2), "i01": EngineResult(gate=2)},
                                result=b'"first"')
        return ReduceResult(result=json.dumps([i.id for i in call.items]).encode())

    watcher = Watcher(make_store(), library_step, WatcherConfig(owner_id="lib", **FAST),
                      reduce=reduce)
    await client.create_partition("p", numbered(4), reduce_gates=[1, 2])
    async with running(watcher):
        info = await client.wait("p", timeout=WAIT)
    assert info.status == "complete" and info.counts == {"complete": 4}
    assert seen == [(1, ["i00", "i01", "i02", "i03"]), (2, ["i00", "i01"])]
    assert info.result_json() == ["i00", "i01"]


async def test_a_reduce_call_in_flight_is_abandoned_when_the_partition_is_cancelled(
        make_store: Callable[..., Any], client: AsyncClient) -> None:
    started, abandoned = asyncio.Event(), asyncio.Event()

    async def stuck(call: ReduceCall) -> ReduceResult:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            abandoned.set()
            raise
        return ReduceResult()

    watcher = Watcher(make_store(), library_step, WatcherConfig(owner_id="lib", **FAST),
                      reduce=stuck)
    await client.create_partition("p", numbered(3), reduce_gates=[1])
    async with running(watcher):
        await asyncio.wait_for(started.wait(), WAIT)
        assert await client.cancel("p") is True
        await asyncio.wait_for(abandoned.wait(), 10)
        await wait_until(lambda: not watcher.supervisors, message="the supervisor gone")
    info = await client.partition("p")
    assert info.status == "cancelled" and info.result is None
    assert {(item.status, item.gate) for item in await client.items("p")} == {("available", 1)}


async def test_a_reduce_answer_whose_spawn_cannot_be_written_fails_at_once(
        make_store: Callable[..., Any], client: AsyncClient) -> None:
    """As an item's bad spawn does: asking again cannot help, so one call, then failed."""
    calls: list[int] = []

    async def reduce(call: ReduceCall) -> ReduceResult:
        calls.append(call.attempt)
        return ReduceResult(spawn=[NewItem("below", b"", gate=0)])  # below the floor

    watcher = Watcher(make_store(), library_step,
                      WatcherConfig(owner_id="lib", max_retries=5, **FAST), reduce=reduce)
    await client.create_partition("p", numbered(2), reduce_gates=[1])
    async with running(watcher):
        info = await client.wait("p", timeout=WAIT)
    assert info.status == "failed" and calls == [1]
    assert "spawn cannot be written, and it is not retried" in (info.last_error or "")
