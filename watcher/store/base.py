"""The store's foundation: its engine, tables, clock, driver and round trips, its
transactions, the partition lock and the lease guard every lease-held write uses,
wake-ups, and the reads several kinds of caller share.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, Self

from sqlalchemy import (
    and_,
    func,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.expression import Insert, Update

from watcher.config import DEFAULT_DB_TIMEOUT
from watcher.errors import (
    PartitionNotFoundError,
)
from watcher.models import DELETING
from watcher.records import NewItem
from watcher.rules.checks import check_seconds
from watcher.store.codecs import (
    IN_CHUNK,
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
from watcher.store.sql.outbox import new_event_id, outbox_insert
from watcher.store.sql.schema import Tables, tables_for
from watcher.store.sql.shared import Statements
from watcher.store.sql.timelines import TimelineStatements

log = logging.getLogger(__name__)

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
        # The writes of the partitions' timelines, apart from the partition rows.
        self.timeline_statements = TimelineStatements(tables)
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

    # -- timelines ----------------------------------------------------------

    async def _move_with_timeline(self, name: str, move: Update, params: dict[str, Any],
                                  partition_id: str, timeline: str | None) -> int:
        """Run ``move``, a holder's guarded write of the partition row, and, where it
        matched and ``timeline`` is given, write the partition's timeline with it,
        atomically: a reader that sees the move sees its timeline. One statement where
        the driver chains writes (:meth:`TimelineStatements.after`), else one transaction
        (SQLite's or MariaDB's own, else the engine's). Returns the rows ``move`` wrote.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed (nothing was written).
        """
        if timeline is None:
            return await self.round_trips.call(name, self.driver.execute(move, params))
        statements = self.timeline_statements
        if self.driver.chains_writes:
            rows = await self.round_trips.call(name, self.driver.fetch(
                statements.after(move), {**params, "tl_text": timeline}, read=False))
            moved, written = rows[0]
            if moved == 1 and not written:  # no timeline row yet: an older processor's
                await self._timeline_write(partition_id, timeline)
            return int(moved)
        row = {"tl_pid": partition_id, "tl_text": timeline}
        followed = await self.round_trips.call(name, self.driver.execute_followed(
            move, params, ((statements.set_one, row), (statements.add_one, row))))
        if followed is not None:  # the driver's own transaction (SQLite, MariaDB)
            return followed
        async with self._write() as conn:
            moved = (await conn.execute(move, params)).rowcount
            if moved == 1:
                # The partition row is locked now: its timeline row cannot appear meanwhile.
                await self._timeline_set_in(conn, partition_id, timeline)
            return moved

    async def _timeline_set_in(self, conn: AsyncConnection, partition_id: str,
                               text: str) -> None:
        """In ``conn``'s transaction, which holds the partition row locked: set its
        timeline to ``text``, inserting its row where it has none. MySQL and MariaDB
        count only the rows an UPDATE changed, so a count of 0 is checked with a read
        before the insert (the text may have been stored already)."""
        t, statements = self.tables.timelines, self.timeline_statements
        row = {"tl_pid": partition_id, "tl_text": text}
        if (await conn.execute(statements.set_one, row)).rowcount:
            return
        if (await conn.execute(select(t.c.partition_id)
                               .where(t.c.partition_id == partition_id))).first() is None:
            await conn.execute(statements.add_one, row)

    async def _timeline_write(self, partition_id: str, text: str) -> bool:
        """Replace the partition's timeline (:mod:`watcher.rules.timeline`) with ``text``,
        in its own row (revision 0013): one UPDATE of a row that changes no indexed
        column. A holder calls it after its guarded write of the partition row
        matched (:meth:`_move_with_timeline` found no timeline row), so only the holder
        writes it. A partition created before its timeline row existed (by an older
        processor during an upgrade) gets the row here.

        Returns whether it was written. Never raises for the database: the
        partition's own write stands, and its timeline, an estimate, misses this
        write (logged); the holder's next renewal finds its copy stale and re-reads it.
        """
        params = {"tl_pid": partition_id, "tl_text": text}
        statements = self.timeline_statements
        try:
            matched = await self.round_trips.call(
                "timeline_write", self.driver.execute(statements.set_one, params))
            if matched:
                return True
            async with self._write() as conn:
                p = self.tables.partitions
                # Locked, so no other writer inserts its timeline row meanwhile.
                locked = await conn.execute(select(p.c.id).where(p.c.id == partition_id)
                                            .with_for_update())
                if locked.first() is None:
                    return False
                await self._timeline_set_in(conn, partition_id, text)
                return True
        except (SQLAlchemyError, TimeoutError) as error:
            log.warning("action=timeline_write_failed partition=%s error=%s", partition_id,
                        type(error).__name__)
            return False

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
                           rows: Sequence[tuple[str, NewItem, str | None]], *,
                           spawned_by_reduce: int | None = None) -> None:
        """Insert ``(partition id, item, parent)`` rows at available, in ``conn``'s
        transaction, a chunk of rows per statement; ``spawned_by_reduce`` is the gate of
        the reduce that spawned them all (``None``: none did).

        Raises:
            sqlalchemy.exc.IntegrityError: an id is stored already.
        """
        if rows:
            await self.driver.items_insert_in(conn, rows, spawned_by_reduce=spawned_by_reduce)

    @functools.cached_property
    def _outbox(self) -> Insert:
        return outbox_insert(self.statements)

    async def _outbox_in(self, conn: AsyncConnection, partition_id: str,
                         default: str | None = None) -> None:
        """Add the end of ``partition_id`` to the notifications' outbox in ``conn``'s
        transaction (:mod:`watcher.store.sql.outbox`), to its URL or else ``default``;
        nothing when it names none and there is no default. Call it only after the
        write that ended the partition matched.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed (the transaction
                rolls back, the end with it).
        """
        await conn.execute(self._outbox, {"pid": partition_id, "event_id": new_event_id(),
                                          "default": default})

    async def _end_with_event(self, statement: Update, params: dict[str, Any],
                              version: int, timeline: str | None = None,
                              default: str | None = None) -> int | None:
        """Run a holder's guarded write that ends partition ``params["pid"]`` and, when it
        matched, write its ``timeline`` (if any) and the end's event to the outbox (to
        the partition's URL or else ``default``), in one transaction. Returns the new
        version, or ``None`` when the write lost (nothing was written).

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed (nothing was written).
        """
        async with self._write() as conn:
            if (await conn.execute(statement, params)).rowcount != 1:
                return None
            if timeline is not None:
                await self._timeline_set_in(conn, params["pid"], timeline)
            await self._outbox_in(conn, params["pid"], default)
        return version + 1

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
