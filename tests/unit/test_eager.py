"""Eager first steps: a call that never waits needs no task; one that waits finishes in one."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from watcher.eager import first_step, rest

marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="caller")


async def _instant(value: int) -> int:
    return value * 2


async def _waits(value: int, gate: asyncio.Event) -> int:
    marker.set("call")
    await gate.wait()
    return value + marker.get().__len__()


async def _fails_after_waiting(gate: asyncio.Event) -> int:
    await gate.wait()
    raise ValueError("bad item")


async def test_a_call_that_never_waits_finishes_in_the_first_step() -> None:
    assert first_step(_instant(21), contextvars.copy_context()) == (True, 42)


async def test_an_error_in_the_first_step_reaches_the_caller() -> None:
    async def broken() -> int:
        raise KeyError("x")

    with pytest.raises(KeyError):
        first_step(broken(), contextvars.copy_context())


async def test_a_waiting_call_finishes_in_a_task_in_its_own_context() -> None:
    gate = asyncio.Event()
    context = contextvars.copy_context()
    call = _waits(1, gate)
    finished, awaited = first_step(call, context)
    assert not finished
    assert marker.get() == "caller", "the call's context changes stay out of the caller's"
    task = asyncio.create_task(_await(rest(call, awaited)), context=context)
    await asyncio.sleep(0)
    assert not task.done()
    gate.set()
    assert await asyncio.wait_for(task, 5) == 1 + len("call")


async def test_an_error_after_waiting_propagates() -> None:
    gate = asyncio.Event()
    call = _fails_after_waiting(gate)
    _, awaited = first_step(call, contextvars.copy_context())
    task = asyncio.create_task(_await(rest(call, awaited)))
    gate.set()
    with pytest.raises(ValueError, match="bad item"):
        await asyncio.wait_for(task, 5)


async def test_cancelling_the_task_cancels_the_call_where_it_waits() -> None:
    seen: list[str] = []
    gate = asyncio.Event()

    async def cleans_up() -> int:
        try:
            await gate.wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return 0

    call = cleans_up()
    _, awaited = first_step(call, contextvars.copy_context())
    task = asyncio.create_task(_await(rest(call, awaited)))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled"]


async def test_a_call_may_catch_the_cancellation_and_answer() -> None:
    gate = asyncio.Event()

    async def shrugs() -> str:
        try:
            await gate.wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0)
            return "answered anyway"
        return "normal"

    call = shrugs()
    _, awaited = first_step(call, contextvars.copy_context())
    task = asyncio.create_task(_await(rest(call, awaited)))
    await asyncio.sleep(0)
    task.cancel()
    assert await asyncio.wait_for(task, 5) == "answered anyway"


async def _await(awaitable):
    return await awaitable
