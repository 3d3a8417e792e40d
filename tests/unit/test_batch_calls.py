"""Calling a processor for a dispatched batch: a task per call, groups of finished calls,
cancellation, contexts, timeouts, and process_batch answers checked."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from watcher.dispatch.batch_calls import BatchAnswerError, call_batch, call_each, call_items
from watcher.flow.slots import SlotPool
from watcher.protocol import Result, WorkItem

TRACE: contextvars.ContextVar[str] = contextvars.ContextVar("trace", default="")


def _works(count: int) -> list[WorkItem]:
    return [WorkItem("p", f"i{n}", 0, 1, b"", 1, f"k{n}") for n in range(count)]


class Groups:
    """Records what call_each hands on, in the order handed."""

    def __init__(self) -> None:
        self.groups: list[list[tuple[int, object]]] = []
        self.handed = asyncio.Event()

    def __call__(self, positions: list[int], outcomes: list[object]) -> None:
        self.groups.append(sorted(zip(positions, outcomes, strict=True), key=lambda p: p[0]))
        self.handed.set()


async def test_calls_that_never_wait_go_on_as_one_group() -> None:
    async def quick(item: WorkItem) -> Result:
        return Result(done=True, data=item.id.encode())

    groups = Groups()
    await call_each(quick, _works(5), groups)
    assert groups.groups == [[(n, Result(done=True, data=f"i{n}".encode())) for n in range(5)]]


async def test_a_call_sees_one_task_from_start_to_end_and_not_the_batch_s() -> None:
    batch_task = asyncio.current_task()
    seen: dict[str, tuple[object, object]] = {}

    async def watches(item: WorkItem) -> Result:
        first = asyncio.current_task()
        await asyncio.sleep(0)
        seen[item.id] = (first, asyncio.current_task())
        return Result()

    await call_each(watches, _works(3), Groups())
    assert len(seen) == 3
    for first, later in seen.values():
        assert first is later and first is not batch_task


async def test_a_timeout_inside_a_call_ends_that_call_only() -> None:
    async def bounded(item: WorkItem) -> Result:
        async with asyncio.timeout(0.01 if item.id == "i0" else 5):
            await asyncio.sleep(0.2 if item.id == "i0" else 0.03)
        return Result(data=item.id.encode())

    groups = Groups()
    await call_each(bounded, _works(3), groups, group_wait=1.0)
    outcomes = dict(pair for group in groups.groups for pair in group)
    assert isinstance(outcomes[0], TimeoutError)
    assert outcomes[1] == Result(data=b"i1") and outcomes[2] == Result(data=b"i2")


async def test_an_anyio_cancel_scope_inside_a_call_is_left_in_the_task_that_entered_it() -> None:
    anyio = pytest.importorskip("anyio")

    async def scoped(item: WorkItem) -> Result:
        with anyio.fail_after(5):
            await asyncio.sleep(0.01)
        return Result(data=item.id.encode())

    groups = Groups()
    await call_each(scoped, _works(4), groups, group_wait=1.0)
    outcomes = dict(pair for group in groups.groups for pair in group)
    assert outcomes == {n: Result(data=f"i{n}".encode()) for n in range(4)}


async def test_calls_that_wait_go_on_in_tasks_and_see_their_futures_outcomes() -> None:
    async def waits(item: WorkItem) -> Result:
        await asyncio.sleep(0)  # a bare turn of the loop
        future = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(future.set_result, item.id)
        got = await future
        if item.id == "i2":
            failing = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(failing.set_exception, KeyError("gone"))
            try:
                await failing
            except KeyError:
                return Result(data=b"caught")
        return Result(data=got.encode())

    groups = Groups()
    await call_each(waits, _works(3), groups)
    assert groups.groups == [[(0, Result(data=b"i0")), (1, Result(data=b"i1")),
                              (2, Result(data=b"caught"))]]


async def test_exceptions_are_outcomes_whether_raised_at_once_or_after_a_wait() -> None:
    async def fails(item: WorkItem) -> Result:
        if item.id == "i1":
            await asyncio.sleep(0.001)
        raise ValueError(item.id)

    groups = Groups()
    await call_each(fails, _works(2), groups)
    outcomes = [outcome for group in groups.groups for _, outcome in group]
    assert [type(o) for o in outcomes] == [ValueError, ValueError]
    assert sorted(str(o) for o in outcomes) == ["i0", "i1"]


async def test_a_slow_call_does_not_hold_back_the_quick_ones_beyond_the_group_wait() -> None:
    release = asyncio.Event()

    async def uneven(item: WorkItem) -> Result:
        if item.id == "i0":
            await release.wait()
        else:
            await asyncio.sleep(0)
        return Result(done=True)

    groups = Groups()
    running = asyncio.create_task(call_each(uneven, _works(4), groups, group_wait=0.01))
    async with asyncio.timeout(5):
        await groups.handed.wait()
    assert [position for position, _ in groups.groups[0]] == [1, 2, 3]
    release.set()
    await running
    assert [[position for position, _ in group] for group in groups.groups] == [[1, 2, 3], [0]]


async def test_cancelling_the_batch_cancels_the_calls_still_running_and_hands_on_nothing() -> None:
    cancelled: list[str] = []

    async def hangs(item: WorkItem) -> Result:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(item.id)
            raise
        return Result()

    groups = Groups()
    running = asyncio.create_task(call_each(hangs, _works(3), groups))
    await asyncio.sleep(0.01)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert sorted(cancelled) == ["i0", "i1", "i2"], "each call saw its cancellation"
    assert groups.groups == []


async def test_each_call_runs_in_a_context_of_its_own() -> None:
    async def traced(item: WorkItem) -> Result:
        assert TRACE.get() == ""
        TRACE.set(item.id)
        await asyncio.sleep(0)
        return Result(data=TRACE.get().encode())

    groups = Groups()
    await call_each(traced, _works(3), groups)
    assert [outcome for _, outcome in groups.groups[0]] == [
        Result(data=b"i0"), Result(data=b"i1"), Result(data=b"i2")]
    assert TRACE.get() == "", "nothing leaked into the caller's context"


async def test_a_call_that_cancels_itself_is_an_outcome_not_the_batch_s_end() -> None:
    async def gives_up(item: WorkItem) -> Result:
        if item.id == "i0":
            raise asyncio.CancelledError
        return Result(done=True)

    groups = Groups()
    await call_each(gives_up, _works(2), groups)
    outcomes = dict(groups.groups[0])
    assert isinstance(outcomes[0], asyncio.CancelledError) and outcomes[1] == Result(done=True)


async def test_process_batch_answers_one_outcome_per_item_in_order() -> None:
    async def batch(items: list[WorkItem]) -> list[Result | Exception]:
        return [Result(done=True) if n % 2 else ValueError(item.id)
                for n, item in enumerate(items)]

    outcomes = await call_batch(batch, _works(3))
    assert isinstance(outcomes[0], ValueError) and outcomes[1] == Result(done=True)
    assert isinstance(outcomes[2], ValueError)


@pytest.mark.parametrize("answer", [[Result()], None, "nope"])
async def test_a_process_batch_answer_of_the_wrong_shape_fails_every_item(answer) -> None:
    async def batch(items: list[WorkItem]) -> object:
        return answer

    outcomes = await call_batch(batch, _works(3))  # type: ignore[arg-type]
    assert len(outcomes) == 3 and all(isinstance(o, BatchAnswerError) for o in outcomes)
    assert "3 items" in str(outcomes[0]) and "one Result or exception per item" in str(
        outcomes[0])


async def test_a_process_batch_that_raises_gives_every_item_the_error() -> None:
    async def batch(items: list[WorkItem]) -> list[Result]:
        raise RuntimeError("down")

    outcomes = await call_batch(batch, _works(2))
    assert [str(o) for o in outcomes] == ["down", "down"]


async def test_an_entry_that_is_neither_result_nor_exception_fails_its_item() -> None:
    async def batch(items: list[WorkItem]) -> list[object]:
        return [Result(done=True), {"done": True}]

    outcomes = await call_batch(batch, _works(2))  # type: ignore[arg-type]
    assert outcomes[0] == Result(done=True) and isinstance(outcomes[1], TypeError)


# -- calls in flight (statefeed_in_flight) ------------------------------------------

async def test_calls_in_flight_are_counted_per_item_as_each_call_ends() -> None:
    """Per item: every call counts from its start to its end, one by one; a call that
    ends before the others leaves the count at once (within its group's wait)."""
    reported: list[int] = []
    pool = SlotPool(8, on_calls=reported.append)
    gates = {f"i{n}": asyncio.Event() for n in range(3)}

    async def held(item: WorkItem) -> Result:
        await gates[item.id].wait()
        return Result(done=True)

    groups = Groups()
    batch = asyncio.create_task(call_items(held, None, _works(3), pool, groups))
    await asyncio.sleep(0)
    assert pool.calls == 3 and reported == [3]
    gates["i1"].set()
    await asyncio.wait_for(groups.handed.wait(), 5)
    assert pool.calls == 2 and reported[-1] == 2
    gates["i0"].set()
    gates["i2"].set()
    await asyncio.wait_for(batch, 5)
    assert pool.calls == 0 and reported[-1] == 0


async def test_calls_in_flight_are_counted_per_item_of_a_batch_call() -> None:
    """A batch request counts each of its items until the request ends, however it ends."""
    pool = SlotPool(8)
    release = asyncio.Event()
    during: list[int] = []

    async def batch(items: list[WorkItem]) -> list[Result]:
        during.append(pool.calls)
        await release.wait()
        return [Result(done=True)] * len(items)

    groups = Groups()
    task = asyncio.create_task(call_items(batch, batch, _works(4), pool, groups))
    await asyncio.sleep(0.01)
    release.set()
    await asyncio.wait_for(task, 5)
    assert during == [4] and pool.calls == 0
    assert [position for position, _ in groups.groups[0]] == [0, 1, 2, 3]

    async def raises(items: list[WorkItem]) -> list[Result]:
        raise RuntimeError("handler down")

    await call_items(batch, raises, _works(2), pool, Groups())
    assert pool.calls == 0


@pytest.mark.parametrize("batched", [False, True])
async def test_cancelled_calls_leave_the_count(batched: bool) -> None:
    pool = SlotPool(8)
    started = asyncio.Event()

    async def forever(item: WorkItem) -> Result:
        started.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def forever_batch(items: list[WorkItem]) -> list[Result]:
        started.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    task = asyncio.create_task(call_items(forever, forever_batch if batched else None,
                                          _works(3), pool, Groups()))
    await asyncio.wait_for(started.wait(), 5)
    assert pool.calls == 3
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pool.calls == 0
