"""Client writes and reads: create partitions, add items, read partitions and items
(by id, a page at a time, and the per-gate counts the console shows).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import exists, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from watcher.errors import DuplicateItemError, GateError, PartitionExistsError
from watcher.models import AVAILABLE, COMPLETE, ItemFailurePolicy
from watcher.records import (
    ItemInfo,
    NewItem,
    Page,
    PartitionInfo,
    PartitionSettings,
)
from watcher.rules.delays import stored_time
from watcher.rules.priority import head_start, rank_at
from watcher.store.codecs import (
    IN_CHUNK,
    NO_SETTINGS,
    chunks,
    client_items,
    colliding_ids,
    decode_partition_cursor,
    encode_partition_cursor,
    encode_quorum,
    encode_reduce_gates,
    settings_of,
    to_item_info,
    to_partition_info,
)
from watcher.store.flow import FlowStore, key_clock_advance
from watcher.store.sql.leases import TIE_STEP


class PartitionsStore(FlowStore):
    """Creating partitions, adding items, and the client's reads of both."""

    async def partition_create(self, partition_id: str, items: Sequence[NewItem],
                               settings: PartitionSettings = NO_SETTINGS, *,
                               start_at: datetime | None = None) -> None:
        """Insert a partition (with its reduce gates and failure policy) and its items
        in one transaction. ``start_at`` (aware) keeps it unleased until then.

        Raises:
            PartitionExistsError: a partition with this id exists.
            DuplicateItemError: two item ids the database takes for one.
        """
        items = client_items(items)
        first_gate = min((item.gate or 0 for item in items), default=0)
        try:
            await self.partition_create_batches(partition_id, [items], first_gate, settings,
                                                start_at=start_at)
        except IntegrityError:
            # No such partition: two item ids the database compares as equal (MariaDB
            # and MySQL ignore trailing spaces, SQL Server too).
            raise DuplicateItemError(partition_id, colliding_ids(items),
                                     stored=False) from None

    async def partition_create_batches(self, partition_id: str,
                                       batches: Iterable[Sequence[NewItem]], first_gate: int,
                                       settings: PartitionSettings = NO_SETTINGS, *,
                                       request_digest: str | None = None,
                                       start_at: datetime | None = None) -> bool:
        """Insert a partition and its items, read a batch at a time from ``batches``
        (items already checked, gates set), in one transaction: what the ingest API
        streams from its spool. ``first_gate`` is the lowest gate of them all.

        ``start_at`` (an aware time, checked) schedules it: its lease's until is set
        there, and the lease scan takes only partitions whose until has passed by the
        database clock, so no processor starts it earlier.

        ``request_digest`` (the ingest API's digest of the request) is stored with the
        partition. When the partition exists already with the same digest, nothing is
        written and this returns ``False`` (a retried request); else ``True``.

        Raises:
            PartitionExistsError: a partition with this id exists (with another digest,
                or created by the client library).
            sqlalchemy.exc.IntegrityError: two item ids the database takes for one
                (nothing is written).
        """
        if settings.key:
            await self.key_prepare(settings.key)
        try:
            async with self._write() as conn:
                if await self._existing_digest(conn, partition_id, request_digest):
                    return False
                await self._partition_insert(conn, partition_id, first_gate, settings,
                                             request_digest=request_digest, start_at=start_at)
                for batch in batches:
                    await self._items_insert(conn, partition_id, batch)
                await self._notify(conn, partition_id)
        except IntegrityError:
            async with self._read() as conn:
                if await self._existing_digest(conn, partition_id, request_digest):
                    return False
            raise
        return True

    async def _partition_insert(self, conn: AsyncConnection, partition_id: str,
                                first_gate: int, settings: PartitionSettings, *,
                                request_digest: str | None = None,
                                start_at: datetime | None = None) -> None:
        """Insert the partition row (no items) and its timeline row (empty), in
        ``conn``'s transaction; a key's row must exist (:meth:`key_prepare`).

        Raises:
            sqlalchemy.exc.IntegrityError: a partition with this id exists.
        """
        p = self.tables.partitions
        now = self.statements.now
        policy = (ItemFailurePolicy.CONTINUE if settings.continue_on_failure
                  else ItemFailurePolicy.FAIL)
        await conn.execute(insert(p).values(
            id=partition_id, version=1, gate=first_gate, status=AVAILABLE, owner="",
            until=now if start_at is None else stored_time(start_at),
            created_at=now, updated_at=now, priority=settings.priority,
            rank_at=await self._rank_at(conn, settings, start_at),
            flow_key=settings.key,
            reduce_gates=encode_reduce_gates(settings.reduce_gates),
            on_item_failure=policy.value, request_digest=request_digest,
            trace_context=settings.trace_context, quorum=encode_quorum(settings.quorum),
            notify=settings.notify, pipeline=settings.pipeline,
            pipeline_version=settings.pipeline_version,
        ))
        await conn.execute(insert(self.tables.timelines).values(partition_id=partition_id))

    async def _rank_at(self, conn: AsyncConnection, settings: PartitionSettings,
                       start_at: datetime | None) -> Any:
        """The lease-queue place of a new partition (:func:`watcher.rules.priority.rank_at`)
        from its start: its ``start_at``; else its key's fair-queuing clock
        (:func:`~watcher.store.flow.key_clock_advance`), moved on in ``conn``'s
        transaction; else the store's clock."""
        if start_at is not None:
            return rank_at(stored_time(start_at), settings.priority)
        if settings.key:
            start = await key_clock_advance(conn, self.statements, settings.key)
            return rank_at(start, settings.priority)
        back = -head_start(settings.priority).total_seconds()
        # First come, first served even within one tick of the clock: after any open
        # partition already placed in this tick.
        latest = (await conn.execute(self.lease_statements.queue_place,
                                     {"back": back})).scalar()
        if latest is not None:
            return latest + TIE_STEP
        return self.statements.now_plus(back)

    async def _existing_digest(self, conn: AsyncConnection, partition_id: str,
                               request_digest: str | None) -> bool:
        """Whether the partition exists with ``request_digest`` (not ``None``).

        Raises:
            PartitionExistsError: it exists, with another digest or none.
        """
        p = self.tables.partitions
        found = (await conn.execute(select(p.c.request_digest)
                                    .where(p.c.id == partition_id))).first()
        if found is None:
            return False
        if request_digest is not None and found.request_digest == request_digest:
            return True
        raise PartitionExistsError(partition_id)

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
        p = self.tables.partitions
        items = client_items(items)
        async with self._write() as conn:
            await self._touch_partition(conn, partition_id)
            row = (await conn.execute(
                select(p.c.gate, p.c.status, p.c.reduce_gates)
                .where(p.c.id == partition_id))).one()
            low = min(items, key=lambda item: item.gate or 0)
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
            stored = await self._stored_ids(conn, partition_id, ids)
            if stored:
                raise DuplicateItemError(partition_id, sorted(stored), stored=True)
            try:
                await self._items_insert(conn, partition_id, items)
            except IntegrityError:
                raise DuplicateItemError(partition_id, ids, stored=True) from None
            await self._notify(conn, partition_id)
            return await self._reopen_if_holding(conn, partition_id)

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
        return Page([to_partition_info(row, counts[row.id]) for row in rows], cursor)

    async def _partitions_read(self, *, ids: list[str] | None = None, status: str | None = None,
                               limit: int = 1000, after: tuple[datetime, str] | None = None
                               ) -> list[PartitionInfo]:
        async with self._read() as conn:
            rows = await self._partitions_rows(conn, ids=ids, status=status, limit=limit,
                                               after=after)
            counts = await self._counts(conn, rows)
        return [to_partition_info(row, counts[row.id]) for row in rows]

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
            for chunk in chunks(list(dict.fromkeys(partition_ids)), IN_CHUNK):
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
        return [to_item_info(row) for row in rows]

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
        query = select(*self._item_columns(with_data)).where(i.c.partition_id == partition_id)
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
        infos = [to_item_info(row, with_data=with_data) for row in rows[:limit]]
        return Page(infos, infos[-1].id if more else None)

    def _item_columns(self, with_data: bool) -> list[Any]:
        """What a client's read of items takes: every column a :class:`ItemInfo` shows
        (the data only ``with_data``)."""
        i = self.tables.items
        columns = [i.c.partition_id, i.c.id, i.c.status, i.c.gate, i.c.attempts,
                   i.c.last_error, i.c.version, i.c.retry_at, i.c.parent, i.c.error_history]
        if with_data:
            columns.append(i.c.data)
        return columns

    async def item_get(self, partition_id: str, item_id: str, *,
                       with_data: bool = True) -> ItemInfo | None:
        """Read one item by its key, with its error history (and its data, ``with_data``);
        ``None`` when the partition holds no such item.

        Raises:
            PartitionNotFoundError: no partition has this id.
        """
        i = self.tables.items
        query = select(*self._item_columns(with_data)).where(
            i.c.partition_id == partition_id, i.c.id == item_id)
        async with self._read() as conn:
            await self._require_partition(conn, partition_id)
            row = (await conn.execute(query)).first()
        return None if row is None else to_item_info(row, with_data=with_data)

    async def items_find(self, item_id: str, limit: int) -> list[ItemInfo]:
        """Read the items with this exact id in every partition (at most ``limit``,
        ordered by partition id), without their data, through the index on item ids.

        Databases whose collation ignores case or trailing spaces may match more
        rows; only exact matches are returned.
        """
        i = self.tables.items
        query = (select(*self._item_columns(False)).where(i.c.id == item_id)
                 .order_by(i.c.partition_id).limit(limit))
        async with self._read() as conn:
            rows = (await conn.execute(query)).all()
        return [to_item_info(row, with_data=False) for row in rows if row.id == item_id]
