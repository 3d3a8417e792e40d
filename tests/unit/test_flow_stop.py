"""Stopping the flow-control loops between two rounds of database work, not inside one.

A query cancelled mid-way makes SQLAlchemy invalidate its connection; with aiosqlite
that close could outlive the connection's thread and hang the process at exit. The
stand-in store holds its read of the handler's hold open until the test lets it go.
"""

from __future__ import annotations

import asyncio

from tests.support.engine import wait_until
from watcher.config import WatcherConfig
from watcher.flow.limits import FlowControl
from watcher.hooks import Hooks


class HeldRead:
    """The flow store calls a processor with no keys makes; the hold read waits on
    ``release`` and records whether it ran to its end or was cancelled."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.reading = asyncio.Event()
        self.outcomes: list[str] = []

    async def flow_blocked_for(self, scope: object, name: str) -> float:
        self.reading.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.outcomes.append("cancelled")
            raise
        self.outcomes.append("finished")
        return 0.0


def flow_control(store: HeldRead, shutdown_timeout: float) -> FlowControl:
    config = WatcherConfig(owner_id="w1", poll_interval=0.01,
                           shutdown_timeout=shutdown_timeout)
    return FlowControl(store, config, Hooks())  # type: ignore[arg-type]


async def test_a_stop_waits_for_the_round_under_way_then_cancels_between_rounds() -> None:
    store = HeldRead()
    flow = flow_control(store, shutdown_timeout=30.0)
    running = asyncio.create_task(flow.run(lambda: []))
    await asyncio.wait_for(store.reading.wait(), timeout=10)
    stopping = asyncio.create_task(flow.stop(running))
    await asyncio.sleep(0.05)  # a stop that cut the read short would be done by now
    assert not stopping.done() and store.outcomes == []
    store.release.set()
    await asyncio.wait_for(stopping, timeout=10)
    assert store.outcomes == ["finished"], "the read ran to its end"
    assert running.cancelled(), "then the loop was cancelled, between rounds"


async def test_a_round_that_outlasts_the_shutdown_timeout_is_cancelled() -> None:
    store = HeldRead()
    flow = flow_control(store, shutdown_timeout=0.1)
    running = asyncio.create_task(flow.run(lambda: []))
    await asyncio.wait_for(store.reading.wait(), timeout=10)
    await asyncio.wait_for(flow.stop(running), timeout=10)
    assert store.outcomes == ["cancelled"] and running.done()


async def test_a_stop_between_rounds_cancels_at_once() -> None:
    store = HeldRead()
    store.release.set()  # every read returns at once
    flow = flow_control(store, shutdown_timeout=30.0)
    running = asyncio.create_task(flow.run(lambda: []))
    await wait_until(lambda: store.outcomes, timeout=10, message="a first round")
    # At once, not after the shutdown timeout: within a quarter of it.
    await asyncio.wait_for(flow.stop(running), timeout=30.0 / 4)
    assert running.cancelled()
    assert "cancelled" not in store.outcomes
