"""PostgreSQL's plans for the two hottest statements, on a freshly filled table.

A table filled moments ago has no statistics yet (autovacuum has not analysed
it), which is exactly when a new deployment or a large new partition drains.
Without statistics the planner guesses, and a guess that picks the wrong index
makes each result write visit every available item of its partition, so the
drain slows down as the partition grows. These tests read the plans
(``EXPLAIN``, nothing executed) of the statements the PostgreSQL driver really
sends.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from watcher.drivers.sql import batch_params
from watcher.records import ItemWrite, NewItem

pytestmark = pytest.mark.postgres

ITEMS = 3000


@pytest.fixture(params=["postgres"])
def db_url(request: pytest.FixtureRequest) -> str:
    from tests.conftest import POSTGRES_URL, require_postgres

    require_postgres()
    return POSTGRES_URL


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


async def _plan(store, statement, params: dict[str, Any] | None = None
                ) -> list[dict[str, Any]]:
    compiled = statement.compile(dialect=store.engine.dialect)
    async with store.engine.connect() as conn:
        raw = (await conn.exec_driver_sql(
            f"EXPLAIN (FORMAT JSON) {compiled}", {**compiled.params, **(params or {})})
        ).scalar_one()
    document = raw if isinstance(raw, list) else json.loads(raw)
    return list(_nodes(document[0]["Plan"]))


async def _filled(store) -> list:
    await store.partition_create("big", [NewItem(f"i{n:05}", b"x") for n in range(ITEMS)])
    await store.leases_take(await store.leases_read_free(5), "me", 30.0)
    return await store.items_ready("big", 0, 128)


async def test_ready_read_walks_the_index_in_order_and_stops_at_its_limit(store) -> None:
    in_flight = [f"i{n:05}" for n in range(100)]
    await _filled(store)
    nodes = await _plan(store, store.driver.ready_statement(excluding=True, limit=128),
                        store.driver.ready_params("big", 0, 128, in_flight))
    kinds = [node["Node Type"] for node in nodes]
    assert "Sort" not in kinds and "Incremental Sort" not in kinds, kinds
    scans = [node for node in nodes if node.get("Relation Name") == store.tables.items.name]
    assert [scan.get("Index Name") for scan in scans] == [
        f"{store.tables.prefix}ix_items_ready"], scans


async def test_result_write_finds_each_item_by_its_primary_key(store) -> None:
    ready = await _filled(store)
    writes = [ItemWrite("big", item.id, item.version, "complete", 0, attempts=0)
              for item in ready]
    nodes = await _plan(store, store.driver.batch_statement,
                        batch_params(writes, "me"))
    scans = [node for node in nodes if node.get("Relation Name") == store.tables.items.name
             and node["Node Type"] != "ModifyTable"]
    assert scans and all(scan.get("Index Name") == f"{store.tables.items.name}_pkey"
                         for scan in scans), scans
