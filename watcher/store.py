"""The store seam: every SQL statement statefeed runs is built here or in its database's driver.

Engine writes are guarded: ``UPDATE ... SET version = version + 1 ... WHERE
<key> AND version = :seen`` and count only when exactly one row changed. Lease
held writes also match the owner. Times come from the store's clock
(:mod:`watcher.clock`): the database's own in production, a fixed time in
tests, sent as a parameter of the same statements.

This module builds the SQL every database shares (:class:`Statements`). What a
database does its own way (how the hot statements travel, how the ready read
leaves out the items in hand, how a batch of results is written, wake-ups)
belongs to the driver the store opens once (:mod:`watcher.drivers`).

Methods are named entity first (``leases_take``, ``items_ready``, ...). Each one
is a single transaction. They raise :class:`sqlalchemy.exc.SQLAlchemyError`
subclasses when the database fails; client-facing methods raise the
:mod:`watcher.errors` types for bad input and write nothing in that case.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import sys
from collections.abc import AsyncIterator, Collection, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Float,
    Integer,
    and_,
    bindparam,
    case,
    delete,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.expression import ColumnElement, Exists, Select, Update

from watcher.checks import check_seconds
from watcher.clock import Clock, DatabaseClock
from watcher.config import DEFAULT_DB_TIMEOUT
from watcher.database import create_engine
from watcher.dburl import DatabaseURL, parse_database_url, render_redacted
from watcher.decisions import reduces_to_run_again
from watcher.drivers import Driver, open_driver
from watcher.drivers.base import read_transaction, write_transaction
from watcher.drivers.sql import clock_now, data_size, lock_unless_busy, time_plus
from watcher.errors import (
    DatabaseError,
    DuplicateItemError,
    GateError,
    InvalidInputError,
    PartitionExistsError,
    PartitionLeasedError,
    PartitionNotFoundError,
)
from watcher.models import ItemFailurePolicy, Status
from watcher.records import (
    Backlog,
    DeleteBatch,
    GateSummary,
    ItemInfo,
    ItemWrite,
    LeaseRenewal,
    LeaseRow,
    LeaseStats,
    NewItem,
    Page,
    PartitionInfo,
    PartitionSettings,
    PartitionState,
    ReadyItem,
    ReduceEntry,
    ReduceProgress,
    ReduceState,
    RetryReport,
    Throughput,
)
from watcher.reduction import ReduceStep
from watcher.round_trips import RoundTrips
from watcher.schema import Tables, tables_for

INSERT_CHUNK = 500
IN_CHUNK = 500

NO_SETTINGS = PartitionSettings()

AVAILABLE = Status.AVAILABLE.value
COMPLETE = Status.COMPLETE.value
FAILED = Status.FAILED.value
CANCELLED = Status.CANCELLED.value
DELETING = Status.DELETING.value


# The escape character of the LIKE patterns the store builds, and the characters it
# escapes: the wildcards, itself, and "[" (a character class on SQL Server).
LIKE_ESCAPE = "/"


def _like_prefix(prefix: str) -> str:
    """A LIKE pattern matching the texts that start with ``prefix`` (and, on databases
    whose LIKE ignores case, those that do so but for case)."""
    escaped = "".join(LIKE_ESCAPE + char if char in "%_[/" else char for char in prefix)
    return escaped + "%"


def _chunks(values: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


def encode_partition_cursor(info: PartitionInfo | Any) -> str:
    """The cursor of a partitions page that ends with ``info`` (a partition or its row):
    its creation time and id, in an opaque URL-safe text."""
    assert info.created_at is not None
    raw = json.dumps([info.created_at.isoformat(), info.id], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode("ascii").rstrip("=")


def decode_partition_cursor(cursor: str) -> tuple[datetime, str]:
    """The creation time and id that :func:`encode_partition_cursor` put in ``cursor``.

    Raises:
        InvalidInputError: ``cursor`` is not such a cursor.
    """
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, partition_id = json.loads(raw)
        if not isinstance(partition_id, str):
            raise TypeError(partition_id)
        return datetime.fromisoformat(created), partition_id
    except (binascii.Error, ValueError, TypeError):
        raise InvalidInputError(
            f"{cursor[:60]!r} is not a cursor of the partitions listing; pass the "
            "next_cursor of the page before") from None


def encode_reduce_gates(gates: Collection[int]) -> str | None:
    """The ``reduce_gates`` column for ``gates``: a sorted JSON list, or NULL for none."""
    return json.dumps(sorted(gates), separators=(",", ":")) if gates else None


def settings_of(reduce_gates: str | None, on_item_failure: str | None) -> PartitionSettings:
    """A partition's settings from its ``reduce_gates`` and ``on_item_failure`` columns."""
    gates = frozenset(json.loads(reduce_gates)) if reduce_gates else frozenset()
    return PartitionSettings(gates, on_item_failure == ItemFailurePolicy.CONTINUE.value)


class Statements:
    """The SQL every database shares, for one table namespace and one clock.

    Built once per store and handed to its driver, which builds on it what
    its database does its own way. Every time in these statements is
    :attr:`now`, ``COALESCE(:clock_now, <database now>)``: the clock fills the
    parameter in as each statement runs, so the statements are the same under
    the database clock and a test's fixed clock.
    """

    def __init__(self, tables: Tables, clock: Clock) -> None:
        self.tables = tables
        self.clock = clock
        self.now: ColumnElement[Any] = clock_now(clock)
        self._item_writes: dict[tuple[bool, bool], Update] = {}
        self._lease_rewrites: dict[tuple[int, bool], Update] = {}

    def now_plus(self, seconds: float | ColumnElement[Any]) -> ColumnElement[Any]:
        """The clock's time plus ``seconds`` (a number, or an SQL expression)."""
        return time_plus(self.now, seconds)

    def items_ready(self, limit: int | ColumnElement[Any]) -> Select[Any]:
        """Available items at a gate whose retry time has passed, ``(id, version, gate,
        data, attempts)``, with bind parameters ``pid`` and ``gate``.

        Ordered by (retry time, id), which the index on (partition, status,
        gate, retry_at, id) returns in order: the read stops at ``limit`` rows
        and never touches completed items. ``limit`` is a number or a bind
        parameter, as the driver chooses.
        """
        i = self.tables.items
        return (
            select(i.c.id, i.c.version, i.c.gate, i.c.data, i.c.attempts)
            .where(i.c.partition_id == bindparam("pid", type_=i.c.partition_id.type),
                   i.c.status == AVAILABLE, i.c.gate == bindparam("gate", type_=Integer()),
                   i.c.retry_at <= self.now)
            .order_by(i.c.retry_at, i.c.id).limit(limit)
        )

    def lease_fence(self, partition_id: ColumnElement[Any], owner: ColumnElement[Any]
                    ) -> Exists:
        """True while ``owner`` holds a live lease on the partition ``partition_id``."""
        p = self.tables.partitions
        return exists().where(p.c.id == partition_id, p.c.owner == owner,
                              p.c.status == AVAILABLE, p.c.until > self.now)

    def item_guard(self, partition_id: ColumnElement[Any], item_id: ColumnElement[Any],
                   seen: ColumnElement[Any], owner: ColumnElement[Any]
                   ) -> tuple[ColumnElement[Any], ...]:
        """The WHERE of a result write: the item's key, the version read, and the lease fence.

        It names the primary key and the version, and on purpose not the
        status: with ``status = 'available'`` in it, a planner without
        statistics (a freshly filled table) may pick the ready-items index,
        whose (partition_id, status) prefix matches as many columns as the
        key, and then visit every available item of the partition per write.
        The version implies the status (every item write bumps it).
        """
        i = self.tables.items
        return (i.c.partition_id == partition_id, i.c.id == item_id, i.c.version == seen,
                self.lease_fence(partition_id, owner))

    def item_write(self, *, new_data: bool, delayed: bool) -> Update:
        """One guarded, fenced result write (built once per shape); its parameters
        come from :meth:`item_write_params`."""
        key = (new_data, delayed)
        found = self._item_writes.get(key)
        if found is None:
            i = self.tables.items
            guard = self.item_guard(bindparam("pid"), bindparam("iid"), bindparam("seen"),
                                    bindparam("owner"))
            values: dict[str, Any] = {
                "version": i.c.version + 1, "status": bindparam("new_status"),
                "gate": func.coalesce(bindparam("new_gate", type_=Integer()), i.c.gate),
                "attempts": bindparam("new_attempts"),
                "last_error": bindparam("new_error"), "updated_at": self.now,
                "retry_at": (self.now_plus(bindparam("delay", type_=Float())) if delayed
                             else self.now),
            }
            if new_data:
                values["data"] = bindparam("new_data")
            found = self._item_writes[key] = update(i).where(*guard).values(**values)
        return found

    @staticmethod
    def item_write_params(write: ItemWrite, owner: str) -> dict[str, Any]:
        """The parameters of :meth:`item_write` for ``write`` by ``owner``."""
        params: dict[str, Any] = {
            "pid": write.partition_id, "iid": write.item_id, "seen": write.seen_version,
            "owner": owner, "new_status": write.status, "new_gate": write.gate,
            "new_attempts": write.attempts, "new_error": write.last_error,
        }
        if write.data is not None:
            params["new_data"] = write.data
        if write.retry_delay:
            params["delay"] = write.retry_delay
        return params

    def lease_rewrite(self, rows: int, *, release: bool) -> Update:
        """One guarded renewal (or, with ``release``, release) of ``rows`` leases
        (built once per shape); its parameters come from :meth:`lease_rewrite_params`.

        Each row's guard is its id (``pid<n>``) and the version read
        (``seen<n>``); every row must be ``holder``'s and ``available``. A renewal's
        ``until`` is the clock's time plus ``duration``; a release's, the time itself.
        """
        key = (rows, release)
        found = self._lease_rewrites.get(key)
        if found is None:
            p = self.tables.partitions
            values: dict[str, Any] = {"version": p.c.version + 1, "updated_at": self.now}
            if release:
                values.update(owner="", until=self.now)
            else:
                values["until"] = self.now_plus(bindparam("duration", type_=Float()))
            guards = [and_(p.c.id == bindparam(f"pid{n}"), p.c.version == bindparam(f"seen{n}"))
                      for n in range(rows)]
            found = self._lease_rewrites[key] = (
                update(p).where(or_(*guards), p.c.owner == bindparam("holder"),
                                p.c.status == AVAILABLE)
                .values(**values))
        return found

    @staticmethod
    def lease_rewrite_shape(leases: int) -> int:
        """The rows of the :meth:`lease_rewrite` that carries ``leases`` leases: the
        next power of two, so a few statement shapes serve every count."""
        return 1 << max(leases - 1, 0).bit_length()

    @staticmethod
    def lease_rewrite_params(leases: Sequence[tuple[str, int]], rows: int, owner: str,
                             duration: float | None) -> dict[str, Any]:
        """The parameters of a :meth:`lease_rewrite` of ``rows`` rows for ``leases``
        (partition id, version read), the last repeated to fill the rows."""
        params: dict[str, Any] = {"holder": owner}
        if duration is not None:
            params["duration"] = duration
        for n in range(rows):
            pid, seen = leases[min(n, len(leases) - 1)]
            params[f"pid{n}"] = pid
            params[f"seen{n}"] = seen
        return params

    @functools.cached_property
    def gate_summary(self) -> Select[Any]:
        """Pending count, earliest retry, failed count and next gate of a gate, and
        the clock's time; bind parameters ``pid`` and ``gate``."""
        i = self.tables.items
        partition = i.c.partition_id == bindparam("pid", type_=i.c.partition_id.type)
        here = and_(partition, i.c.gate == bindparam("gate", type_=Integer()))
        available = i.c.status == AVAILABLE
        return select(
            select(func.count()).where(here, available).scalar_subquery(),
            select(func.min(i.c.retry_at)).where(here, available).scalar_subquery(),
            select(func.count()).where(here, i.c.status == FAILED).scalar_subquery(),
            select(func.min(i.c.gate)).where(
                partition, available, i.c.gate > bindparam("gate", type_=Integer())
            ).scalar_subquery(),
            self.now,
        )


class Store:
    """All reads and writes of the ``partitions`` and ``items`` tables.

    ``clock`` is where statements take the time from: the database's own
    (:class:`~watcher.clock.DatabaseClock`, the default) or a test's
    :class:`~watcher.clock.FixedClock`. The per-database driver is chosen
    here, once, from the engine's dialect.

    Raises:
        ConfigError: statefeed has no driver for the engine's database.
    """

    def __init__(self, engine: AsyncEngine, tables: Tables, *, clock: Clock | None = None,
                 db_timeout: float = DEFAULT_DB_TIMEOUT):
        self.engine = engine
        self.tables = tables
        self.clock: Clock = clock if clock is not None else DatabaseClock()
        self.statements = Statements(tables, self.clock)
        self.driver: Driver = open_driver(engine, self.statements, timeout=db_timeout)
        # Every round trip below goes through it: bounded, and its timeouts remembered.
        self.round_trips = RoundTrips(timeout=db_timeout, bound=self.driver.round_trip_bound(),
                                      timed_out=self.driver.timed_out,
                                      database=render_redacted(engine.url),
                                      precheck=self.driver.require_usable)
        self.round_trips.watch(engine)

    @classmethod
    def open(cls, url: str | DatabaseURL, table_prefix: str = "", *,
             clock: Clock | None = None, db_timeout: float = DEFAULT_DB_TIMEOUT) -> Store:
        """Create a store with its own engine; ``db_timeout`` bounds each database
        round trip (seconds, see :mod:`watcher.round_trips`).

        Raises:
            ConfigError: the URL, the table prefix or the timeout is invalid, or
                the database is not supported.
        """
        check_seconds("database timeout", db_timeout)
        parsed = url if isinstance(url, DatabaseURL) else parse_database_url(url)
        return cls(create_engine(parsed, timeout=db_timeout), tables_for(table_prefix),
                   clock=clock, db_timeout=db_timeout)

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

    # -- notifications ------------------------------------------------------

    @property
    def notifies(self) -> bool:
        """Whether this database carries wake-up notifications (PostgreSQL only)."""
        return self.driver.notifies

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

    # -- client: partitions and items --------------------------------------

    async def partition_create(self, partition_id: str, items: Sequence[NewItem],
                               settings: PartitionSettings = NO_SETTINGS) -> None:
        """Insert a partition (with its reduce gates and failure policy) and its items
        in one transaction.

        Raises:
            PartitionExistsError: a partition with this id exists.
        """
        p = self.tables.partitions
        first_gate = min((item.gate for item in items), default=0)
        try:
            async with self._write() as conn:
                found = await conn.execute(select(p.c.id).where(p.c.id == partition_id))
                if found.first() is not None:
                    raise PartitionExistsError(partition_id)
                now = self.statements.now
                policy = (ItemFailurePolicy.CONTINUE if settings.continue_on_failure
                          else ItemFailurePolicy.FAIL)
                await conn.execute(insert(p).values(
                    id=partition_id, version=1, gate=first_gate, status=AVAILABLE, owner="",
                    until=now, created_at=now, updated_at=now,
                    reduce_gates=encode_reduce_gates(settings.reduce_gates),
                    on_item_failure=policy.value,
                ))
                await self._items_insert(conn, partition_id, items)
                await self._notify(conn, partition_id)
        except IntegrityError:
            if await self.partition_get(partition_id) is not None:
                raise PartitionExistsError(partition_id) from None
            # No such partition: two item ids the database compares as equal (MariaDB
            # and MySQL ignore trailing spaces, SQL Server too).
            raise DuplicateItemError(partition_id, _colliding_ids(items),
                                     stored=False) from None

    async def items_add(self, partition_id: str, items: Sequence[NewItem]) -> bool:
        """Add items to a partition, re-opening it if it was complete.

        The partition row is written first: that locks it, so a concurrent
        engine write on it conflicts (and re-reads) instead of closing the
        partition over the new items. Returns whether the partition was re-opened.
        A failed or cancelled partition stays as it is (``retry_failed`` re-opens it).

        Raises:
            PartitionNotFoundError: no partition has this id (or it is being deleted).
            GateError: an item's gate is below the partition's current gate.
            DuplicateItemError: an item id is already stored in the partition.
        """
        p, i = self.tables.partitions, self.tables.items
        async with self._write() as conn:
            await self._touch_partition(conn, partition_id)
            row = (await conn.execute(
                select(p.c.gate, p.c.status, p.c.reduce_gates)
                .where(p.c.id == partition_id))).one()
            low = min(items, key=lambda item: item.gate)
            if low.gate < row.gate:
                raise GateError(
                    f"item {low.id!r} has gate {low.gate} but partition {partition_id!r} is "
                    f"already at gate {row.gate}; add items at gate {row.gate} or later"
                )
            reducing = settings_of(row.reduce_gates, None).reduce_gates
            if low.gate == row.gate and row.gate in reducing:
                raise GateError(
                    f"item {low.id!r} has gate {low.gate}, the reduce gate partition "
                    f"{partition_id!r} has reached: its reduce sees a fixed set of items; add "
                    f"items at gate {row.gate + 1} or later"
                )
            ids = [item.id for item in items]
            stored: list[str] = []
            for chunk in _chunks(ids, IN_CHUNK):
                stored += (await conn.execute(select(i.c.id).where(
                    i.c.partition_id == partition_id, i.c.id.in_(chunk)))).scalars().all()
            if stored:
                raise DuplicateItemError(partition_id, sorted(stored), stored=True)
            try:
                await self._items_insert(conn, partition_id, items)
            except IntegrityError:
                raise DuplicateItemError(partition_id, ids, stored=True) from None
            await self._notify(conn, partition_id)
            return await self._reopen_if_holding(conn, partition_id)

    async def _items_insert(self, conn: AsyncConnection, partition_id: str,
                            items: Sequence[NewItem]) -> None:
        if not items:
            return
        now = (await conn.execute(select(self.statements.now))).scalar_one()
        statement = insert(self.tables.items)
        for chunk in _chunks(items, INSERT_CHUNK):
            await conn.execute(statement, [
                {
                    "partition_id": partition_id, "id": item.id, "version": 1,
                    "gate": item.gate, "status": AVAILABLE, "data": item.data, "attempts": 0,
                    "last_error": None, "retry_at": now, "created_at": now, "updated_at": now,
                }
                for item in chunk
            ])

    async def partition_get(self, partition_id: str) -> PartitionInfo | None:
        """Read one partition with its item counts per status, or ``None``."""
        infos = await self._partitions_read(ids=[partition_id])
        return infos[0] if infos else None

    async def partitions_list(self, status: str | None = None,
                              limit: int = 1000) -> list[PartitionInfo]:
        """Read partitions (newest first), optionally of one status, with item counts."""
        return await self._partitions_read(status=status, limit=limit)

    async def partitions_page(self, *, status: str | None = None, after: str | None = None,
                              limit: int = 1000, prefix: str | None = None,
                              with_counts: bool = True) -> Page[PartitionInfo]:
        """Read one page of partitions, newest first, optionally of one status and only
        those whose id starts with ``prefix``.

        The order is (created_at, id), both descending, and neither ever changes,
        so the pages stay stable while partitions change status: pass the page's
        ``next_cursor`` as ``after`` to read the next. The index on
        (created_at, id) returns them in order, so a page costs its own rows
        (with ``prefix``, also the rows it passes over). The prefix compares
        exactly, case included, on every database. With ``with_counts`` false
        the item counts are not read (``counts`` is empty).

        Raises:
            InvalidInputError: ``after`` is not a cursor of this listing.
        """
        seek = None if after is None else decode_partition_cursor(after)
        async with self._read() as conn:
            rows = await self._partitions_rows(conn, status=status, limit=limit + 1,
                                               prefix=prefix, after=seek)
            more = len(rows) > limit
            del rows[limit:]
            cursor = encode_partition_cursor(rows[-1]) if more else None
            if prefix:
                # LIKE ignores case on SQLite: keep the exact matches only (the cursor
                # still follows the last row read, so no page repeats or skips one).
                rows = [row for row in rows if row.id.startswith(prefix)]
            counts = (await self._counts(conn, rows) if with_counts
                      else {row.id: {} for row in rows})
        return Page([_partition_info(row, counts[row.id]) for row in rows], cursor)

    async def _partitions_read(self, *, ids: list[str] | None = None, status: str | None = None,
                               limit: int = 1000, after: tuple[datetime, str] | None = None
                               ) -> list[PartitionInfo]:
        async with self._read() as conn:
            rows = await self._partitions_rows(conn, ids=ids, status=status, limit=limit,
                                               after=after)
            counts = await self._counts(conn, rows)
        return [_partition_info(row, counts[row.id]) for row in rows]

    async def _partitions_rows(self, conn: AsyncConnection, *, ids: list[str] | None = None,
                               status: str | None = None, limit: int = 1000,
                               after: tuple[datetime, str] | None = None,
                               prefix: str | None = None) -> list[Any]:
        p = self.tables.partitions
        query = select(p)
        if ids is not None:
            query = query.where(p.c.id.in_(ids))
        if status is not None:
            query = query.where(p.c.status == status)
        if prefix:
            query = query.where(p.c.id.like(_like_prefix(prefix), escape=LIKE_ESCAPE))
        if after is not None:
            created, last_id = after
            query = query.where(or_(p.c.created_at < created,
                                    and_(p.c.created_at == created, p.c.id < last_id)))
        query = query.order_by(p.c.created_at.desc(), p.c.id.desc()).limit(limit)
        return list((await conn.execute(query)).all())

    async def _counts(self, conn: AsyncConnection, rows: Sequence[Any]
                      ) -> dict[str, dict[str, int]]:
        """Item counts per status of the partitions ``rows``, read through the ready index."""
        i = self.tables.items
        counts: dict[str, dict[str, int]] = {row.id: {} for row in rows}
        for chunk in _chunks(list(counts), IN_CHUNK):
            grouped = await conn.execute(
                select(i.c.partition_id, i.c.status, func.count())
                .where(i.c.partition_id.in_(chunk))
                .group_by(i.c.partition_id, i.c.status)
            )
            for partition_id, item_status, count in grouped:
                counts[partition_id][item_status] = count
        return counts

    async def items_gate_counts(self, partition_ids: Sequence[str]
                                ) -> dict[str, dict[int, dict[str, int]]]:
        """Count the items of each partition in ``partition_ids`` per gate and status:
        ``{partition: {gate: {status: count}}}`` (a partition without items maps to
        ``{}``; an unknown id is left out).

        One grouped read per 500 ids through the ready index, whose (partition,
        status, gate) prefix covers it: it costs the items of the partitions asked
        for, and nothing of the others. Callers pass one page of partitions.
        """
        p, i = self.tables.partitions, self.tables.items
        counts: dict[str, dict[int, dict[str, int]]] = {}
        async with self._read() as conn:
            for chunk in _chunks(list(dict.fromkeys(partition_ids)), IN_CHUNK):
                found = await conn.execute(select(p.c.id).where(p.c.id.in_(chunk)))
                counts.update((row[0], {}) for row in found)
                grouped = await conn.execute(
                    select(i.c.partition_id, i.c.gate, i.c.status, func.count())
                    .where(i.c.partition_id.in_(chunk))
                    .group_by(i.c.partition_id, i.c.gate, i.c.status))
                for partition_id, gate, item_status, count in grouped:
                    if partition_id in counts:
                        counts[partition_id].setdefault(gate, {})[item_status] = count
        return counts

    async def items_list(self, partition_id: str) -> list[ItemInfo]:
        """Read every item of a partition, ordered by id.

        Raises:
            PartitionNotFoundError: no partition has this id.
        """
        i = self.tables.items
        async with self._read() as conn:
            await self._require_partition(conn, partition_id)
            rows = (await conn.execute(
                select(i).where(i.c.partition_id == partition_id).order_by(i.c.id))).all()
        return [
            ItemInfo(
                partition_id=row.partition_id, id=row.id, status=row.status, gate=row.gate,
                data=bytes(row.data), attempts=row.attempts, last_error=row.last_error,
                version=row.version, retry_at=row.retry_at,
            )
            for row in rows
        ]

    async def items_page(self, partition_id: str, *, status: str | None = None,
                         gate: int | None = None, after: str | None = None,
                         limit: int = 1000, with_data: bool = True) -> Page[ItemInfo]:
        """Read one page of a partition's items in id order, optionally of one status
        and one gate.

        The page starts after the item id ``after`` and walks the partition's
        primary key, so a page costs its own rows plus those a status or gate
        filter passes over (the database may find a rare status, such as a big
        partition's failed items, through the ready index instead). Ids never
        change, so the pages are stable while items change status: an item is
        never read twice, and one whose status does not change is never missed. The page's
        ``next_cursor`` is its last item id, or ``None`` on the last page.
        With ``with_data`` false the items' bytes are not read (``data`` is ``b""``).

        Raises:
            PartitionNotFoundError: no partition has this id.
        """
        i = self.tables.items
        columns = [i.c.partition_id, i.c.id, i.c.status, i.c.gate, i.c.attempts,
                   i.c.last_error, i.c.version, i.c.retry_at]
        if with_data:
            columns.append(i.c.data)
        query = select(*columns).where(i.c.partition_id == partition_id)
        if status is not None:
            query = query.where(i.c.status == status)
        if gate is not None:
            query = query.where(i.c.gate == gate)
        if after is not None:
            query = query.where(i.c.id > after)
        async with self._read() as conn:
            await self._require_partition(conn, partition_id)
            rows = (await conn.execute(query.order_by(i.c.id).limit(limit + 1))).all()
        more = len(rows) > limit
        infos = [
            ItemInfo(
                partition_id=row.partition_id, id=row.id, status=row.status, gate=row.gate,
                data=bytes(row.data) if with_data else b"", attempts=row.attempts,
                last_error=row.last_error, version=row.version, retry_at=row.retry_at,
            )
            for row in rows[:limit]
        ]
        return Page(infos, infos[-1].id if more else None)

    async def items_retry_failed(self, partition_id: str) -> RetryReport:
        """Run a partition's failed items again, re-opening the partition if it stopped.

        A stopped partition (complete, failed or cancelled) re-opens at the
        lowest gate that holds a failed or available item: every failed item
        goes back to available at the gate where it failed, attempts reset.
        When that moves the gate back, each reduce gate the partition finished
        on the way (from the new gate up to where it stopped) runs again: the
        items it completed there go back to available at that gate, so the
        reduce sees them with the retried ones, and the stored reduce progress
        is dropped. A failed reduce whose gate does not move resumes from its
        stored page. A complete partition with nothing failed stays as it is.

        A running partition keeps its gate (its holder dispatches there): its
        failed items at or after the gate go back to available, and those below
        stay failed (counted in the report). Returns a :class:`RetryReport`.

        Raises:
            PartitionNotFoundError: no partition has this id (or it is being deleted).
        """
        try:
            return await self._retry_failed(partition_id)
        except _NothingToDo as nothing:  # rolled back: a retry that does nothing writes nothing
            assert isinstance(nothing.value, RetryReport)
            return nothing.value

    async def _retry_failed(self, partition_id: str) -> RetryReport:
        p, i = self.tables.partitions, self.tables.items
        now = self.statements.now
        reset = {"version": i.c.version + 1, "status": AVAILABLE, "attempts": 0,
                 "retry_at": now, "updated_at": now}
        mine = i.c.partition_id == partition_id
        async with self._write() as conn:
            await self._touch_partition(conn, partition_id)  # locks the row first
            row = (await conn.execute(
                select(p.c.status, p.c.gate, p.c.reduce_gates, p.c.reduce_attempts,
                       p.c.last_error).where(p.c.id == partition_id))).one()
            values: dict[str, Any] = {"reduce_attempts": 0, "last_error": None}
            rearmed = bool(row.reduce_attempts) or row.last_error is not None
            gate, rerun, left = row.gate, 0, 0
            if row.status == AVAILABLE:
                # Its gate cannot move back under the holder dispatching at it.
                items = await conn.execute(update(i).where(
                    mine, i.c.status == FAILED, i.c.gate >= gate).values(**reset))
                left = (await conn.execute(select(func.count()).where(
                    mine, i.c.status == FAILED, i.c.gate < gate))).scalar_one()
            else:
                lowest_failed, lowest = (await conn.execute(select(
                    select(func.min(i.c.gate)).where(mine, i.c.status == FAILED)
                    .scalar_subquery(),
                    select(func.min(i.c.gate)).where(mine, i.c.status == AVAILABLE)
                    .scalar_subquery()))).one()
                if lowest_failed is None and lowest is None and row.status == COMPLETE:
                    raise _NothingToDo(RetryReport(partition_id, row.status, row.gate,
                                                   row.status, row.gate))
                gate = min(gate, *(low for low in (lowest_failed, lowest) if low is not None))
                items = await conn.execute(update(i).where(
                    mine, i.c.status == FAILED).values(**reset))
                # Only retried items take a reduce back over its gate (an available item
                # left by a version before this fix goes on from where it waits).
                again = [] if lowest_failed is None else reduces_to_run_again(
                    settings_of(row.reduce_gates, None).reduce_gates, row.status,
                    reopen_at=gate, stopped_at=row.gate)
                if again:
                    rerun = (await conn.execute(update(i).where(
                        mine, i.c.status == COMPLETE, i.c.gate.in_(again)
                    ).values(**reset))).rowcount
                if gate != row.gate or again:
                    values.update(reduce_pass=None, reduce_page=0, reduce_after=None,
                                  reduce_acc=None)
                values.update(status=AVAILABLE, gate=gate, updated_at=self.statements.now)
            await conn.execute(update(p).where(p.c.id == partition_id).values(**values))
            await self._notify(conn, partition_id)
            return RetryReport(partition_id, row.status, row.gate, AVAILABLE, gate,
                               items_reset=items.rowcount, items_rerun=rerun,
                               items_left_failed=left, reduce_rearmed=rearmed)

    async def _reopen_if_holding(self, conn: AsyncConnection, partition_id: str) -> bool:
        """Re-open the partition, in ``conn``'s transaction, when it is complete but holds
        an available item; returns whether it did.

        A complete partition must never hold one: nothing dispatches it there, and
        ``wait()`` would call the partition done over it. Every client write that
        puts items at available (added ones) ends with this, holding the
        partition row's lock.
        """
        p, i = self.tables.partitions, self.tables.items
        reopened = await conn.execute(
            update(p).where(p.c.id == partition_id, p.c.status == COMPLETE,
                            exists().where(i.c.partition_id == partition_id,
                                           i.c.status == AVAILABLE))
            .values(status=AVAILABLE, updated_at=self.statements.now))
        return reopened.rowcount == 1

    async def partition_set_gate(self, partition_id: str, gate: int) -> None:
        """Move an open partition's gate forward (a checkpoint, in manual-checkpoint mode
        or not); a move to the gate it is at changes nothing.

        Refused, with nothing written, when the move means nothing or strands
        work: on a partition that is not open (complete, failed or cancelled:
        nothing runs at any gate of it, and ``retry_failed`` re-opens it), below
        its gate, while an item below ``gate`` is still available (nothing
        dispatches below a partition's gate, so the item would be stranded and
        the partition could close over it; so a gate beyond every available item
        is refused too), and when no item of it is available (nothing would ever
        run at the new gate). Leaving a gate drops the reduce progress stored for
        it. The partition row is written first, which locks it: a processor's
        concurrent write on it conflicts and re-reads.

        Raises:
            PartitionNotFoundError: no partition has this id (or it is being deleted).
            GateError: the partition is not open, ``gate`` is below its current
                gate, items below ``gate`` are still available, or no item of
                it is available.
        """
        try:
            await self._set_gate(partition_id, gate)
        except _NothingToDo:
            pass  # rolled back: a move to the gate it is at writes nothing

    async def _set_gate(self, partition_id: str, gate: int) -> None:
        p, i = self.tables.partitions, self.tables.items
        async with self._write() as conn:
            await self._touch_partition(conn, partition_id)
            status, current = (await conn.execute(
                select(p.c.status, p.c.gate).where(p.c.id == partition_id))).one()
            if status != AVAILABLE:
                raise GateError(
                    f"cannot move partition {partition_id!r} to gate {gate}: it is {status} "
                    f"(at gate {current}), and only an open partition's gate moves; "
                    + ("processor retry (retry_failed) re-opens it"
                       if status != COMPLETE else "add items to re-open it"))
            if gate < current:
                raise GateError(
                    f"cannot move partition {partition_id!r} back from gate {current} to gate "
                    f"{gate}; a checkpoint only moves forward")
            if gate == current:
                raise _NothingToDo(None)
            waiting = (await conn.execute(
                select(i.c.gate, func.count()).where(
                    i.c.partition_id == partition_id, i.c.status == AVAILABLE, i.c.gate < gate)
                .group_by(i.c.gate).order_by(i.c.gate).limit(1))).first()
            if waiting is not None:
                raise GateError(
                    f"cannot move partition {partition_id!r} to gate {gate}: {waiting[1]} "
                    f"item(s) at gate {waiting[0]} are still available and would be stranded "
                    "below it; wait until they are done or failed, or move them with a handler "
                    "answer")
            if (await conn.execute(select(i.c.id).where(
                    i.c.partition_id == partition_id, i.c.status == AVAILABLE).limit(1))
                    ).first() is None:
                raise GateError(
                    f"cannot move partition {partition_id!r} to gate {gate}: no item of it is "
                    "available, so nothing would ever run there; add items first (at the "
                    "gate you want)")
            await conn.execute(update(p).where(p.c.id == partition_id).values(
                gate=gate, reduce_pass=None, reduce_page=0, reduce_after=None,
                reduce_acc=None, reduce_attempts=0))
            await self._notify(conn, partition_id)

    # -- client: cancel, delete, purge ---------------------------------------

    async def partition_cancel(self, partition_id: str) -> str:
        """Stop a partition for good: an open or failed partition becomes ``cancelled``.

        Its lease ends at once (``until`` becomes now; ``owner`` keeps the
        holder's id, so the holder finds the cancel under its own name, see
        :meth:`leases_stopped`), and every write its holder still makes on it is
        fenced off: result, reduce and gate writes all require an available
        partition. Its items stay as they are; ``retry_failed`` resumes it.
        Returns the status it had: ``available`` or ``failed`` (it is cancelled
        now), or ``complete`` or ``cancelled`` (it is left as it was).

        Raises:
            PartitionNotFoundError: no partition has this id (or it is being deleted).
        """
        p = self.tables.partitions
        now = self.statements.now
        async with self._write() as conn:
            while True:
                seen = (await conn.execute(
                    select(p.c.status).where(p.c.id == partition_id))).scalar_one_or_none()
                if seen is None or seen == DELETING:
                    raise PartitionNotFoundError(partition_id)
                if seen not in (AVAILABLE, FAILED):
                    return str(seen)
                # Guarded on the status read, so the status returned is the one cancelled;
                # a processor closing the partition meanwhile makes it read again.
                touched = await conn.execute(
                    update(p).where(p.c.id == partition_id, p.c.status == seen)
                    .values(status=CANCELLED, until=now, version=p.c.version + 1,
                            updated_at=now))
                if touched.rowcount == 1:
                    await self._fence_off_items_in_flight(conn, partition_id)
                    return str(seen)

    async def _fence_off_items_in_flight(self, conn: AsyncConnection,
                                         partition_id: str) -> None:
        """Bump the versions of the partition's items that may be in flight (the
        available ones at its current gate), in the stopping transaction.

        A result write checks the lease fence against the snapshot it started
        with, so one already running when the stop commits would still pass it;
        its item-version guard is checked again on the row it waited for, and a
        bumped version makes it miss: nothing of the partition is written after
        the stop returns. The attempts move with the version, so the idempotency
        key of each item's step stays the same when the partition is resumed (the
        attempt a stop interrupts counts as one).
        """
        p, i = self.tables.partitions, self.tables.items
        gate = select(p.c.gate).where(p.c.id == partition_id).scalar_subquery()
        await conn.execute(
            update(i).where(i.c.partition_id == partition_id, i.c.status == AVAILABLE,
                            i.c.gate == gate)
            .values(version=i.c.version + 1, attempts=i.c.attempts + 1))

    async def partition_delete_begin(self, partition_id: str, *, force: bool = False) -> None:
        """Mark a partition ``deleting``, so that nothing dispatches, re-opens or adds to
        it while :meth:`partition_delete_batch` removes it.

        Refused while a processor holds a live lease on it, unless ``force``:
        then the mark ends the lease as a cancel does (the holder's late writes
        are fenced off and it drops the partition). A partition already being
        deleted stays so (the delete resumes).

        Raises:
            PartitionNotFoundError: no partition has this id.
            PartitionLeasedError: a processor holds a live lease on it (without ``force``).
        """
        p = self.tables.partitions
        now = self.statements.now
        statement = update(p).where(p.c.id == partition_id)
        if not force:
            statement = statement.where(
                ~and_(p.c.status == AVAILABLE, p.c.owner != "", p.c.until > now))
        async with self._write() as conn:
            touched = await conn.execute(statement.values(
                status=DELETING, until=now, version=p.c.version + 1, updated_at=now))
            if touched.rowcount == 1:
                return
            owner = (await conn.execute(
                select(p.c.owner).where(p.c.id == partition_id))).scalar_one_or_none()
        if owner is None:
            raise PartitionNotFoundError(partition_id)
        raise PartitionLeasedError(partition_id, owner)

    def _purgeable(self, older_than: float | None, statuses: Collection[str]
                   ) -> ColumnElement[bool]:
        """Partitions being deleted, or (with ``statuses``) in one of ``statuses`` and
        last updated more than ``older_than`` seconds ago by the store's clock."""
        p = self.tables.partitions
        wanted: ColumnElement[bool] = p.c.status == DELETING
        if statuses:
            cutoff = self.statements.now_plus(-(older_than or 0.0))
            wanted = or_(wanted, and_(p.c.status.in_(list(statuses)), p.c.updated_at < cutoff))
        return wanted

    async def partition_delete_batch(self, partition_id: str, batch: int, *,
                                     statuses: Collection[str] = (),
                                     older_than: float | None = None) -> DeleteBatch:
        """Delete up to ``batch`` items of a partition being deleted, in id order, and the
        partition row with the last of them, in one transaction.

        The partition qualifies when it is ``deleting`` or, with ``statuses``,
        when it is in one of them and was last updated more than
        ``older_than`` seconds ago; such a partition is marked ``deleting``
        here, in the same transaction, so nothing re-opens it between batches.
        Writing the partition row first locks it: a client adding items waits,
        then finds it gone or being deleted. Each batch is one range read of
        the primary key and one range delete, so no transaction grows with the
        partition. A partition that no longer qualifies is skipped, unwritten.
        """
        p, i = self.tables.partitions, self.tables.items
        async with self._write() as conn:
            marked = await conn.execute(
                update(p).where(p.c.id == partition_id, self._purgeable(older_than, statuses))
                .values(status=DELETING, version=p.c.version + 1))
            if marked.rowcount != 1:
                return DeleteBatch(0, done=False, skipped=True)
            page = (select(i.c.id).where(i.c.partition_id == partition_id)
                    .order_by(i.c.id).limit(batch).subquery())
            count, last = (await conn.execute(
                select(func.count(), func.max(page.c.id)))).one()
            if count:
                await conn.execute(
                    delete(i).where(i.c.partition_id == partition_id, i.c.id <= last))
            if count >= batch:
                return DeleteBatch(count, done=False)
            await conn.execute(delete(p).where(p.c.id == partition_id))
            return DeleteBatch(count, done=True)

    async def partitions_purgeable(self, *, older_than: float, statuses: Collection[str],
                                   limit: int) -> list[str]:
        """Up to ``limit`` ids of partitions a purge removes: those being deleted, and those
        in ``statuses`` last updated more than ``older_than`` seconds ago by the store's
        clock (the index on (status, updated_at) finds them)."""
        p = self.tables.partitions
        async with self._read() as conn:
            rows = await conn.execute(
                select(p.c.id).where(self._purgeable(older_than, statuses)).limit(limit))
            return [row[0] for row in rows]

    async def partitions_purgeable_count(self, *, older_than: float,
                                         statuses: Collection[str]) -> tuple[int, int]:
        """How many partitions, and items of theirs, a purge would remove now."""
        p, i = self.tables.partitions, self.tables.items
        wanted = select(p.c.id).where(self._purgeable(older_than, statuses))
        async with self._read() as conn:
            partitions = (await conn.execute(
                select(func.count()).select_from(wanted.subquery()))).scalar_one()
            items = (await conn.execute(
                select(func.count()).where(i.c.partition_id.in_(wanted)))).scalar_one()
        return partitions, items

    async def partitions_open_page(self, *, after: str | None, limit: int) -> list[str]:
        """Up to ``limit`` ids of open (``available``) partitions after the id ``after``,
        by id: the partitions whose finished items item retention looks at."""
        p = self.tables.partitions
        query = select(p.c.id).where(p.c.status == AVAILABLE)
        if after is not None:
            query = query.where(p.c.id > after)
        async with self._read() as conn:
            return list((await conn.execute(query.order_by(p.c.id).limit(limit))).scalars())

    async def items_purge_finished(self, partition_id: str, *, older_than: float,
                                   batch: int, after: str | None = None
                                   ) -> tuple[int, str | None]:
        """Delete up to ``batch`` (about) complete items of the open partition
        ``partition_id`` last updated more than ``older_than`` seconds ago by the
        store's clock, the next in id order after ``after``, in one transaction.

        Returns how many went and the id to pass as ``after`` for the next batch
        (``None``: nothing more to delete). The walk follows the primary key, so
        the items kept are not read again batch after batch.

        Only ``complete`` items go: a reduce reads the available items at its
        gate and, under ``on_item_failure=continue``, the failed ones, never a
        complete one, so no reduce's view changes; failed items stay for
        ``retry_failed``. While the partition stands at a reduce gate, the items
        at that gate stay until it has passed. A partition that is not open is
        left alone (partition retention removes finished ones whole).

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed (nothing of this batch went).
        """
        p, i = self.tables.partitions, self.tables.items
        async with self._write() as conn:
            row = (await conn.execute(
                select(p.c.gate, p.c.reduce_gates)
                .where(p.c.id == partition_id, p.c.status == AVAILABLE))).first()
            if row is None:
                return 0, None
            wanted = [i.c.partition_id == partition_id, i.c.status == COMPLETE,
                      i.c.updated_at < self.statements.now_plus(-older_than)]
            if after is not None:
                wanted.append(i.c.id > after)
            if row.gate in settings_of(row.reduce_gates, None).reduce_gates:
                wanted.append(i.c.gate != row.gate)
            page = select(i.c.id).where(*wanted).order_by(i.c.id).limit(batch).subquery()
            count, last = (await conn.execute(
                select(func.count(), func.max(page.c.id)))).one()
            if not count:
                return 0, None
            removed = await conn.execute(delete(i).where(*wanted, i.c.id <= last))
            return int(removed.rowcount), (last if count >= batch else None)

    # -- leaders: duties one processor at a time performs ---------------------

    async def leader_take(self, name: str, owner: str, duration: float) -> bool:
        """Take or extend the lease on duty ``name`` (such as ``"retention"``) for ``owner``.

        It succeeds when ``owner`` holds it already or its lease has expired by
        the store's clock, so of processors trying at once exactly one wins.
        Returns whether ``owner`` holds it now, for ``duration`` seconds.
        """
        leaders = self.tables.leaders
        now = self.statements.now
        until = self.statements.now_plus(duration)
        async with self._write() as conn:
            taken = await conn.execute(
                update(leaders)
                .where(leaders.c.name == name,
                       or_(leaders.c.owner == owner, leaders.c.until <= now))
                .values(owner=owner, until=until, version=leaders.c.version + 1, updated_at=now))
            if taken.rowcount == 1:
                return True
            found = await conn.execute(select(leaders.c.name).where(leaders.c.name == name))
            if found.first() is not None:
                return False
        try:  # the duty's first holder makes its row
            async with self._write() as conn:
                await conn.execute(insert(leaders).values(
                    name=name, owner=owner, until=until, version=1, updated_at=now))
        except IntegrityError:
            return False  # another processor made it first, and holds it
        return True

    async def leader_release(self, name: str, owner: str) -> bool:
        """Give up ``owner``'s lease on duty ``name`` so another processor takes it at once.

        Returns whether ``owner`` held it.
        """
        leaders = self.tables.leaders
        now = self.statements.now
        async with self._write() as conn:
            released = await conn.execute(
                update(leaders).where(leaders.c.name == name, leaders.c.owner == owner)
                .values(owner="", until=now, version=leaders.c.version + 1, updated_at=now))
        return released.rowcount == 1

    # -- backlog ---------------------------------------------------------------

    async def backlog_read(self, cap: int) -> Backlog:
        """Count partitions per status, and available items at their open partition's
        current gate, each count stopping at ``cap``.

        One statement of bounded reads: the status counts read the index on
        (status, updated_at), the items the ready index of each open partition
        at its gate; a count stops at ``cap`` rows whatever the tables hold.
        """
        p, i = self.tables.partitions, self.tables.items

        def capped(query: Select[Any]) -> ColumnElement[Any]:
            return (select(func.count()).select_from(query.limit(cap).subquery())
                    .scalar_subquery())

        statuses = [status.value for status in Status]
        counts = [capped(select(p.c.id).where(p.c.status == status)) for status in statuses]
        waiting = capped(
            select(i.c.id)
            .join(p, and_(p.c.id == i.c.partition_id, p.c.gate == i.c.gate))
            .where(p.c.status == AVAILABLE, i.c.status == AVAILABLE))
        async with self._read() as conn:
            row = (await conn.execute(select(*counts, waiting))).one()
        return Backlog(partitions=dict(zip(statuses, row[:-1], strict=True)),
                       items_waiting=row[-1])

    async def partitions_finished_per_minute(self, minutes: int, cap: int) -> Throughput:
        """Count the partitions that finished (complete, failed or cancelled) in each of
        the last ``minutes`` minutes by the store's clock, each count stopping at ``cap``.

        One statement of bounded reads: each count is a range of the index on
        (status, updated_at), stopped at ``cap`` rows, whatever the tables hold.
        A partition counts in the minute of its last update.
        """
        p = self.tables.partitions
        finished = (COMPLETE, FAILED, CANCELLED)

        def capped(status: str, minute: int) -> ColumnElement[Any]:
            # Minute 0 is the oldest; the last one runs up to now (and past it, should a
            # clock have moved back).
            wanted = select(p.c.id).where(
                p.c.status == status,
                p.c.updated_at >= self.statements.now_plus(-60.0 * (minutes - minute)))
            if minute < minutes - 1:
                wanted = wanted.where(
                    p.c.updated_at < self.statements.now_plus(-60.0 * (minutes - minute - 1)))
            return (select(func.count()).select_from(wanted.limit(cap).subquery())
                    .scalar_subquery())

        columns = [capped(status, minute) for status in finished for minute in range(minutes)]
        async with self._read() as conn:
            row = (await conn.execute(select(*columns))).one()
        return Throughput(minutes=minutes, finished={
            status: tuple(row[n * minutes:(n + 1) * minutes])
            for n, status in enumerate(finished)})

    # -- leases ------------------------------------------------------------

    async def leases_stopped(self, owner: str, within: float) -> list[str]:
        """Partitions that clients cancelled, or began deleting, while ``owner`` held them,
        in the last ``within`` seconds.

        Cancelling or deleting a partition keeps its owner and sets ``until``
        to the moment it happened, so this is one read of the lease index
        (status, until, owner): a holder drops such partitions within a poll,
        without waiting for its next renewal to find them lost.
        """
        p = self.tables.partitions
        async with self._read() as conn:
            rows = await conn.execute(
                select(p.c.id).where(p.c.status.in_((CANCELLED, DELETING)), p.c.owner == owner,
                                     p.c.until >= self.statements.now_plus(-within)))
            return [row[0] for row in rows]

    async def leases_read_free(self, limit: int) -> list[LeaseRow]:
        """Read up to ``limit`` available partitions that are unleased or expired."""
        p = self.tables.partitions
        query = (
            self._lease_columns()
            .where(p.c.status == AVAILABLE, p.c.until <= self.statements.now)
            .order_by(p.c.until).limit(limit)
        )
        async with self._read() as conn:
            return [_lease_row(row) for row in await conn.execute(query)]

    def _lease_columns(self) -> Select[Any]:
        p = self.tables.partitions
        return select(p.c.id, p.c.version, p.c.gate, p.c.owner, p.c.reduce_gates,
                      p.c.on_item_failure)

    async def leases_of_owner(self, owner: str, limit: int) -> list[LeaseRow]:
        """Read up to ``limit`` partitions that ``owner`` holds with a live lease."""
        p = self.tables.partitions
        query = (
            self._lease_columns()
            .where(p.c.status == AVAILABLE, p.c.owner == owner, p.c.until > self.statements.now)
            .order_by(p.c.until.desc(), p.c.id).limit(limit)
        )
        async with self._read() as conn:
            return [_lease_row(row) for row in await conn.execute(query)]

    async def lease_stats(self) -> LeaseStats:
        """Count active partitions and the live leases of each owner."""
        p = self.tables.partitions
        async with self._read() as conn:
            active = (await conn.execute(
                select(func.count()).where(p.c.status == AVAILABLE))).scalar_one()
            owners = await conn.execute(
                select(p.c.owner, func.count())
                .where(p.c.status == AVAILABLE, p.c.until > self.statements.now, p.c.owner != "")
                .group_by(p.c.owner)
            )
            return LeaseStats(active=active, owners={owner: count for owner, count in owners})

    async def leases_take(self, rows: Sequence[LeaseRow], owner: str,
                          duration: float) -> list[LeaseRow]:
        """Take leases on ``rows`` for ``owner``; each take is guarded by the version read.

        Used for free partitions and for steals alike: if the version still
        matches, nobody renewed or moved the partition since it was read.
        Returns the rows won, with their new versions.
        """
        p = self.tables.partitions
        statement = (
            update(p)
            .where(p.c.id == bindparam("pid"), p.c.version == bindparam("seen"),
                   p.c.status == AVAILABLE)
            .values(version=p.c.version + 1, owner=owner, until=self.statements.now_plus(duration),
                    updated_at=self.statements.now)
        )
        won: list[LeaseRow] = []
        async with self._write() as conn:
            # Rows another session holds locked are passed by, not waited for.
            free = await self._lock_free(conn, [row.id for row in rows])
            for row in sorted(rows, key=lambda row: row.id):  # id order, as everywhere
                if row.id not in free:
                    continue
                result = await conn.execute(statement, {"pid": row.id, "seen": row.version})
                if result.rowcount == 1:
                    won.append(LeaseRow(row.id, row.version + 1, row.gate, owner, row.settings))
        return won

    async def leases_renew(self, leases: dict[str, int], owner: str,
                           duration: float) -> LeaseRenewal:
        """Extend ``owner``'s leases, given as partition id -> version held, for
        ``duration`` seconds.

        One locked read and one UPDATE (per 500 leases) renew them all, the new
        ``until`` by the database clock. A partition ``owner`` still holds whose
        version moved on (a client write bumped it) is renewed at the version
        read, and its gate comes back re-read; one another owner holds now is
        lost. Partitions whose row another session holds locked are not
        waited for: they come back as ``busy``, so one stuck transaction
        cannot stall the renewal of every other lease. Partitions a client
        cancelled or began deleting come back as ``stopped``.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed (nothing was renewed).
        """
        return await self._lease_rewrite(leases, owner, duration=duration)

    async def leases_release(self, leases: dict[str, int], owner: str) -> int:
        """Give up ``owner``'s leases at once, so another watcher can take them.

        Returns the number released.
        """
        renewal = await self._lease_rewrite(leases, owner, duration=None)
        return len(renewal.held)

    async def _lock_free(self, conn: AsyncConnection, ids: Sequence[str]) -> set[str]:
        """Lock the partition rows ``ids`` that no other session holds; return their ids.

        A session stopped inside a transaction (a frozen client, a paused
        processor) keeps its rows locked; lease writes pass them by instead of
        queueing behind them, so only that partition is held up.
        """
        p = self.tables.partitions
        free: set[str] = set()
        for chunk in _chunks(sorted(ids), IN_CHUNK):
            rows = await conn.execute(
                lock_unless_busy(select(p.c.id).where(p.c.id.in_(chunk)), p))
            free.update(row[0] for row in rows)
        return free

    async def _lock_states(self, conn: AsyncConnection, ids: Sequence[str]
                           ) -> dict[str, Any]:
        """Lock the partition rows ``ids`` that no other session holds; return their
        rows (``id``, ``version``, ``gate``, ``status``, ``owner``) by id.

        Like :meth:`_lock_free`, rows locked elsewhere are passed by (absent from
        the answer), and so are partitions that no longer exist.
        """
        p = self.tables.partitions
        states: dict[str, Any] = {}
        for chunk in _chunks(sorted(ids), IN_CHUNK):
            rows = await conn.execute(lock_unless_busy(
                select(p.c.id, p.c.version, p.c.gate, p.c.status, p.c.owner)
                .where(p.c.id.in_(chunk)), p))
            states.update((row.id, row) for row in rows)
        return states

    async def _lease_rewrite(self, leases: dict[str, int], owner: str, *,
                             duration: float | None) -> LeaseRenewal:
        """Renew for ``duration`` (or, given ``None``, release) all of ``leases`` in
        one guarded UPDATE per chunk.

        The rows are read and locked first, so the states read are the states
        the UPDATE meets: a partition ``owner`` still holds, still available, is
        rewritten at the version read (a client write that bumped the version
        is not a lost lease; its gate comes back re-read). Each row's guard is
        its id, that version, ``owner`` and ``available``.
        """
        held: dict[str, tuple[int, int | None]] = {}
        async with self._write() as conn:
            states = await self._lock_states(conn, list(leases))
            ours = sorted((state for state in states.values()
                           if state.owner == owner and state.status == AVAILABLE),
                          key=lambda state: state.id)
            for chunk in _chunks(ours, IN_CHUNK):
                rows = self.statements.lease_rewrite_shape(len(chunk))
                result = await conn.execute(
                    self.statements.lease_rewrite(rows, release=duration is None),
                    self.statements.lease_rewrite_params(
                        [(state.id, state.version) for state in chunk], rows, owner, duration))
                if result.rowcount != len(chunk):
                    # Locked rows cannot change under us; a short count means a
                    # database that does not lock as asked: believe only a re-read.
                    after = await self._states(conn, [state.id for state in chunk])
                    chunk = [state for state in chunk if state.id in after
                             and after[state.id].version == state.version + 1]
                for state in chunk:
                    gate = None if state.version == leases[state.id] else state.gate
                    held[state.id] = (state.version + 1, gate)
        stopped = frozenset(pid for pid, state in states.items()
                            if state.status in (CANCELLED, DELETING))
        # Not in ``states``: locked by another session, or deleted (then never free again).
        return LeaseRenewal(held, frozenset(leases) - states.keys(), stopped)

    async def _states(self, conn: AsyncConnection, ids: Sequence[str]
                      ) -> dict[str, PartitionState]:
        p = self.tables.partitions
        live = case((p.c.until > self.statements.now, True), else_=False)
        states: dict[str, PartitionState] = {}
        for chunk in _chunks(list(ids), IN_CHUNK):
            rows = await conn.execute(
                select(p.c.id, p.c.version, p.c.gate, p.c.status, p.c.owner, live)
                .where(p.c.id.in_(chunk)))
            for row in rows:
                states[row[0]] = PartitionState(row[0], row[1], row[2], row[3], row[4],
                                                bool(row[5]))
        return states

    async def partition_state(self, partition_id: str) -> PartitionState | None:
        """Re-read one partition's version, gate, status, owner and lease liveness."""
        async with self._read() as conn:
            return (await self._states(conn, [partition_id])).get(partition_id)

    async def partition_transition(self, partition_id: str, version: int, owner: str, *,
                                   gate: int | None = None, status: str | None = None
                                   ) -> int | None:
        """Advance a leased partition's gate, or close it as ``complete``/``failed``.

        Guarded by version and owner. Closing also releases the lease. Returns
        the new version, or ``None`` when the write lost (re-read to see why).
        """
        p = self.tables.partitions
        # A gate advance changes no indexed column (a HOT update on PostgreSQL);
        # updated_at, indexed with status, moves with the status alone.
        values: dict[str, Any] = {"version": p.c.version + 1}
        if gate is not None:
            values["gate"] = gate
        if status is not None:
            values.update(status=status, updated_at=self.statements.now)
            if status != AVAILABLE:
                values.update(owner="", until=self.statements.now)
        async with self._write() as conn:
            result = await conn.execute(
                update(p)
                .where(p.c.id == partition_id, p.c.version == version, p.c.owner == owner,
                       p.c.status == AVAILABLE)
                .values(**values)
            )
        return version + 1 if result.rowcount == 1 else None

    # -- items at a gate ----------------------------------------------------

    async def items_ready(self, partition_id: str, gate: int, limit: int,
                          exclude: Collection[str] = ()) -> list[ReadyItem]:
        """Read up to ``limit`` available items at ``gate`` whose retry time has passed.

        ``exclude`` names items the caller already has in hand (in flight), so
        they are not read again. Ordered by (retry time, id), which the index
        on (partition, status, gate, retry_at, id) returns in order: the read
        stops at ``limit`` rows and never touches completed items.
        """
        rows = await self.round_trips.call(
            "items_ready", self.driver.items_ready(partition_id, gate, limit, exclude))
        return [ReadyItem(row[0], row[1], row[2], bytes(row[3]), row[4]) for row in rows]

    async def items_oversize(self, partition_id: str, gate: int, max_bytes: int,
                             limit: int) -> list[ReadyItem]:
        """Read up to ``limit`` ready items at ``gate`` whose data is over ``max_bytes``,
        without their data (``data`` is empty): items too large to read or dispatch,
        inserted around the client's limit. Their sizes are read from the stored
        values' headers, so even a value too large to fetch is found."""
        i = self.tables.items
        size = data_size(i.c.data)
        query = (
            select(i.c.id, i.c.version, i.c.gate, i.c.attempts, size)
            .where(i.c.partition_id == partition_id, i.c.status == AVAILABLE,
                   i.c.gate == gate, i.c.retry_at <= self.statements.now, size > max_bytes)
            .order_by(i.c.retry_at, i.c.id).limit(limit))
        async with self._read() as conn:
            return [ReadyItem(row.id, row.version, row.gate, b"", row.attempts, size=row[4])
                    for row in await conn.execute(query)]

    async def gate_summary(self, partition_id: str, gate: int) -> GateSummary:
        """Summarise what is left at ``gate``: pending and failed items, and the next gate."""
        row = (await self.round_trips.call("gate_summary", self.driver.fetch(
            self.statements.gate_summary, {"pid": partition_id, "gate": gate}, read=True)))[0]
        pending_count, earliest, failed_count, lowest, now = row
        wait = None
        if pending_count and earliest is not None:
            wait = max(0.0, (earliest - now).total_seconds())
        return GateSummary(pending=pending_count, failed=failed_count, next_gate=lowest,
                           seconds_to_next_retry=wait)

    # -- reduce gates -------------------------------------------------------

    async def reduce_state_read(self, partition_id: str) -> ReduceState | None:
        """Read a partition's gate and stored reduce progress, or ``None`` if it is gone."""
        p = self.tables.partitions
        async with self._read() as conn:
            row = (await conn.execute(
                select(p.c.version, p.c.gate, p.c.reduce_pass, p.c.reduce_page,
                       p.c.reduce_after, p.c.reduce_acc, p.c.reduce_attempts)
                .where(p.c.id == partition_id))).first()
        if row is None:
            return None
        accumulator = None if row.reduce_acc is None else bytes(row.reduce_acc)
        return ReduceState(row.version, row.gate, row.reduce_pass, row.reduce_page,
                           row.reduce_after, accumulator, row.reduce_attempts)

    async def reduce_entries(self, partition_id: str, gate: int, *, after: str | None,
                             limit: int, include_failed: bool) -> list[ReduceEntry]:
        """Read up to ``limit`` items of a reduce at ``gate`` after the id ``after``, by id.

        The items are the available ones at ``gate`` and, with
        ``include_failed``, those that failed at ``gate`` or before. The read
        walks the partition's primary key from ``after``, so each page of a
        paged reduce costs one range read.
        """
        i = self.tables.items
        wanted: ColumnElement[Any] = and_(i.c.status == AVAILABLE, i.c.gate == gate)
        if include_failed:
            wanted = or_(wanted, and_(i.c.status == FAILED, i.c.gate <= gate))
        query = select(i.c.id, i.c.version, i.c.gate, i.c.status, i.c.data,
                       i.c.last_error).where(i.c.partition_id == partition_id, wanted)
        if after is not None:
            query = query.where(i.c.id > after)
        async with self._read() as conn:
            rows = await conn.execute(query.order_by(i.c.id).limit(limit))
            return [ReduceEntry(row.id, row.version, row.gate, row.status, bytes(row.data),
                                row.last_error) for row in rows]

    async def reduce_write(self, partition_id: str, version: int, owner: str,
                           step: ReduceStep) -> int | None:
        """Apply one answered reduce step in one transaction: the stored progress, the
        partition result (when the step has one) and the item answers.

        Guarded by the partition's version, owner and live lease, and by each
        item's version: if any guard fails nothing is written. Returns the
        partition's new version, or ``None`` when a guard failed (re-read).

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed or refused a value
                (nothing was written).
            ValueRefusedError: a statement is over MariaDB/MySQL's packet (nothing
                was written).
        """
        p = self.tables.partitions
        values: dict[str, Any] = {  # no indexed column: a HOT update on PostgreSQL
            "version": p.c.version + 1,
            "reduce_pass": step.pass_, "reduce_page": step.page,
            "reduce_after": step.after, "reduce_acc": step.accumulator,
            "reduce_attempts": 0, "last_error": None,
        }
        try:
            async with self._write() as conn:
                touched = await conn.execute(
                    update(p).where(*self._lease_guard(partition_id, version, owner))
                    .values(**values))
                if touched.rowcount != 1:
                    return None
                if step.result is not None:
                    # A statement of its own: with the accumulator, a statement could hold
                    # two values at the item size limit, more than MariaDB's default packet.
                    await conn.execute(update(p).where(p.c.id == partition_id)
                                       .values(result=step.result))
                await self._reduce_items_write(conn, step.writes, owner)
        except _GuardLost:
            return None
        return version + 1

    async def _reduce_items_write(self, conn: AsyncConnection, writes: Sequence[ItemWrite],
                                  owner: str) -> None:
        """Write a reduce page's item answers; raises :class:`_GuardLost` (rolling the
        transaction back) when an item moved since it was read."""
        for chunk in _chunks(writes, INSERT_CHUNK):
            if await self.driver.items_write_in(conn, chunk, owner) != len(chunk):
                raise _GuardLost

    async def reduce_failed(self, partition_id: str, version: int, owner: str, *,
                            attempts: int, error: str, fail: bool) -> int | None:
        """Record a failed reduce call: its count and error; with ``fail``, the
        partition fails (and its lease is released). Guarded like
        :meth:`reduce_write`; returns the new version or ``None``."""
        p = self.tables.partitions
        values: dict[str, Any] = {"version": p.c.version + 1,
                                  "reduce_attempts": attempts, "last_error": error}
        if fail:
            values.update(status=FAILED, owner="", until=self.statements.now,
                          updated_at=self.statements.now)
        async with self._write() as conn:
            touched = await conn.execute(
                update(p).where(*self._lease_guard(partition_id, version, owner))
                .values(**values))
        return version + 1 if touched.rowcount == 1 else None

    def _lease_guard(self, partition_id: str, version: int, owner: str
                     ) -> tuple[ColumnElement[Any], ...]:
        p = self.tables.partitions
        return (p.c.id == partition_id, p.c.version == version, p.c.owner == owner,
                p.c.status == AVAILABLE, p.c.until > self.statements.now)

    async def items_apply(self, writes: Sequence[ItemWrite], owner: str) -> list[bool]:
        """Write attempt outcomes in one transaction; each write guarded and fenced.

        A write counts only if the item still has the version that was read
        (so it is still available: every item write bumps the version) and
        ``owner`` still holds a live lease on its partition
        (:meth:`Statements.item_guard`). Returns, per write, whether it was
        applied. How the batch travels is the driver's choice.
        """
        if not writes:
            return []
        return await self.round_trips.call("items_apply", self.driver.items_apply(writes, owner))


def _colliding_ids(items: Sequence[NewItem]) -> list[str]:
    """The ids of ``items`` that equal another's but for trailing spaces (all of them
    when none does): what a PAD SPACE collation takes for duplicates."""
    groups: dict[str, list[str]] = {}
    for item in items:
        groups.setdefault(item.id.rstrip(" "), []).append(item.id)
    colliding = sorted(one for group in groups.values() if len(group) > 1 for one in group)
    return colliding or sorted(item.id for item in items)


class _NothingToDo(Exception):
    """A client write found nothing to change: roll its transaction (the lock it took
    by touching the partition row) back, and return ``value``."""

    def __init__(self, value: object) -> None:
        super().__init__()
        self.value = value


class _GuardLost(Exception):
    """An item of a reduce step moved since it was read: roll the step back."""


def _lease_row(row: Any) -> LeaseRow:
    return LeaseRow(row.id, row.version, row.gate, row.owner,
                    settings_of(row.reduce_gates, row.on_item_failure))


def _partition_info(row: Any, counts: dict[str, int]) -> PartitionInfo:
    settings = settings_of(row.reduce_gates, row.on_item_failure)
    reducing = row.status == AVAILABLE and row.gate in settings.reduce_gates
    progress = (ReduceProgress(row.reduce_pass, row.reduce_page, row.reduce_attempts)
                if reducing or row.reduce_pass is not None else None)
    return PartitionInfo(
        id=row.id, status=row.status, gate=row.gate, owner=row.owner, until=row.until,
        version=row.version, counts=counts, created_at=row.created_at,
        updated_at=row.updated_at, reduce_gates=tuple(sorted(settings.reduce_gates)),
        on_item_failure=row.on_item_failure,
        result=None if row.result is None else bytes(row.result),
        last_error=row.last_error, reduce=progress,
    )


async def missing_tables(store: Store) -> list[str]:
    """Names of statefeed tables that do not exist yet (empty when migrated).

    Raises the driver's error when the database cannot be reached.
    """
    from sqlalchemy import inspect as inspect_schema

    names = [store.tables.partitions.name, store.tables.items.name, store.tables.leaders.name]
    async with store.round_trips.transaction(store.engine.connect(), "missing_tables") as conn:
        present = await conn.run_sync(
            lambda sync: {name for name in names if inspect_schema(sync).has_table(name)})
    return [name for name in names if name not in present]


def sqlite_file_missing(url: DatabaseURL) -> bool:
    """Whether ``url`` is a SQLite database whose file does not exist.

    Opening one would create an empty file; only ``processor migrate`` (or
    ``processor run --migrate``) should, so the other verbs ask this first.
    """
    import os

    return url.dialect == "sqlite" and not os.path.exists(str(url.sync_url.database))


def not_migrated(url: DatabaseURL, table_prefix: str, missing: Sequence[str]) -> DatabaseError:
    """The error of every verb but ``migrate`` on a database that lacks statefeed's tables
    (``missing``): one line, the same everywhere, saying what to do."""
    where = f" with prefix {table_prefix!r}" if table_prefix else ""
    return DatabaseError(
        f"database {url.redacted()} has no statefeed tables{where} (missing: "
        f"{', '.join(missing)}): run `processor migrate` first")


async def require_migrated(url: DatabaseURL, table_prefix: str = "") -> None:
    """Check that the database at ``url`` has statefeed's tables, without creating
    anything: a SQLite file that does not exist is reported, not made.

    Raises:
        DatabaseError: the tables are missing (:func:`not_migrated`).
        ConfigError: the prefix is invalid, or the database's driver is not installed.
        sqlalchemy.exc.SQLAlchemyError | OSError: the database cannot be reached.
    """
    tables = tables_for(table_prefix)
    if sqlite_file_missing(url):
        raise not_migrated(url, table_prefix,
                           [tables.partitions.name, tables.items.name, tables.leaders.name])
    store = Store.open(url, table_prefix)
    try:
        missing = await missing_tables(store)
    finally:
        await store.close()
    if missing:
        raise not_migrated(url, table_prefix, missing)
