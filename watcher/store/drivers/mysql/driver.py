"""MariaDB and MySQL: the clock, the direct hot path, the one-statement result write.

- The ready read and the gate summary go as autocommit statements through a
  few aiomysql connections of the driver's own (:mod:`.direct`) instead
  of SQLAlchemy's engine; the ready read leaves out the items in hand through
  one JSON array parameter read with ``JSON_TABLE``.
- Item data is sent as base64 and stored by ``FROM_BASE64``, and a statement
  over the server's ``max_allowed_packet`` is refused before it is sent
  (:mod:`.packet`).
- A batch of results is one guarded ``UPDATE items, JSON_TABLE(...) AS v SET
  ...``, each row still matched on its version and fenced on the lease, in a
  transaction of its own. MariaDB has no ``RETURNING`` on ``UPDATE``, so the
  count of changed rows tells the outcome: all of them, or none, is the
  answer; anything between rolls the statement back and the batch goes again
  one write at a time, each telling its own (the portable path).

``JSON_TABLE`` needs MariaDB 10.6 or MySQL 8.0, which ``SKIP LOCKED`` needs too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import event, func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import Insert, Update

from watcher.config import DEFAULT_DB_TIMEOUT
from watcher.records import ItemWrite
from watcher.store.drivers.base import DirectDriver, Followers
from watcher.store.drivers.conflicts import error_number
from watcher.store.drivers.mysql.direct import MySQLDirect, is_timeout
from watcher.store.drivers.mysql.packet import (
    PACKET_KEY,
    READ_PACKET_LIMIT,
    base64_text,
    check_many,
)
from watcher.store.drivers.sql import (
    batch_params,
    batch_rows,
    batch_table,
    clock_now,
    clock_parameter,
    db_now,
    json_texts,
    park_rows,
    park_table,
    parks,
    replaced_rows,
    time_plus,
    time_plus_parts,
    wait_rows,
    wait_rows_json,
    wait_table,
)
from watcher.store.sql.shared import Statements
from watcher.store.sql.sources import ResultSource, WaitSource

NOW = "UTC_TIMESTAMP(6)"


@compiles(db_now, "mysql")
@compiles(db_now, "mariadb")
def _now(element: db_now, compiler: Any, **kw: Any) -> str:
    return NOW


@compiles(clock_now, "mysql")
@compiles(clock_now, "mariadb")
def _clock(element: clock_now, compiler: Any, **kw: Any) -> str:
    # The driver sends a time as a quoted string: cast it, or COALESCE answers text
    # (and a cast without (6) would drop the microseconds).
    parameter = clock_parameter(element, compiler, **kw)
    return f"COALESCE(CAST({parameter} AS DATETIME(6)), {NOW})"


@compiles(time_plus, "mysql")
@compiles(time_plus, "mariadb")
def _plus(element: time_plus, compiler: Any, **kw: Any) -> str:
    base, seconds = time_plus_parts(element, compiler, **kw)
    return f"({base} + INTERVAL CAST(({seconds}) * 1000000 AS SIGNED) MICROSECOND)"


# Ids compare as the id columns do (utf8mb4_bin), so that the primary key serves the join.
ID_TYPE = "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
# The batch rows' columns (watcher.store.drivers.sql.BATCH_COLUMNS), in JSON_TABLE's terms.
BATCH_COLUMNS = ", ".join((
    f"pid {ID_TYPE} PATH '$[0]'", f"iid {ID_TYPE} PATH '$[1]'", "seen BIGINT PATH '$[2]'",
    "status VARCHAR(16) CHARACTER SET utf8mb4 PATH '$[3]'", "gate BIGINT PATH '$[4]'",
    "attempts BIGINT PATH '$[5]'", "error LONGTEXT CHARACTER SET utf8mb4 PATH '$[6]'",
    "data LONGTEXT CHARACTER SET ascii PATH '$[7]'", "delay DOUBLE PATH '$[8]'",
    "history LONGTEXT CHARACTER SET utf8mb4 PATH '$[9]'"))


# A parking batch's rows add the wait's (watcher.store.drivers.sql.PARK_COLUMNS).
PARK_COLUMNS = ", ".join((
    BATCH_COLUMNS, f"wkey {ID_TYPE} PATH '$[10]'", "wtimeout DOUBLE PATH '$[11]'",
    "wpolicy VARCHAR(16) CHARACTER SET utf8mb4 PATH '$[12]'",
    f"wtrace {ID_TYPE} PATH '$[13]'"))


@compiles(batch_rows, "mysql")
@compiles(batch_rows, "mariadb")
def _batch_rows(element: batch_rows, compiler: Any, **kw: Any) -> str:
    rows = compiler.process(element.clauses, **kw)
    return f"JSON_TABLE({rows}, '$[*]' COLUMNS ({BATCH_COLUMNS}))"


@compiles(park_rows, "mysql")
@compiles(park_rows, "mariadb")
def _park_rows(element: park_rows, compiler: Any, **kw: Any) -> str:
    rows = compiler.process(element.clauses, **kw)
    return f"JSON_TABLE({rows}, '$[*]' COLUMNS ({PARK_COLUMNS}))"


# The waits rows' columns (watcher.store.drivers.sql.WAIT_COLUMNS), in JSON_TABLE's terms.
WAIT_COLUMNS = ", ".join((
    "n BIGINT PATH '$[0]'", f"pid {ID_TYPE} PATH '$[1]'", f"iid {ID_TYPE} PATH '$[2]'",
    "version BIGINT PATH '$[3]'", f"token {ID_TYPE} PATH '$[4]'", "timeout DOUBLE PATH '$[5]'",
    "on_timeout VARCHAR(16) CHARACTER SET utf8mb4 PATH '$[6]'",
    f"traceparent {ID_TYPE} PATH '$[7]'"))


@compiles(wait_rows, "mysql")
@compiles(wait_rows, "mariadb")
def _wait_rows(element: wait_rows, compiler: Any, **kw: Any) -> str:
    rows = compiler.process(element.clauses, **kw)
    return f"JSON_TABLE({rows}, '$[*]' COLUMNS ({WAIT_COLUMNS}))"


@compiles(json_texts, "mysql")
@compiles(json_texts, "mariadb")
def _texts(element: json_texts, compiler: Any, **kw: Any) -> str:
    return (f"JSON_TABLE({compiler.process(element.clauses, **kw)}, '$[*]' "
            f"COLUMNS (value {ID_TYPE} PATH '$'))")


def _check_packets(engine: AsyncEngine) -> None:
    """Have each connection of ``engine`` read its server's ``max_allowed_packet`` and
    refuse a statement larger than that before sending it
    (:mod:`watcher.store.drivers.mysql.packet`)."""
    sync_engine = engine.sync_engine
    if event.contains(sync_engine, "before_cursor_execute", _before_execute):
        return

    @event.listens_for(sync_engine, "connect")
    def _read_limit(dbapi_connection: Any, record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(READ_PACKET_LIMIT)
        (limit,) = cursor.fetchone()
        cursor.close()
        record.info[PACKET_KEY] = int(limit)

    event.listen(sync_engine, "before_cursor_execute", _before_execute)


def _before_execute(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
                    executemany: bool) -> None:
    check_many(statement, parameters, conn.info.get(PACKET_KEY))


# Server errors refusing a value: packet too large, data too long, incorrect
# string value, out of range, incorrect datetime, invalid JSON, column cannot be null.
VALUE_REFUSALS = frozenset({1153, 1406, 1366, 1264, 1292, 3140, 1048})


class MySQLDriver(DirectDriver[MySQLDirect]):
    """MariaDB and MySQL: hot statements through aiomysql directly, one-statement batch
    writes; watchers poll."""

    def __init__(self, engine: AsyncEngine, statements: Statements, *,
                 timeout: float = DEFAULT_DB_TIMEOUT) -> None:
        super().__init__(engine, statements, timeout=timeout)
        self.batch_statement = self._build_batch()
        self.park_statement = self._build_batch(parking=True)
        self.wait_statement = self._build_waits()
        _check_packets(engine)

    def open_direct(self) -> MySQLDirect:
        """A few aiomysql connections with the engine's arguments (:mod:`.direct`)."""
        return MySQLDirect.for_url(self.engine.url, self.engine.dialect, timeout=self.timeout)

    def timed_out(self, error: BaseException) -> bool:
        """See :meth:`Driver.timed_out`: the statement or lock wait timeout."""
        return is_timeout(error)

    def refuses_value(self, error: BaseException) -> bool:
        """See :meth:`Driver.refuses_value`; adds the server's value error numbers."""
        if super().refuses_value(error):
            return True
        return error_number(getattr(error, "orig", None)) in VALUE_REFUSALS

    async def execute_followed(self, statement: Any, params: Mapping[str, Any],
                               then_first_of: Followers) -> int:
        """:meth:`Driver.execute_followed` in one transaction on a direct connection:
        the statement, a follower or two, and the commit, in three or four round trips.

        Raises:
            sqlalchemy.exc.DBAPIError: the database failed or refused a write (nothing
                is written, unless the connection dropped during the commit).
            ValueRefusedError: a statement is over the server's packet; nothing is sent.
        """
        return await self.direct.execute_followed(statement, params, then_first_of)

    # -- result writes ------------------------------------------------------

    async def items_apply(self, writes: Sequence[ItemWrite], owner: str) -> list[bool]:
        """The batch as one guarded ``UPDATE ... JSON_TABLE`` in a transaction of its own.

        When every row changed, or none did, that is each write's outcome;
        otherwise the statement is rolled back and the writes go one by one
        (:meth:`Driver.items_apply`), each telling its own. When writes park their
        items, the UPDATE writes their waits too, and when some replace their item's
        last wait and every row changed, one ``INSERT ... SELECT ... JSON_TABLE`` keeps
        the replaced keys in ``waits`` before the commit (:meth:`_build_waits`).

        Raises:
            sqlalchemy.exc.DBAPIError: the database failed or refused a write
                (then none of the batch is written).
        """
        direct = self.direct
        params = batch_params(writes, owner, base64_text)
        then = None
        if replaced_rows(writes):
            then = (self.wait_statement, {"waits": wait_rows_json(writes)})
        statement = self.park_statement if parks(writes) else self.batch_statement
        changed = await direct.write_batch(statement, params, len(writes), then)
        if changed == len(writes):
            return [True] * len(writes)
        if changed == 0:
            return [False] * len(writes)
        return await super().items_apply(writes, owner)

    def _build_batch(self, parking: bool = False) -> Update:
        """The batch UPDATE from the JSON rows ``rows``; with ``parking``, rows with the
        wait's columns too."""
        v = (park_table if parking else batch_table)("rows").c
        return self.statements.result_write(ResultSource(
            partition_id=v.pid, item_id=v.iid, seen=v.seen, status=v.status, gate=v.gate,
            attempts=v.attempts, error=v.error, data=func.from_base64(v.data),
            delay=v.delay, history=v.history,
            wait=WaitSource(v.wkey, v.wtimeout, v.wpolicy, v.wtrace) if parking else None))

    def _build_waits(self) -> Insert:
        """The ``waits`` rows of the keys a batch's parking writes replace, from the JSON
        parameter ``waits`` (:func:`wait_rows_json`), their time the clock's: sent only
        once the batch UPDATE changed every row, so every one of them was applied."""
        w = wait_table("waits").c
        chosen = select(w.token, w.pid, w.iid, w.version, w.timeout, w.on_timeout,
                        w.traceparent, self.statements.now)
        return insert(self.statements.tables.waits).from_select(
            ["token", "partition_id", "item_id", "version", "timeout", "on_timeout",
             "traceparent", "created_at"], chosen)
