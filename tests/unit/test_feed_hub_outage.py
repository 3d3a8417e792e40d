"""The live feed's poller through a database outage: one WARNING when its polls start
failing, one INFO when they succeed again, never a line per failed poll; the followers
keep their watch throughout. A stand-in source, no database."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from processor.feed.hub import FeedHub, FeedSettings
from tests.support.engine import wait_until
from watcher.errors import DatabaseError
from watcher.models import AVAILABLE
from watcher.records import PartitionState


class FlakyStore:
    """One open partition ``p``; its reads fail while ``failing`` is set."""

    def __init__(self) -> None:
        self.failing = False
        self.reads = 0

    async def partition_states(self, ids: list[str]) -> dict[str, PartitionState]:
        self.reads += 1
        if self.failing:
            raise OperationalError("SELECT", {}, Exception("connection refused"))
        return {"p": PartitionState("p", 1, 0, AVAILABLE, "", False)} if "p" in ids else {}

    async def items_gate_counts(self, ids: list[str]) -> dict[int, Any]:
        return {}


class FlakySource:
    def __init__(self) -> None:
        self.store = FlakyStore()

    def database_error(self, error: SQLAlchemyError) -> DatabaseError:
        return DatabaseError("the database failed")


async def reads_beyond(store: FlakyStore, count: int) -> None:
    target = store.reads + count
    await wait_until(lambda: store.reads >= target, message=f"{count} more polls")


async def test_a_poll_outage_is_logged_once_when_it_starts_and_once_when_it_ends(
        caplog: pytest.LogCaptureFixture) -> None:
    source = FlakySource()
    hub = FeedHub(FeedSettings(poll_interval=0.01))
    caplog.set_level(logging.INFO, logger="processor.feed.hub")
    await hub.subscribe(source, "p", None)  # type: ignore[arg-type]
    try:
        source.store.failing = True
        await reads_beyond(source.store, 5)
        source.store.failing = False
        await reads_beyond(source.store, 3)
    finally:
        await hub.close()
    lines = [(record.levelno, record.getMessage().split(" ")[0]) for record in caplog.records]
    assert lines == [(logging.WARNING, "action=feed_poll_failed"),
                     (logging.INFO, "action=feed_poll_recovered")]
    assert "p" in hub.watches
