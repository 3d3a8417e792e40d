"""The hot path (the ready read and the result writes), one suite run on every live database.

Each store holds the driver of its database (:mod:`watcher.store.drivers`). Whatever
a driver does its own way (a direct path, a one-statement batch write), its
methods must answer the same: the ready read orders, limits and leaves out the
items in hand; a batch of results is guarded by version and fenced by a live
lease, write by write, whatever mix of applied, stale and fenced-off rows it
holds (the SQLite and MariaDB batches find out which rows failed by rolling
back and writing one by one); times follow the store's clock. The stores here
run on a :class:`~watcher.store.db.clock.FixedClock`, which must take the same
statements, and on PostgreSQL the same direct path and batch write, as the
database clock.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event

from tests.support.engine import leased_partition
from watcher.records import ItemWrite, LeaseRow, NewItem
from watcher.store import Store
from watcher.store.db.clock import FixedClock
from watcher.store.drivers.mssql.driver import SQLServerDriver
from watcher.store.drivers.mysql.driver import MySQLDriver
from watcher.store.drivers.postgresql.driver import PostgreSQLDriver
from watcher.store.drivers.sqlite.driver import SQLiteDriver

MOMENT = datetime(2030, 1, 1, 12, 0, 0)
OWNER = "me"


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(MOMENT)


@pytest.fixture
def fixed_store(make_store, clock: FixedClock) -> Store:
    return make_store(clock=clock)


async def _leased(store: Store, partition_id: str, items: list[NewItem],
                  duration: float = 30.0) -> LeaseRow:
    await store.partition_create(partition_id, items)
    (lease,) = await store.leases_take([LeaseRow(partition_id, 1, 0, "")], OWNER, duration)
    return lease


async def _ready_ids(store: Store, partition_id: str, limit: int = 100,
                     exclude: tuple[str, ...] = ()) -> list[str]:
    rows = await store.driver.items_ready(partition_id, 0, limit, exclude)
    return [row[0] for row in rows]


@contextlib.contextmanager
def _sent(store: Store) -> Iterator[tuple[list[str], list[str]]]:
    """The statement texts ``store`` sends meanwhile: (through the engine, past it)."""
    engine: list[str] = []
    direct: list[str] = []

    def on_engine(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        engine.append(statement)

    event.listen(store.engine.sync_engine, "before_cursor_execute", on_engine)
    store.driver.add_statement_listener(direct.append)
    try:
        yield engine, direct
    finally:
        store.driver.remove_statement_listener(direct.append)
        event.remove(store.engine.sync_engine, "before_cursor_execute", on_engine)


def test_each_database_gets_its_own_driver(store: Store) -> None:
    expected = {"sqlite": SQLiteDriver, "postgresql": PostgreSQLDriver,
                "mysql": MySQLDriver, "mariadb": MySQLDriver,
                "mssql": SQLServerDriver}[store.engine.dialect.name]
    assert type(store.driver) is expected
    assert store.notifies is (expected is PostgreSQLDriver)


async def test_ready_read_orders_limits_and_leaves_out_items_in_hand(fixed_store, clock
                                                                     ) -> None:
    store = fixed_store
    names = ["a", 'quo"te', "c", "d", "e"]
    await _leased(store, "p", [*(NewItem(name, b"x") for name in names),
                               NewItem("later", b"x", gate=1)])
    (c,) = [row for row in await store.driver.items_ready("p", 0, 100, ()) if row[0] == "c"]
    # "c" retries 5 s from now: it goes last once due, and is not ready before.
    assert await store.driver.items_apply(
        [ItemWrite("p", "c", c[1], "available", 0, 1, last_error="x", retry_delay=5.0)],
        OWNER) == [True]
    assert "c" not in await _ready_ids(store, "p")
    clock.advance(5.0)
    assert await _ready_ids(store, "p") == ["a", "d", "e", 'quo"te', "c"]
    assert await _ready_ids(store, "p", limit=2) == ["a", "d"]
    assert await _ready_ids(store, "p", exclude=("a", 'quo"te', "absent")) == ["d", "e", "c"]
    assert await _ready_ids(store, "p", limit=1, exclude=("a",)) == ["d"]
    assert await _ready_ids(store, "p", exclude=tuple(names)) == []
    rows = await store.driver.items_ready("p", 0, 1, ())
    assert [(row[0], row[2], bytes(row[3]), row[4]) for row in rows] == [("a", 0, b"x", 0)]


async def test_batch_apply_guards_and_fences_each_write(fixed_store, clock) -> None:
    store = fixed_store
    await _leased(store, "p", [NewItem(name, b"old") for name in "abcdef"], duration=60.0)
    await store.partition_create("theirs", [NewItem("t", b"x")])
    await store.leases_take([LeaseRow("theirs", 1, 0, "")], "someone-else", 60.0)
    seen = {row[0]: row[1] for row in await store.driver.items_ready("p", 0, 100, ())}
    writes = [
        ItemWrite("p", "a", seen["a"], "complete", 0, attempts=0),
        ItemWrite("p", "b", seen["b"] + 1, "complete", 0, attempts=0),  # stale version
        ItemWrite("theirs", "t", 1, "complete", 0, attempts=0),  # not our lease
        ItemWrite("p", "c", seen["c"], "available", 4, attempts=0, data=b"new"),
        ItemWrite("p", "d", seen["d"], "available", 0, attempts=2, last_error="boom",
                  retry_delay=1.5),
        ItemWrite("p", "e", seen["e"], "failed", 0, attempts=3, last_error="bad"),
    ]
    assert await store.driver.items_apply(writes, OWNER) == [True, False, False, True, True,
                                                             True]
    assert await store.driver.items_apply(writes[:1], OWNER) == [False], "applied once"
    items = {info.id: info for info in await store.items_list("p")}
    assert (items["a"].status, items["a"].version) == ("complete", seen["a"] + 1)
    assert (items["b"].status, items["b"].version) == ("available", seen["b"])
    assert (items["c"].gate, items["c"].data, items["c"].retry_at) == (4, b"new", MOMENT)
    assert (items["d"].attempts, items["d"].last_error, items["d"].data) == (2, "boom", b"old")
    assert items["d"].retry_at == MOMENT + timedelta(seconds=1.5)
    assert (items["e"].status, items["e"].last_error) == ("failed", "bad")
    assert (await store.items_list("theirs"))[0].status == "available"
    # A lease that ran out fences every write, even from its last owner.
    clock.advance(60.0)
    late = ItemWrite("p", "f", seen["f"], "complete", 0, attempts=0)
    assert await store.driver.items_apply([late], OWNER) == [False]
    assert await store.driver.items_apply([late], "someone-else") == [False]


async def test_times_follow_the_fixed_clock(fixed_store, clock) -> None:
    store = fixed_store
    assert await store.now() == MOMENT
    lease = await _leased(store, "p", [NewItem("i", b"x")], duration=12.25)
    assert (await store.partition_get("p")).until == MOMENT + timedelta(seconds=12.25)
    clock.advance(3.5)
    assert await store.now() == MOMENT + timedelta(seconds=3.5)
    # Forty days and a half second: more than an INT of milliseconds holds (SQL Server).
    long = 40 * 86400 + 0.5
    renewal = await store.leases_renew({"p": lease.version}, OWNER, long)
    assert set(renewal.held) == {"p"}
    assert (await store.partition_get("p")).until == MOMENT + timedelta(seconds=3.5 + long)
    (row,) = await store.driver.items_ready("p", 0, 10, ())
    assert await store.driver.items_apply(
        [ItemWrite("p", "i", row[1], "available", 0, 1, last_error="x", retry_delay=2.5)],
        OWNER) == [True]
    (item,) = await store.items_list("p")
    assert item.retry_at == MOMENT + timedelta(seconds=6.0)
    summary = await store.gate_summary("p", 0)
    assert summary.pending == 1 and summary.seconds_to_next_retry == pytest.approx(2.5)


async def test_the_fixed_clock_sends_the_statements_the_database_clock_sends(make_store, clock
                                                                            ) -> None:
    """Only the clock parameter differs: same texts, on the same path (and on
    PostgreSQL that is the direct path, with the one-statement batch write)."""
    sent: dict[str, tuple[list[str], list[str]]] = {}
    stores = {"database": make_store(), "fixed": make_store(clock=clock)}
    for name, store in stores.items():
        pid = f"p-{name}"
        await _leased(store, pid, [NewItem("a", b"x"), NewItem("b", b"x")])
        with _sent(store) as texts:
            rows = await store.driver.items_ready(pid, 0, 10, ())
            assert [row[0] for row in rows] == ["a", "b"]
            assert [row[0] for row in await store.driver.items_ready(pid, 0, 10, ("a",))] == ["b"]
            writes = [ItemWrite(pid, row[0], row[1], "complete", 0, attempts=0) for row in rows]
            assert await store.driver.items_apply(writes, OWNER) == [True, True]
            assert (await store.gate_summary(pid, 0)).pending == 0
        sent[name] = texts
    assert sent["fixed"] == sent["database"]
    engine, direct = sent["fixed"]
    assert engine == [], "nothing of the hot path went through the engine"
    # Two reads, one batch write (one statement; on SQLite one lease check per
    # partition and one unfenced executemany in a write transaction; on MariaDB a
    # transaction), one gate summary.
    assert [text.split(None, 1)[0] for text in direct] == {
        PostgreSQLDriver: ["SELECT", "SELECT", "UPDATE", "SELECT"],
        SQLiteDriver: ["SELECT", "SELECT", "BEGIN", "SELECT", "UPDATE", "COMMIT", "SELECT"],
        MySQLDriver: ["SELECT", "SELECT", "UPDATE", "COMMIT", "SELECT"],
    }[type(stores["fixed"].driver)], direct
    batch_function = {PostgreSQLDriver: "jsonb_array_elements(", SQLiteDriver: "",
                      MySQLDriver: "JSON_TABLE("}[type(stores["fixed"].driver)]
    assert batch_function in next(text for text in direct if text.startswith("UPDATE"))


async def test_statements_are_built_once_whatever_the_clock(fixed_store, clock) -> None:
    driver, statements = fixed_store.driver, fixed_store.statements
    ready = driver.ready_statement(True, 10)
    write = statements.item_write(new_data=True, delayed=True)
    summary = statements.gate_summary
    clock.advance(1.0)
    assert statements.item_write(new_data=True, delayed=True) is write
    assert statements.gate_summary is summary
    assert driver.ready_statement(True, 99) is ready  # the limit is a parameter


async def test_notifications_reach_a_listener_where_the_database_carries_them(make_store
                                                                              ) -> None:
    listener, writer = make_store(), make_store()
    if not listener.notifies:
        with pytest.raises(NotImplementedError, match="poll"):
            listener.notifications()
        return
    received = listener.notifications()
    first = asyncio.ensure_future(anext(received))
    try:
        # LISTEN starts on the listener's own connection: write until it hears one.
        async with asyncio.timeout(10):
            for number in range(1000):
                await writer.partition_create(f"p{number}", [])
                done, _ = await asyncio.wait({first}, timeout=0.1)
                if done:
                    break
        assert first.result().startswith("p")
    finally:
        first.cancel()
        with contextlib.suppress(BaseException):
            await first
        await received.aclose()


async def test_a_mixed_batch_applies_exactly_the_rows_whose_guards_hold(store: Store) -> None:
    ours = await leased_partition(store, "p", 4, OWNER)
    theirs = await leased_partition(store, "q", 1, "other")
    complete = "complete"
    writes = [ItemWrite("p", "i0", ours["i0"], complete, 0, attempts=1),
              ItemWrite("p", "i1", ours["i1"] + 1, complete, 0, attempts=1),  # stale
              ItemWrite("q", "i0", theirs["i0"], complete, 0, attempts=1),  # fenced off
              ItemWrite("p", "i2", ours["i2"], "available", 0, attempts=1, data=b"new",
                        last_error="later", retry_delay=0.5),
              ItemWrite("p", "i2", ours["i2"], complete, 0, attempts=1),  # twice in a batch
              ItemWrite("p", "i3", ours["i3"], complete, 0, attempts=1)]
    assert await store.items_apply(writes, OWNER) == [True, False, False, True, False, True]
    items = {item.id: item for item in await store.items_list("p")}
    assert [items[f"i{n}"].status for n in range(4)] == [
        complete, "available", "available", complete]
    assert (items["i2"].data, items["i2"].last_error) == (b"new", "later")
    assert [item.status for item in await store.items_list("q")] == ["available"]
    # Every guard failing: nothing is written, every write says so.
    assert await store.items_apply(writes[:3], OWNER) == [False, False, False]
    assert (await store.items_list("p"))[0].version == ours["i0"] + 1
