"""What is special to PostgreSQL, on the live test server.

- The direct path: its failures look like the engine's, and it heals.
- The plans of the two hottest statements on a freshly filled table: a table
  filled moments ago has no statistics yet (autovacuum has not analysed it),
  which is exactly when a new deployment or a large new partition drains.
  Without statistics the planner guesses, and a guess that picks the wrong
  index makes each result write visit every available item of its partition.
  These read the plans (``EXPLAIN``, nothing executed) of the statements the
  driver really sends.
- The hot path's writes to a partition row are HOT updates: a write that
  changes no indexed column of ``partitions`` adds no index entries, and
  PostgreSQL prunes its old row version within the page. ``add_items`` on an
  open partition and a gate advance are such writes; these read PostgreSQL's
  own counters of the table's updates.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Integer, bindparam, cast, event, func, select, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DataError, OperationalError

from tests.conftest import POSTGRES_URL, require_postgres
from tests.support.engine import spawning_partition, wait_until
from watcher.records import ItemWrite, NewItem
from watcher.store import Store
from watcher.store.db.urls import parse_database_url
from watcher.store.drivers.postgresql.direct import DirectStatements
from watcher.store.drivers.sql import batch_params
from watcher.store.operator.rewind import spawned_reads

pytestmark = pytest.mark.postgres

SELECT_ONE = select(cast(bindparam("value"), Integer))


def _direct(url: str, **options) -> DirectStatements:
    return DirectStatements(parse_database_url(url).async_url, postgresql.dialect(), **options)


async def test_an_unreachable_server_fails_as_an_operational_error_without_the_password(
        ) -> None:
    url = make_url("postgresql://statefeed:hunter2-secret@127.0.0.1:9/test")
    timeout = 2.0
    direct = DirectStatements(url, postgresql.dialect(), timeout=timeout)
    started = time.monotonic()
    try:
        with pytest.raises(OperationalError) as caught:
            await direct.fetch(SELECT_ONE, {"value": "1"})
    finally:
        await direct.close()
    # It gives up (a refused connection at once, a silent one at the timeout) instead of
    # retrying on: a bound derived from the timeout, with a loaded machine's margin.
    assert time.monotonic() - started < timeout * 4
    assert "hunter2" not in str(caught.value)


async def test_a_refused_value_is_a_data_error_with_its_parameters_hidden() -> None:
    require_postgres()
    direct = _direct(POSTGRES_URL)
    try:
        with pytest.raises(DataError) as caught:
            await direct.fetch(SELECT_ONE, {"value": "not-a-number-secret"})
        assert "not-a-number-secret" not in str(caught.value).split("[SQL")[1]
        assert await direct.fetch(SELECT_ONE, {"value": "7"}) == [(7,)]
    finally:
        await direct.close()


async def test_dead_pooled_connections_are_replaced_without_failing_the_statement() -> None:
    require_postgres()
    direct = _direct(POSTGRES_URL, max_connections=2)
    seen: list[str] = []
    direct.listeners.append(seen.append)
    backend = select(func.pg_backend_pid(), func.pg_sleep(0.05))
    try:
        first = await asyncio.gather(direct.fetch(backend, {}), direct.fetch(backend, {}))
        pids = {rows[0][0] for rows in first}
        assert len(pids) == 2, "two connections pooled"
        killer = _direct(POSTGRES_URL)
        try:
            for pid in pids:  # as a server restart would
                await killer.fetch(
                    select(func.pg_terminate_backend(bindparam("pid", type_=Integer))),
                    {"pid": pid})
        finally:
            await killer.close()
        ((after, _),) = await direct.fetch(backend, {})
    finally:
        await direct.close()
    assert after not in pids
    assert len(seen) == 3, "each statement counted once, however often it was sent"


async def test_a_statement_error_keeps_the_connection() -> None:
    require_postgres()
    direct = _direct(POSTGRES_URL, max_connections=1)
    backend = select(func.pg_backend_pid())
    try:
        ((before,),) = await direct.fetch(backend, {})
        with pytest.raises(DataError):
            await direct.fetch(SELECT_ONE, {"value": "x"})
        ((after,),) = await direct.fetch(backend, {})
    finally:
        await direct.close()
    assert after == before


async def test_plain_writes_return_no_rows() -> None:
    require_postgres()
    direct = _direct(POSTGRES_URL)
    try:
        assert await direct.fetch(text("SET application_name = 'statefeed-test'"), {}) == []
    finally:
        await direct.close()



ITEMS = 3000
TIED = 5000  # partitions at one place in the lease queue


@pytest.fixture(params=["postgres"])
def db_url(request: pytest.FixtureRequest) -> str:
    from tests.conftest import POSTGRES_URL, require_postgres

    require_postgres()
    return POSTGRES_URL


@pytest.fixture
def table_prefix(fresh_table_prefix: str) -> str:
    """Tables made for this test alone: its checks read the tables' statistics (update
    counters) and query plans, which an emptied, reused table would carry over."""
    return fresh_table_prefix


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


async def test_free_read_takes_partitions_at_one_place_in_order_without_sorting(
        store) -> None:
    """Partitions at one place in the lease queue (scheduled for one start, or created in
    one transaction, whose clock reads the same) come out of the queue's index in
    (rank_at, id) order: the free read stops at its limit, with no sort over all of
    them (13.7 ms a read with 10,000 tied, when the index held (status, rank_at) only)."""
    p = store.tables.partitions
    now = await store.now()
    rows = [{"id": f"w{n:05}", "version": 1, "gate": 0, "status": "available", "owner": "",
             "until": now, "created_at": now, "updated_at": now, "rank_at": now}
            for n in range(TIED)]
    async with store.engine.begin() as conn:
        await conn.execute(p.insert(), rows)
    async with store.engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(text(f'ANALYZE "{p.name}"'))
    nodes = await _plan(store, store.lease_statements.free(64))
    kinds = [node["Node Type"] for node in nodes]
    assert "Sort" not in kinds and "Incremental Sort" not in kinds, kinds
    scans = [node for node in nodes if node.get("Relation Name") == p.name]
    assert [scan.get("Index Name") for scan in scans] == [
        f"{store.tables.prefix}ix_partitions_rank"], scans
    assert [row.id for row in await store.leases_read_free(3)] == ["w00000", "w00001",
                                                                   "w00002"]


async def test_result_write_finds_each_item_by_its_primary_key(store) -> None:
    ready = await _filled(store)
    writes = [ItemWrite("big", item.id, item.version, "complete", 0, attempts=0)
              for item in ready]
    nodes = await _plan(store, store.driver.batch_statement,
                        batch_params(writes, "me"))
    scans = [node for node in nodes if node.get("Relation Name") == store.tables.items.name
             and node["Node Type"] != "ModifyTable"]
    # The primary key (partition, id) or the search index (id, partition): either
    # finds each row by its whole key.
    exact = {f"{store.tables.items.name}_pkey", f"{store.tables.prefix}ix_items_id"}
    assert scans and all(scan.get("Index Name") in exact for scan in scans), scans


async def test_backlog_read_reaches_items_through_the_ready_index_only(store) -> None:
    """The backlog gauges' read (counts and the oldest ready item) on a partition whose
    items mostly completed: every read of the items table goes through the ready index,
    so completed items cost nothing, and no scan reads the whole table."""
    await _filled(store)
    done = (await store.items_ready("big", 0, ITEMS))[10:]
    assert await store.items_apply([ItemWrite("big", item.id, item.version, "complete", 0, 1)
                                    for item in done], "me") == [True] * len(done)
    sent: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
               executemany: bool) -> None:
        sent.append((statement, parameters))

    event.listen(store.engine.sync_engine, "before_cursor_execute", record)
    try:
        await store.backlog_read(1000)
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", record)
    ((statement, parameters),) = sent
    async with store.engine.connect() as conn:
        raw = (await conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {statement}", parameters)
               ).scalar_one()
    document = raw if isinstance(raw, list) else json.loads(raw)
    nodes = list(_nodes(document[0]["Plan"]))
    scans = [node for node in nodes if node.get("Relation Name") == store.tables.items.name]
    assert len(scans) >= 2, nodes  # the waiting count and the oldest ready item
    assert {scan.get("Index Name") for scan in scans} == {
        f"{store.tables.prefix}ix_items_ready"}, scans


async def test_rewind_reads_spawned_items_through_their_index_only(store) -> None:
    """A rewind's reads of a partition's spawned items (those items spawned, and those a
    reduce spawned) go through ix_items_spawned, which holds the spawned items only
    (a partial index): the partition's thousands of completed items are not read,
    even on a table filled moments ago, with no statistics yet."""
    await spawning_partition(store, "big", ITEMS, "me")
    items = store.tables.items.name
    for statement in spawned_reads(store.tables, "big", 0):
        nodes = await _plan(store, statement)
        assert not [node for node in nodes if node["Node Type"] == "Seq Scan"], nodes
        used = {node["Index Name"] for node in nodes if "Index Name" in node}
        assert used == {f"{store.tables.prefix}ix_items_spawned"}, nodes
        assert not [node for node in nodes
                    if node.get("Relation Name") == items and "Filter" in node], nodes


async def _updates(store: Store) -> tuple[int, int]:
    """(updates, HOT updates) of the partitions table, as the statistics have them now."""
    async with store.engine.connect() as conn:
        row = (await conn.execute(text(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = :name"),
            {"name": store.tables.partitions.name})).one()
    return int(row[0]), int(row[1])


async def _counted(setup: Store, make_store: Callable[..., Store],
                   writes: Callable[[Store], Any], expected: int, *,
                   updates_before: int) -> tuple[Store, int, int]:
    """Run ``writes`` (``expected`` partition updates, on a store of their own) after the
    ``setup`` store made ``updates_before``; return a store to read with and the
    (updates, HOT updates) the writes made.

    A session reports its counters when it goes idle (at most once a second, else
    up to 10 s later) and when it ends: each store is closed once its writes are
    done, so the counts arrive at once. They are awaited until every update has.
    """
    reader = make_store()

    async def settled() -> tuple[int, int] | None:
        now = await _updates(reader)
        return now if now[0] >= updates_before else None

    await setup.close()
    before = await wait_until(settled, timeout=30, interval=0.05,
                              message="the setup's updates")
    writer = make_store()
    await writes(writer)
    await writer.close()

    async def arrived() -> tuple[int, int] | None:
        now = await _updates(reader)
        delta = (now[0] - before[0], now[1] - before[1])
        return delta if delta[0] >= expected else None

    updates, hot = await wait_until(arrived, timeout=30, interval=0.05,
                                    message=f"{expected} partition updates in "
                                            "pg_stat_user_tables")
    return reader, updates, hot


async def test_add_items_to_open_partitions_is_a_hot_update(
        make_store: Callable[..., Store]) -> None:
    store = make_store()
    ids = [f"p{n}" for n in range(4)]
    for pid in ids:
        await store.partition_create(pid, [NewItem("seed", b"x")])
    await store.leases_take(await store.leases_read_free(10), "me", 30.0)
    calls = 40

    async def add(writer: Store) -> None:
        for call in range(calls):
            await writer.items_add(ids[call % len(ids)],
                                   [NewItem(f"i{call}-{n}", b"y") for n in range(10)])

    _, updates, hot = await _counted(store, make_store, add, calls,
                                     updates_before=len(ids))  # the takes
    assert updates == calls
    assert hot == updates, f"{updates - hot} of {updates} add_items updates were not HOT"


async def test_a_gate_advance_is_a_hot_update(make_store: Callable[..., Store]) -> None:
    store = make_store()
    await store.partition_create("p", [NewItem("a", b"x"), NewItem("b", b"x", gate=5)])
    (lease,) = await store.leases_take(await store.leases_read_free(10), "me", 30.0)
    version = lease.version

    async def advance(writer: Store) -> None:
        nonlocal version
        for gate in range(1, 5):
            new = await writer.partition_transition("p", version, "me", gate=gate)
            assert new is not None
            version = new

    reader, updates, hot = await _counted(store, make_store, advance, 4,
                                          updates_before=1)  # the take
    assert (updates, hot) == (4, 4)
    assert (await reader.partition_get("p")).gate == 4


async def test_partition_pages_keep_room_for_hot_updates(store: Store) -> None:
    """Migration 0005 leaves a fifth of each ``partitions`` page free, so a HOT
    update finds room beside the old row version even on a full table."""
    async with store.engine.connect() as conn:
        options = (await conn.execute(
            text("SELECT reloptions FROM pg_class WHERE relname = :name"),
            {"name": store.tables.partitions.name})).scalar_one()
    assert "fillfactor=80" in (options or [])
