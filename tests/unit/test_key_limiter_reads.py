"""A key's pool lets nothing by until its limit has been read.

A partition of a new key may be leased while the limiter reads the limits of the
keys it knew: the new key's pool must wait for the next pass rather than be taken
as unlimited (that let a key limited to 4 run 20 calls at once at a cold start).
"""

from __future__ import annotations

import asyncio

from watcher.config import WatcherConfig
from watcher.flow.key_limiter import KeyLimiter
from watcher.hooks import Hooks
from watcher.rules.grants import GrantDecision, decide_grant


class LimitsStore:
    """The store calls of the key limiter: limits set per key, grants decided alone;
    the first read of the limits waits on ``release``."""

    def __init__(self, limits: dict[str, int]) -> None:
        self.limits = limits
        self.reads: list[list[str]] = []
        self.reading = asyncio.Event()
        self.release = asyncio.Event()

    async def key_limits(self, keys: list[str]) -> dict[str, int]:
        self.reads.append(list(keys))
        if len(self.reads) == 1:
            self.reading.set()
            await self.release.wait()
        return {key: self.limits[key] for key in keys if key in self.limits}

    async def flow_grant(self, key: str, owner: str, *, limit: int, wanted: int,
                         in_use: int, duration: float) -> GrantDecision:
        return decide_grant(limit, wanted, in_use, [])


async def test_a_pool_made_during_a_read_of_the_limits_waits_for_its_own() -> None:
    store = LimitsStore({"a": 4, "b": 4})
    limiter = KeyLimiter(store, WatcherConfig(owner_id="w1"), Hooks(),  # type: ignore[arg-type]
                         clock=lambda: 0.0)
    first = limiter.pool("b")
    reading = asyncio.create_task(limiter.refresh({"b"}))
    await asyncio.wait_for(store.reading.wait(), timeout=10)
    late = limiter.pool("a")  # a partition of key a was leased during the read
    store.release.set()
    await asyncio.wait_for(reading, timeout=10)
    assert store.reads == [["b"]]
    assert first.known and first.limit == 4
    assert not late.known and late.free(0.0) == 0, "a's limit was never read"
    assert late.take(16, 0.0) == 0

    await limiter.refresh({"a", "b"})
    assert store.reads[-1] == ["b", "a"]
    assert late.known and late.limit == 4
    assert late.take(16, 0.0) == 4  # its limit, not the processor's slots
