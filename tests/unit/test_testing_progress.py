"""The test kit's judgement of a partition between polls (processor.testing.progress):
when it is idle, and how far the clock may skip, as a table of cases."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from processor.testing.progress import Snapshot, idle
from watcher.records import ItemInfo, PartitionInfo

NOW = datetime(2030, 1, 1)
LATER = NOW + timedelta(seconds=30)
WEEK = NOW + timedelta(days=7)


def item(item_id: str, status: str, retry_at: datetime | None = NOW, gate: int = 0
         ) -> ItemInfo:
    return ItemInfo("p", item_id, status, gate, b"", 0, None, 1, retry_at=retry_at)


def snapshot(*items: ItemInfo, status: str = "available", owner: str = "",
             until: datetime = NOW) -> Snapshot:
    return Snapshot(PartitionInfo("p", status, 0, owner, until, 1), items)


@pytest.mark.parametrize(("case", "state", "expected"), [
    ("an item due", snapshot(item("a", "available")), None),
    ("a gate to step", snapshot(item("a", "complete")), None),
    ("ended", snapshot(item("a", "waiting", WEEK), status="failed"), None),
    ("a deadline passed", snapshot(item("a", "waiting", NOW)), None),
    ("parked", snapshot(item("a", "waiting", WEEK)), (None, False)),
    ("a backoff", snapshot(item("a", "available", LATER)), (LATER, True)),
    ("a backoff before a deadline", snapshot(item("a", "available", LATER),
                                             item("b", "waiting", WEEK)), (LATER, True)),
    ("a deadline before a delay", snapshot(item("a", "available", WEEK),
                                           item("b", "waiting", LATER)), (WEEK, False)),
    ("a delayed item beside a due one", snapshot(item("a", "available", LATER),
                                                 item("b", "available")), None),
    ("an item at a later gate is not the gate's", snapshot(
        item("a", "waiting", WEEK), item("b", "available", gate=1)), (None, False)),
    ("not started yet", snapshot(item("a", "available"), until=LATER), (LATER, True)),
    ("leased, not a start", snapshot(item("a", "available"), owner="w", until=LATER), None),
])
def test_idle(case: str, state: Snapshot, expected: tuple[datetime | None, bool] | None
              ) -> None:
    found = idle(state, NOW)
    assert (None if found is None else (found.next_due, found.skippable)) == expected, case
