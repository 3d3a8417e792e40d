"""The store seam: every SQL statement statefeed runs lives in this module.

Engine writes are guarded: ``UPDATE ... SET version = version + 1 ... WHERE
<key> AND version = :seen`` and count only when exactly one row changed. Lease
held writes also match the owner. Times come from the database clock
(:mod:`watcher.dialect`) unless a test injects a clock.

Methods are named entity first (``lease_take``, ``items_ready``, ...). Each one
is a single transaction. They raise :class:`sqlalchemy.exc.SQLAlchemyError`
subclasses when the database fails; client-facing methods raise the
:mod:`watcher.errors` types for bad input and write nothing in that case.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Float,
    Integer,
    Text,
    all_,
    and_,
    bindparam,
    case,
    cast,
    column,
    exists,
    func,
    insert,
    literal,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.expression import ColumnElement, Select

from watcher.database import create_engine
from watcher.dburl import DatabaseURL, parse_database_url
from watcher.dialect import db_now, db_now_plus, lock_unless_busy
from watcher.errors import (
    DuplicateItemError,
    GateError,
    PartitionExistsError,
    PartitionNotFoundError,
)
from watcher.models import Status
from watcher.pg_direct import DirectStatements
from watcher.records import (
    GateSummary,
    ItemInfo,
    ItemWrite,
    LeaseRenewal,
    LeaseRow,
    LeaseStats,
    NewItem,
    PartitionInfo,
    PartitionState,
    ReadyItem,
)
from watcher.schema import Tables, tables_for

Clock = Callable[[], datetime]

INSERT_CHUNK = 500
IN_CHUNK = 500

AVAILABLE = Status.AVAILABLE.value
COMPLETE = Status.COMPLETE.value
FAILED = Status.FAILED.value


def _chunks(values: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


class Store:
    """All reads and writes of the ``partitions`` and ``items`` tables.

    ``clock``, when given, replaces the database clock (tests only).
    """

    def __init__(self, engine: AsyncEngine, tables: Tables, *, clock: Clock | None = None):
        self.engine = engine
        self.tables = tables
        self._clock = clock
        self._dialect = engine.dialect.name
        self._statements: dict[Any, Any] = {}
        # PostgreSQL: the hot single statements skip SQLAlchemy's engine (see pg_direct).
        self.direct = (DirectStatements(engine.url, engine.dialect)
                       if self._dialect == "postgresql" and clock is None else None)

    @classmethod
    def open(cls, url: str | DatabaseURL, table_prefix: str = "", *,
             clock: Clock | None = None) -> Store:
        """Create a store with its own engine.

        Raises:
            ConfigError: the URL or the table prefix is invalid.
        """
        parsed = url if isinstance(url, DatabaseURL) else parse_database_url(url)
        return cls(create_engine(parsed), tables_for(table_prefix), clock=clock)

    async def close(self) -> None:
        """Dispose of the engine's connections."""
        if self.direct is not None:
            await self.direct.close()
        await self.engine.dispose()

    # -- time ---------------------------------------------------------------

    def _now(self) -> ColumnElement[Any]:
        if self._clock is not None:
            return literal(self._clock(), type_=self.tables.partitions.c.until.type)
        return db_now()

    def _now_plus(self, seconds: float) -> ColumnElement[Any]:
        if self._clock is not None:
            moment = self._clock() + timedelta(seconds=seconds)
            return literal(moment, type_=self.tables.partitions.c.until.type)
        return db_now_plus(seconds)

    # -- transactions -------------------------------------------------------

    @asynccontextmanager
    async def _write(self) -> AsyncIterator[AsyncConnection]:
        async with self.engine.begin() as conn:
            yield conn

    @asynccontextmanager
    async def _read(self) -> AsyncIterator[AsyncConnection]:
        async with self.engine.connect() as conn:
            conn = await conn.execution_options(sqlite_read=True)
            async with conn.begin():
                yield conn

    async def _fetch(self, statement: Any, params: dict[str, Any], *, read: bool
                     ) -> Sequence[Any]:
        """Run one statement in a transaction of its own; returns its rows (if any).

        Raises the database's error (a SQLAlchemy exception) when it fails.
        """
        if self.direct is not None:
            return await self.direct.fetch(statement, params)
        async with self._read() if read else self._write() as conn:
            result = await conn.execute(statement, params)
            return result.all() if result.returns_rows else []

    def _statement(self, key: Any, build: Callable[[], Any]) -> Any:
        """A hot statement, built once (each time when a test clock is injected,
        since the clock's reading is part of the statement)."""
        if self._clock is not None:
            return build()
        found = self._statements.get(key)
        if found is None:
            found = self._statements[key] = build()
        return found

    # -- notifications (PostgreSQL) -----------------------------------------

    @property
    def notifies(self) -> bool:
        """Whether this database carries wake-up notifications (PostgreSQL only)."""
        return self._dialect == "postgresql"

    @property
    def channel(self) -> str:
        """The LISTEN/NOTIFY channel of this namespace (the prefix is validated)."""
        return f"{self.tables.prefix}statefeed"

    async def _notify(self, conn: AsyncConnection, partition_id: str) -> None:
        # Sent in the writer's transaction: delivered only if it commits.
        if self.notifies:
            await conn.execute(select(func.pg_notify(self.channel, partition_id)))

    async def notifications(self) -> AsyncIterator[str]:
        """Yield the partition ids that clients wrote, as their transactions commit.

        Holds one dedicated connection with ``LISTEN``. Raises the driver's
        error when the connection fails; the caller reconnects.
        """
        import psycopg
        from psycopg import sql

        url = self.engine.url.set(drivername="postgresql")
        async with await psycopg.AsyncConnection.connect(
                url.render_as_string(hide_password=False), autocommit=True) as conn:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
            async for notice in conn.notifies():
                yield notice.payload

    async def ping(self) -> None:
        """Run a trivial query. Raises the driver's error when the database is unreachable."""
        async with self._read() as conn:
            await conn.execute(select(literal(1)))

    async def now(self) -> datetime:
        """The current time by the database clock (or the injected clock)."""
        async with self._read() as conn:
            return (await conn.execute(select(self._now()))).scalar_one()

    # -- client: partitions and items --------------------------------------

    async def partition_create(self, partition_id: str, items: Sequence[NewItem]) -> None:
        """Insert a partition and its items in one transaction.

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
                now = self._now()
                await conn.execute(insert(p).values(
                    id=partition_id, version=1, gate=first_gate, status=AVAILABLE, owner="",
                    until=now, created_at=now, updated_at=now,
                ))
                await self._items_insert(conn, partition_id, items)
                await self._notify(conn, partition_id)
        except IntegrityError:
            raise PartitionExistsError(partition_id) from None

    async def items_add(self, partition_id: str, items: Sequence[NewItem]) -> bool:
        """Add items to a partition, re-opening it if it was complete.

        The partition row is written first: that locks it, so a concurrent
        engine write on it conflicts (and re-reads) instead of closing the
        partition over the new items. Returns whether the partition was re-opened.

        Raises:
            PartitionNotFoundError: no partition has this id.
            GateError: an item's gate is below the partition's current gate.
            DuplicateItemError: an item id is already stored in the partition.
        """
        p, i = self.tables.partitions, self.tables.items
        async with self._write() as conn:
            touched = await conn.execute(
                update(p).where(p.c.id == partition_id)
                .values(version=p.c.version + 1, updated_at=self._now()))
            if touched.rowcount != 1:
                raise PartitionNotFoundError(partition_id)
            row = (await conn.execute(
                select(p.c.gate, p.c.status).where(p.c.id == partition_id))).one()
            low = min(items, key=lambda item: item.gate)
            if low.gate < row.gate:
                raise GateError(
                    f"item {low.id!r} has gate {low.gate} but partition {partition_id!r} is "
                    f"already at gate {row.gate}; add items at gate {row.gate} or later"
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
            if row.status != COMPLETE:
                return False
            await conn.execute(update(p).where(p.c.id == partition_id).values(status=AVAILABLE))
            return True

    async def _items_insert(self, conn: AsyncConnection, partition_id: str,
                            items: Sequence[NewItem]) -> None:
        if not items:
            return
        now = (await conn.execute(select(self._now()))).scalar_one()
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

    async def _partitions_read(self, *, ids: list[str] | None = None, status: str | None = None,
                               limit: int = 1000) -> list[PartitionInfo]:
        p, i = self.tables.partitions, self.tables.items
        query = select(p)
        if ids is not None:
            query = query.where(p.c.id.in_(ids))
        if status is not None:
            query = query.where(p.c.status == status)
        query = query.order_by(p.c.created_at.desc(), p.c.id).limit(limit)
        async with self._read() as conn:
            rows = (await conn.execute(query)).all()
            counts: dict[str, dict[str, int]] = {row.id: {} for row in rows}
            for chunk in _chunks(list(counts), IN_CHUNK):
                grouped = await conn.execute(
                    select(i.c.partition_id, i.c.status, func.count())
                    .where(i.c.partition_id.in_(chunk))
                    .group_by(i.c.partition_id, i.c.status)
                )
                for partition_id, item_status, count in grouped:
                    counts[partition_id][item_status] = count
        return [
            PartitionInfo(
                id=row.id, status=row.status, gate=row.gate, owner=row.owner, until=row.until,
                version=row.version, counts=counts[row.id], created_at=row.created_at,
                updated_at=row.updated_at,
            )
            for row in rows
        ]

    async def items_list(self, partition_id: str) -> list[ItemInfo]:
        """Read every item of a partition, ordered by id.

        Raises:
            PartitionNotFoundError: no partition has this id.
        """
        p, i = self.tables.partitions, self.tables.items
        async with self._read() as conn:
            if (await conn.execute(select(p.c.id).where(p.c.id == partition_id))).first() is None:
                raise PartitionNotFoundError(partition_id)
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

    async def items_retry_failed(self, partition_id: str) -> int:
        """Put a partition's failed items back to available and re-open the partition.

        Returns the number of items reset.

        Raises:
            PartitionNotFoundError: no partition has this id.
        """
        p, i = self.tables.partitions, self.tables.items
        async with self._write() as conn:
            touched = await conn.execute(
                update(p).where(p.c.id == partition_id).values(
                    version=p.c.version + 1,
                    status=case((p.c.status == FAILED, AVAILABLE), else_=p.c.status),
                    updated_at=self._now(),
                )
            )
            if touched.rowcount != 1:
                raise PartitionNotFoundError(partition_id)
            reset = await conn.execute(
                update(i).where(i.c.partition_id == partition_id, i.c.status == FAILED).values(
                    version=i.c.version + 1, status=AVAILABLE, attempts=0, retry_at=self._now(),
                    updated_at=self._now(),
                )
            )
            await self._notify(conn, partition_id)
            return reset.rowcount

    async def partition_set_gate(self, partition_id: str, gate: int) -> None:
        """Move a partition's gate forward (manual checkpoint).

        Raises:
            PartitionNotFoundError: no partition has this id.
            GateError: ``gate`` is below the partition's current gate.
        """
        p = self.tables.partitions
        async with self._write() as conn:
            moved = await conn.execute(
                update(p).where(p.c.id == partition_id, p.c.gate <= gate).values(
                    version=p.c.version + 1, gate=gate, updated_at=self._now())
            )
            if moved.rowcount == 1:
                await self._notify(conn, partition_id)
                return
            current = (await conn.execute(
                select(p.c.gate).where(p.c.id == partition_id))).scalar_one_or_none()
        if current is None:
            raise PartitionNotFoundError(partition_id)
        raise GateError(
            f"cannot move partition {partition_id!r} back from gate {current} to gate {gate}; "
            "a checkpoint only moves forward"
        )

    # -- leases ------------------------------------------------------------

    async def leases_free(self, limit: int) -> list[LeaseRow]:
        """Read up to ``limit`` available partitions that are unleased or expired."""
        p = self.tables.partitions
        query = (
            select(p.c.id, p.c.version, p.c.gate, p.c.owner)
            .where(p.c.status == AVAILABLE, p.c.until <= self._now())
            .order_by(p.c.until).limit(limit)
        )
        async with self._read() as conn:
            return [LeaseRow(*row) for row in await conn.execute(query)]

    async def leases_of_owner(self, owner: str, limit: int) -> list[LeaseRow]:
        """Read up to ``limit`` partitions that ``owner`` holds with a live lease."""
        p = self.tables.partitions
        query = (
            select(p.c.id, p.c.version, p.c.gate, p.c.owner)
            .where(p.c.status == AVAILABLE, p.c.owner == owner, p.c.until > self._now())
            .order_by(p.c.until.desc(), p.c.id).limit(limit)
        )
        async with self._read() as conn:
            return [LeaseRow(*row) for row in await conn.execute(query)]

    async def lease_stats(self) -> LeaseStats:
        """Count active partitions and the live leases of each owner."""
        p = self.tables.partitions
        async with self._read() as conn:
            active = (await conn.execute(
                select(func.count()).where(p.c.status == AVAILABLE))).scalar_one()
            owners = await conn.execute(
                select(p.c.owner, func.count())
                .where(p.c.status == AVAILABLE, p.c.until > self._now(), p.c.owner != "")
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
            .values(version=p.c.version + 1, owner=owner, until=self._now_plus(duration),
                    updated_at=self._now())
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
                    won.append(LeaseRow(row.id, row.version + 1, row.gate, owner))
        return won

    async def leases_renew(self, leases: dict[str, int], owner: str,
                           duration: float) -> LeaseRenewal:
        """Extend ``owner``'s leases, given as partition id -> version held.

        A renewal that loses on version is retried once against a fresh read
        when ``owner`` still holds the partition (a client write bumped the
        version). Partitions whose row another session holds locked are not
        waited for: they come back as ``busy``, so one stuck transaction
        cannot stall the renewal of every other lease.
        """
        return await self._lease_rewrite(
            leases, owner, until=self._now_plus(duration), release=False)

    async def leases_release(self, leases: dict[str, int], owner: str) -> int:
        """Give up ``owner``'s leases at once, so another watcher can take them.

        Returns the number released.
        """
        renewal = await self._lease_rewrite(leases, owner, until=self._now(), release=True)
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

    async def _lease_rewrite(self, leases: dict[str, int], owner: str, *,
                             until: ColumnElement[Any], release: bool) -> LeaseRenewal:
        p = self.tables.partitions
        values: dict[str, Any] = {
            "version": p.c.version + 1, "until": until, "updated_at": self._now()}
        if release:
            values["owner"] = ""
        statement = (
            update(p)
            .where(p.c.id == bindparam("pid"), p.c.version == bindparam("seen"),
                   p.c.owner == owner, p.c.status == AVAILABLE)
            .values(**values)
        )
        held: dict[str, tuple[int, int | None]] = {}
        async with self._write() as conn:
            free = await self._lock_free(conn, list(leases))
            missed: list[str] = []
            for partition_id, version in sorted(leases.items()):  # id order: no deadlocks
                if partition_id not in free:
                    continue
                result = await conn.execute(statement, {"pid": partition_id, "seen": version})
                if result.rowcount == 1:
                    held[partition_id] = (version + 1, None)
                else:
                    missed.append(partition_id)
            states = await self._states(conn, missed) if missed else {}
            for partition_id, state in sorted(states.items()):
                if state.owner != owner or state.status != AVAILABLE:
                    continue
                result = await conn.execute(
                    statement, {"pid": partition_id, "seen": state.version})
                if result.rowcount == 1:
                    held[partition_id] = (state.version + 1, state.gate)
        # Not in ``free``: locked by another session, or deleted (then never free again).
        return LeaseRenewal(held, frozenset(leases) - free)

    async def _states(self, conn: AsyncConnection, ids: Sequence[str]
                      ) -> dict[str, PartitionState]:
        p = self.tables.partitions
        live = case((p.c.until > self._now(), True), else_=False)
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
        values: dict[str, Any] = {"version": p.c.version + 1, "updated_at": self._now()}
        if gate is not None:
            values["gate"] = gate
        if status is not None:
            values["status"] = status
            if status != AVAILABLE:
                values.update(owner="", until=self._now())
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
        rows = await self._fetch(self._ready_statement(bool(exclude), limit),
                                 self._ready_params(partition_id, gate, limit, exclude),
                                 read=True)
        return [ReadyItem(row[0], row[1], row[2], bytes(row[3]), row[4]) for row in rows]

    def _ready_params(self, partition_id: str, gate: int, limit: int,
                      exclude: Collection[str]) -> dict[str, Any]:
        """The parameters of :meth:`_ready_statement` (PostgreSQL takes ``exclude`` as JSON)."""
        params: dict[str, Any] = {"pid": partition_id, "gate": gate, "limit": limit}
        if exclude:
            params["exclude"] = (json.dumps(list(exclude), ensure_ascii=False)
                                 if self._dialect == "postgresql" else list(exclude))
        return params

    def _ready_statement(self, excluding: bool, limit: int) -> Select[Any]:
        """The ready read, with bind parameters pid, gate (and exclude, and limit).

        The direct PostgreSQL path sends one statement text for every limit;
        elsewhere the limit is a literal, which SQL Server renders as ``TOP n``.
        """
        if self.direct is not None:
            return self._statement(("ready", excluding), lambda: self._build_ready(
                excluding, bindparam("limit", type_=Integer())))
        return self._build_ready(excluding, limit)

    def _build_ready(self, excluding: bool, limit: Any) -> Select[Any]:
        i = self.tables.items
        query = (
            select(i.c.id, i.c.version, i.c.gate, i.c.data, i.c.attempts)
            .where(i.c.partition_id == bindparam("pid", type_=i.c.partition_id.type),
                   i.c.status == AVAILABLE, i.c.gate == bindparam("gate", type_=Integer()),
                   i.c.retry_at <= self._now())
            .order_by(i.c.retry_at, i.c.id).limit(limit)
        )
        if excluding and self._dialect == "postgresql":
            # One JSON array parameter keeps the statement text constant (prepared
            # once) and is encoded in C, where a text[] is encoded element by element.
            names = select(func.jsonb_array_elements_text(
                _jsonb_param("exclude"))).scalar_subquery()
            query = query.where(i.c.id != all_(func.array(names)))
        elif excluding:
            query = query.where(i.c.id.not_in(bindparam("exclude", expanding=True)))
        return query

    async def gate_summary(self, partition_id: str, gate: int) -> GateSummary:
        """Summarise what is left at ``gate``: pending and failed items, and the next gate."""
        row = (await self._fetch(self._statement("gate_summary", self._build_gate_summary),
                                 {"pid": partition_id, "gate": gate}, read=True))[0]
        pending_count, earliest, failed_count, lowest, now = row
        wait = None
        if pending_count and earliest is not None:
            wait = max(0.0, (earliest - now).total_seconds())
        return GateSummary(pending=pending_count, failed=failed_count, next_gate=lowest,
                           seconds_to_next_retry=wait)

    def _build_gate_summary(self) -> Select[Any]:
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
            self._now(),
        )

    async def items_apply(self, writes: Sequence[ItemWrite], owner: str) -> list[bool]:
        """Write attempt outcomes in one transaction; each write guarded and fenced.

        A write counts only if the item still has the version that was read
        (so it is still available: every item write bumps the version) and
        ``owner`` still holds a live lease on its partition. Returns, per
        write, whether it was applied.

        The guard names the primary key and the version, and on purpose not
        the status: with ``status = 'available'`` in it, a planner without
        statistics (a freshly filled table) may pick the ready-items index,
        whose (partition_id, status) prefix matches as many columns as the
        key, and then visit every available item of the partition per write.
        """
        if not writes:
            return []
        if self._dialect == "postgresql" and self._clock is None:
            return await self._items_apply_batch(writes, owner)
        p, i = self.tables.partitions, self.tables.items
        fence = exists().where(
            p.c.id == bindparam("pid"), p.c.owner == owner, p.c.status == AVAILABLE,
            p.c.until > self._now())
        guard = (i.c.partition_id == bindparam("pid"), i.c.id == bindparam("iid"),
                 i.c.version == bindparam("seen"), fence)
        statements: dict[tuple[bool, bool], Any] = {}

        def statement_for(write: ItemWrite) -> Any:
            key = (write.data is not None, bool(write.retry_delay))
            if key not in statements:
                retry_at: ColumnElement[Any] = self._now()
                if write.retry_delay:
                    retry_at = (bindparam("retry_at", type_=i.c.retry_at.type)
                                if self._clock is not None
                                else db_now_plus(bindparam("delay", type_=Float())))
                values: dict[str, Any] = {
                    "version": i.c.version + 1, "status": bindparam("new_status"),
                    "gate": func.coalesce(bindparam("new_gate", type_=Integer()), i.c.gate),
                    "attempts": bindparam("new_attempts"),
                    "last_error": bindparam("new_error"), "updated_at": self._now(),
                    "retry_at": retry_at,
                }
                if write.data is not None:
                    values["data"] = bindparam("new_data")
                statements[key] = update(i).where(*guard).values(**values)
            return statements[key]

        applied: list[bool] = []
        async with self._write() as conn:
            for write in writes:
                params = {
                    "pid": write.partition_id, "iid": write.item_id, "seen": write.seen_version,
                    "new_status": write.status, "new_gate": write.gate,
                    "new_attempts": write.attempts, "new_error": write.last_error,
                }
                if write.data is not None:
                    params["new_data"] = write.data
                if write.retry_delay:
                    params["delay"] = write.retry_delay
                    if self._clock is not None:
                        params["retry_at"] = self._clock() + timedelta(seconds=write.retry_delay)
                result = await conn.execute(statement_for(write), params)
                applied.append(result.rowcount == 1)
        return applied


    async def _items_apply_batch(self, writes: Sequence[ItemWrite], owner: str
                                  ) -> list[bool]:
        """PostgreSQL fast path: the whole batch as one guarded UPDATE.

        Same guard and fence as the portable path, per row; RETURNING tells
        which rows were applied. The rows travel as one JSON array of arrays
        (see :func:`batch_rows_json`): the driver encodes nine array
        parameters element by element in Python, ``json.dumps`` the batch in C.
        """
        rows = await self._fetch(self._batch_update_statement,
                                 self._batch_update_params(writes, owner), read=False)
        applied = {(pid, iid) for pid, iid in rows}
        return [(w.partition_id, w.item_id) in applied for w in writes]

    @staticmethod
    def _batch_update_params(writes: Sequence[ItemWrite], owner: str) -> dict[str, Any]:
        return {"owner": owner, "rows": batch_rows_json(writes)}

    @functools.cached_property
    def _batch_update_statement(self) -> Any:
        p, i = self.tables.partitions, self.tables.items
        batch = func.jsonb_array_elements(_jsonb_param("rows")).table_valued(
            column("value", JSONB)).render_derived(name="v")
        row = batch.c.value
        pid, iid = row[0].as_string(), row[1].as_string()
        delay = row[8].as_float()
        now = db_now()
        fence = exists().where(p.c.id == pid, p.c.owner == bindparam("owner"),
                               p.c.status == AVAILABLE, p.c.until > now)
        return (
            update(i)
            .where(i.c.partition_id == pid, i.c.id == iid,
                   i.c.version == row[2].as_integer(), fence)
            .values(version=i.c.version + 1, status=row[3].as_string(),
                    gate=func.coalesce(row[4].as_integer(), i.c.gate),
                    attempts=row[5].as_integer(), last_error=row[6].as_string(),
                    data=func.coalesce(func.decode(row[7].as_string(), "hex"), i.c.data),
                    updated_at=now,
                    retry_at=case((delay > 0, db_now_plus(delay)), else_=now))
            .returning(i.c.partition_id, i.c.id)
        )


def _jsonb_param(name: str) -> ColumnElement[Any]:
    """A parameter sent as JSON text and read as ``jsonb``: no type on either path
    (SQLAlchemy's or the direct one) encodes the text a second time."""
    return cast(bindparam(name, type_=Text()), JSONB)


def batch_rows_json(writes: Iterable[ItemWrite]) -> str:
    """Item writes as the JSON rows of the batch UPDATE: ``[pid, iid, seen, status,
    gate, attempts, error, data as hex, retry delay]`` each.

    Every text in a write is storable (:func:`~watcher.decisions.storable_text`),
    so it is valid in ``jsonb`` too.
    """
    return json.dumps([
        [w.partition_id, w.item_id, w.seen_version, w.status, w.gate, w.attempts,
         w.last_error, None if w.data is None else w.data.hex(), w.retry_delay or 0.0]
        for w in writes], ensure_ascii=False, separators=(",", ":"))


async def missing_tables(store: Store) -> list[str]:
    """Names of statefeed tables that do not exist yet (empty when migrated).

    Raises the driver's error when the database cannot be reached.
    """
    from sqlalchemy import inspect as inspect_schema

    names = [store.tables.partitions.name, store.tables.items.name]
    async with store.engine.connect() as conn:
        present = await conn.run_sync(
            lambda sync: {name for name in names if inspect_schema(sync).has_table(name)})
    return [name for name in names if name not in present]
