"""The library drain's limits: the same items drained with no engine, straight through
the database's own driver, for the library scenario to set statefeed against.

- SQLite (``sqlite3``), on the same kind of file (the migrated tables, WAL, the result
  writer's ``synchronous=NORMAL``): read up to :data:`RAW_BATCH` ready rows of a
  partition with the store's ready query, write each one with a guarded ``UPDATE ...
  WHERE <primary key> AND version = ?`` through one ``executemany``, commit, next
  partition; until nothing is ready. The time is read once per statement and bound, as
  the SQLite driver does.
- PostgreSQL (``psycopg``, one connection): read up to :data:`RAW_BATCH` ready rows of
  a partition, write them all with one guarded ``UPDATE ... FROM unnest(...)``, commit,
  next partition; until nothing is ready. The time is the server's ``now()``.

Neither leases, fences, dispatches or closes anything: each is the floor under a drain
of the same rows, the reads and writes a queue cannot do without.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bench.common import (
    Settings,
    create_partitions,
    libpq_url,
    settle_heap,
    spread,
    statefeed_tables,
)
from processor import AsyncClient
from watcher.store.db.urls import parse_database_url
from watcher.store.sql.schema import tables_for

RAW_BATCH = 256  # rows per read and per commit (the result writer's batch)


@dataclass(frozen=True)
class RawDrain:
    """A drain with no engine: items written, seconds, commits."""

    items: int
    seconds: float
    batches: int
    rounds: tuple[float, ...] = ()

    @property
    def per_second(self) -> float:
        """Items written per second."""
        return self.items / self.seconds

    def as_json(self) -> dict[str, Any]:
        """The drain as a JSON object."""
        return {"items": self.items, "seconds": round(self.seconds, 4),
                "items_per_s": round(self.per_second, 1), "batches": self.batches,
                "rounds_items_per_s": list(self.rounds)}


def _sqlite_now() -> str:
    # The time as SQLite stores it, read once per statement (as the SQLite driver does).
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def _sqlite_drain(path: str, prefix: str, partition_ids: Sequence[str], synchronous: str
                  ) -> tuple[int, int]:
    """Drain every ready item of ``partition_ids`` with plain ``sqlite3`` at the
    ``synchronous`` level (NORMAL or FULL); returns (items written, commits).
    Raises ``sqlite3.Error`` when SQLite does."""
    items = tables_for(prefix).items.name
    read = (f"SELECT id, version, attempts FROM {items} WHERE partition_id = ? "
            f"AND status = 'available' AND gate = ? AND retry_at <= ? "
            f"ORDER BY retry_at, id LIMIT {RAW_BATCH}")
    write = (f"UPDATE {items} SET version = version + 1, status = 'complete', attempts = ?, "
             f"last_error = NULL, updated_at = ?, retry_at = ? "
             f"WHERE partition_id = ? AND id = ? AND version = ?")
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(f"PRAGMA synchronous={synchronous}")
        written = batches = 0
        pending = list(partition_ids)
        while pending:
            for partition_id in list(pending):
                rows = conn.execute(read, (partition_id, 0, _sqlite_now())).fetchall()
                if not rows:
                    pending.remove(partition_id)
                    continue
                conn.execute("BEGIN IMMEDIATE")
                now = _sqlite_now()
                changed = conn.executemany(write, [
                    (attempts + 1, now, now, partition_id, item_id, version)
                    for item_id, version, attempts in rows])
                conn.execute("COMMIT")
                written += changed.rowcount
                batches += 1
        return written, batches
    finally:
        conn.close()


async def raw_sqlite_drain(settings: Settings, synchronous: str = "NORMAL") -> RawDrain:
    """SQLite's limit on the library drain's items, in ``settings.db_url``'s file (see
    the module docstring). ``synchronous`` NORMAL is the result writer's level (the
    limit); FULL, sqlite3's default, syncs the log at every commit.

    Raises:
        RuntimeError: not every item was written.
        sqlite3.Error: SQLite refused a statement.
    """
    sizes = settings.sizes
    path = str(parse_database_url(settings.db_url).sync_url.database)
    async with statefeed_tables(settings.db_url, "raw") as prefix:
        async with AsyncClient(settings.db_url, prefix) as client:
            ids = await create_partitions(client, spread(sizes.items, sizes.partitions))
        settle_heap()
        started = time.perf_counter()
        written, batches = _sqlite_drain(path, prefix, ids, synchronous)
        seconds = time.perf_counter() - started
    if written != sizes.items:
        raise RuntimeError(f"sqlite3 drain: {written} of {sizes.items} items written")
    return RawDrain(written, seconds, batches)


async def _psycopg_drain(dsn: str, prefix: str, partition_ids: Sequence[str]
                         ) -> tuple[int, int]:
    """Drain every ready item of ``partition_ids`` with plain ``psycopg``; returns
    (items written, commits). Raises ``psycopg.Error`` when PostgreSQL does."""
    import psycopg

    items = tables_for(prefix).items.name
    read = (f"SELECT id, version, attempts FROM {items} WHERE partition_id = %s "
            f"AND status = 'available' AND gate = 0 AND retry_at <= now() "
            f"ORDER BY retry_at, id LIMIT {RAW_BATCH}")
    write = (f"UPDATE {items} AS i SET version = i.version + 1, status = 'complete', "
             f"attempts = v.attempts, last_error = NULL, updated_at = now(), "
             f"retry_at = now() FROM unnest(%s::text[], %s::bigint[], %s::int[]) "
             f"AS v(id, version, attempts) "
             f"WHERE i.partition_id = %s AND i.id = v.id AND i.version = v.version")
    written = batches = 0
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        pending = list(partition_ids)
        while pending:
            for partition_id in list(pending):
                async with conn.transaction():
                    rows = await (await conn.execute(read, (partition_id,))).fetchall()
                    if not rows:
                        pending.remove(partition_id)
                        continue
                    changed = await conn.execute(write, (
                        [row[0] for row in rows], [row[1] for row in rows],
                        [row[2] + 1 for row in rows], partition_id))
                written += changed.rowcount
                batches += 1
    return written, batches


async def raw_psycopg_drain(settings: Settings) -> RawDrain:
    """PostgreSQL's floor under the library drain's items: the batch read and one
    ``UPDATE ... FROM unnest`` per batch, through psycopg (see the module docstring).

    Raises:
        RuntimeError: not every item was written.
        psycopg.Error: PostgreSQL refused a statement.
    """
    sizes = settings.sizes
    async with statefeed_tables(settings.db_url, "raw") as prefix:
        async with AsyncClient(settings.db_url, prefix) as client:
            ids = await create_partitions(client, spread(sizes.items, sizes.partitions))
        settle_heap()
        started = time.perf_counter()
        written, batches = await _psycopg_drain(libpq_url(settings.db_url), prefix, ids)
        seconds = time.perf_counter() - started
    if written != sizes.items:
        raise RuntimeError(f"psycopg drain: {written} of {sizes.items} items written")
    return RawDrain(written, seconds, batches)
