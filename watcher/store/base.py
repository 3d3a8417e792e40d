"""The store's foundation: its engine, tables, clock, driver and round trips, its
transactions, the partition lock and the lease guard every lease-held write uses,
wake-ups, and the reads several kinds of caller share.
"""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, Self

from sqlalchemy import (
    and_,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from watcher.config import DEFAULT_DB_TIMEOUT
from watcher.errors import (
    PartitionNotFoundError,
)
from watcher.models import AVAILABLE, DELETING
from watcher.records import NewItem
from watcher.rules.checks import check_seconds
from watcher.rules.delays import stored_time
from watcher.store.codecs import (
    IN_CHUNK,
    INSERT_CHUNK,
    LIKE_ESCAPE,
    chunks,
    like_prefix,
)
from watcher.store.db.clock import Clock, ClockReading, DatabaseClock
from watcher.store.db.engine import create_engine
from watcher.store.db.round_trips import RoundTrips
from watcher.store.db.urls import DatabaseURL, parse_database_url, render_redacted
from watcher.store.drivers import open_driver
from watcher.store.drivers.base import Driver, read_transaction, write_transaction
from watcher.store.sql.leases import LeaseStatements
from watcher.store.sql.schema import Tables, tables_for
from watcher.store.sql.shared import Statements

# Partition columns a listing leaves unread (see :meth:`_partitions_rows`).
UNLISTED_COLUMNS = frozenset({"request_digest", "trace_context", "timeline", "rank_at"})


class StoreBase:
    """The engine, tables, clock, driver and round trips every part of the store uses."""

    def __init__(self, engine: AsyncEngine, tables: Tables, *, clock: Clock | None = None,
                 db_timeout: float = DEFAULT_DB_TIMEOUT):
        self.engine = engine
        self.tables = tables
        self.clock: Clock = clock if clock is not None else DatabaseClock()
        self.statements = Statements(tables, self.clock)
        # The lease cycle's statements (its reads, the take where the driver sends it as
        # one statement, a new partition's queue place), built once per shape.
        self.lease_statements = LeaseStatements(self.statements)
        # The database's time as a lease read, renewal or gate summary last returned it
        # (see time_to_record).
        self.clock_reading = ClockReading()
        self.driver: Driver = open_driver(engine, self.statements, timeout=db_timeout)
        # Every round trip below goes through it: bounded, and its timeouts remembered.
        self.round_trips = RoundTrips(timeout=db_timeout, bound=self.driver.round_trip_bound(),
                                      timed_out=self.driver.timed_out,
                                      database=render_redacted(engine.url),
                                      precheck=self.driver.require_usable)
        self.round_trips.watch(engine)

    @classmethod
    def open(cls, url: str | DatabaseURL, table_prefix: str = "", *,
             clock: Clock | None = None, db_timeout: float = DEFAULT_DB_TIMEOUT) -> Self:
        """Create a store with its own engine; ``db_timeout`` bounds each database
        round trip (seconds, see :mod:`watcher.store.db.round_trips`).

        Raises:
            ConfigError: the URL, the table prefix or the timeout is invalid, or
                the database is not supported.
        """
        check_seconds("database timeout", db_timeout)
        parsed = url if isinstance(url, DatabaseURL) else parse_database_url(url)
        return cls(create_engine(parsed, timeout=db_timeout), tables_for(table_prefix),
                   clock=clock, db_timeout=db_timeout)

    def time_to_record(self) -> datetime | None:
        """The store clock's time now without a round trip, for what only records a time
        (a timeline): the test clock's when one is set, otherwise the database's as the
        latest lease read, renewal or gate summary returned it, carried on by the
        monotonic clock; ``None`` when there is no recent reading (see
        :class:`~watcher.store.db.clock.ClockReading`)."""
        return self.clock.reading() or self.clock_reading.now(time.monotonic())

    def problem(self) -> str | None:
        """Why the database cannot be relied on now (``None`` when it can): round trips
        that time out, or (SQLite) a database file deleted or replaced."""
        return self.driver.problem() or self.round_trips.problem()

    async def close(self) -> None:
        """Dispose of the driver's and the engine's connections."""
        await self.driver.close()
        await self.engine.dispose()

    # -- transactions -------------------------------------------------------

    # Each transaction is named for the store method that opens it (its caller), in
    # the round trips' log line.

    def _write(self) -> AbstractAsyncContextManager[AsyncConnection]:
        return self.round_trips.transaction(write_transaction(self.engine),
                                            sys._getframe(1).f_code.co_name)

    def _read(self) -> AbstractAsyncContextManager[AsyncConnection]:
        return self.round_trips.transaction(read_transaction(self.engine),
                                            sys._getframe(1).f_code.co_name)

    async def _touch_partition(self, conn: AsyncConnection, partition_id: str,
                               **values: Any) -> None:
        """Bump the partition's version (and set ``values``) in ``conn``'s transaction,
        which locks its row until the transaction ends.

        ``updated_at`` moves only with a new ``status``: it is indexed (retention,
        the finished-per-minute counts), and a write that changes no indexed
        column is a HOT update on PostgreSQL (no new index entries, and the old
        row version is pruned within its page).

        Raises:
            PartitionNotFoundError: no partition has this id (or it is being deleted).
        """
        p = self.tables.partitions
        touched = await conn.execute(
            update(p).where(p.c.id == partition_id, p.c.status != DELETING)
            .values(version=p.c.version + 1, **values,
                    **({"updated_at": self.statements.now} if "status" in values else {})))
        if touched.rowcount != 1:
            raise PartitionNotFoundError(partition_id)

    async def _require_partition(self, conn: AsyncConnection, partition_id: str) -> None:
        """Raises PartitionNotFoundError when no partition has this id."""
        p = self.tables.partitions
        if (await conn.execute(select(p.c.id).where(p.c.id == partition_id))).first() is None:
            raise PartitionNotFoundError(partition_id)

    async def _stored_ids(self, conn: AsyncConnection, partition_id: str,
                          ids: Sequence[str]) -> list[str]:
        """Which of ``ids`` the partition holds already (read by primary key, in chunks)."""
        i = self.tables.items
        stored: list[str] = []
        for chunk in chunks(list(ids), IN_CHUNK):
            stored += (await conn.execute(select(i.c.id).where(
                i.c.partition_id == partition_id, i.c.id.in_(chunk)))).scalars().all()
        return sorted(stored)

    async def _items_insert(self, conn: AsyncConnection, partition_id: str,
                            items: Sequence[NewItem], parent: str | None = None) -> None:
        """Insert ``items`` at available (a gate of ``None`` is 0), in ``conn``'s transaction;
        ``parent`` is the item that spawned them (``None``: the client's, or a reduce's).

        Raises:
            sqlalchemy.exc.IntegrityError: an id is stored already.
        """
        await self._rows_insert(conn, [(partition_id, item, parent) for item in items])

    async def _rows_insert(self, conn: AsyncConnection,
                           rows: Sequence[tuple[str, NewItem, str | None]]) -> None:
        """Insert ``(partition id, item, parent)`` rows at available, in ``conn``'s
        transaction, a chunk of rows per statement.

        Raises:
            sqlalchemy.exc.IntegrityError: an id is stored already.
        """
        if not rows:
            return
        now = (await conn.execute(select(self.statements.now))).scalar_one()
        statement = insert(self.tables.items)
        for chunk in chunks(rows, INSERT_CHUNK):
            await conn.execute(statement, [
                {
                    "partition_id": partition_id, "id": item.id, "version": 1,
                    "gate": 0 if item.gate is None else item.gate, "status": AVAILABLE,
                    "data": item.data, "attempts": 0, "last_error": None,
                    "retry_at": (now if item.not_before is None
                                 else max(now, stored_time(item.not_before))),
                    "created_at": now, "updated_at": now, "parent": parent,
                }
                for partition_id, item, parent in chunk
            ])

    @property
    def notifies(self) -> bool:
        """Whether this database carries wake-up notifications (PostgreSQL only)."""
        return self.driver.notifies

    @property
    def polling_reason(self) -> str | None:
        """Why watchers poll a database that could notify them (behind a transaction
        pooler), or ``None``."""
        return self.driver.polling_reason

    @property
    def channel(self) -> str:
        """The notification channel of this namespace (the prefix is validated)."""
        return f"{self.tables.prefix}statefeed"

    async def _notify(self, conn: AsyncConnection, partition_id: str) -> None:
        await self.driver.notify(conn, self.channel, partition_id)

    def notifications(self) -> AsyncIterator[str]:
        """Yield the partition ids that clients wrote, as their transactions commit.

        Holds one dedicated connection. Raises the driver's error when the
        connection fails (the caller reconnects), and ``NotImplementedError``
        on a database without notifications (see :attr:`notifies`).
        """
        return self.driver.notifications(self.channel)

    async def ping(self) -> None:
        """Run a trivial query. Raises the driver's error when the database is unreachable."""
        async with self._read() as conn:
            await conn.execute(select(literal(1)))

    async def now(self) -> datetime:
        """The current time by the store's clock (the database's, unless a test fixed it)."""
        async with self._read() as conn:
            return (await conn.execute(select(self.statements.now))).scalar_one()

    async def _counts(self, conn: AsyncConnection, rows: Sequence[Any]
                      ) -> dict[str, dict[str, int]]:
        """Item counts per status of the partitions ``rows``, read through the ready index."""
        i = self.tables.items
        counts: dict[str, dict[str, int]] = {row.id: {} for row in rows}
        for chunk in chunks(list(counts), IN_CHUNK):
            grouped = await conn.execute(
                select(i.c.partition_id, i.c.status, func.count())
                .where(i.c.partition_id.in_(chunk))
                .group_by(i.c.partition_id, i.c.status)
            )
            for partition_id, item_status, count in grouped:
                counts[partition_id][item_status] = count
        return counts

    async def _partitions_rows(self, conn: AsyncConnection, *, ids: list[str] | None = None,
                               status: str | None = None, limit: int = 1000,
                               after: tuple[datetime, str] | None = None,
                               prefix: str | None = None) -> list[Any]:
        p = self.tables.partitions
        # Every column a PartitionInfo shows: the create's request digest is the API's,
        # and the trace context and timeline are read where they are shown.
        query = select(*(column for column in p.c if column.name not in UNLISTED_COLUMNS))
        if ids is not None:
            query = query.where(p.c.id.in_(ids))
        if status is not None:
            query = query.where(p.c.status == status)
        if prefix:
            query = query.where(p.c.id.like(like_prefix(prefix), escape=LIKE_ESCAPE))
        if after is not None:
            created, last_id = after
            query = query.where(or_(p.c.created_at < created,
                                    and_(p.c.created_at == created, p.c.id < last_id)))
        query = query.order_by(p.c.created_at.desc(), p.c.id.desc()).limit(limit)
        return list((await conn.execute(query)).all())
