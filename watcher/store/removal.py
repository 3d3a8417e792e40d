"""Removing what is finished: deleting a partition in batches, purging old finished
partitions, and shedding old complete items of open partitions (retention).
"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import (
    and_,
    delete,
    exists,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.expression import ColumnElement

from watcher.errors import (
    PartitionLeasedError,
    PartitionNotFoundError,
)
from watcher.models import AVAILABLE, COMPLETE, DELETING, SKIPPED
from watcher.reports import DeleteBatch
from watcher.store.base import StoreBase
from watcher.store.codecs import (
    settings_of,
)
from watcher.store.sql.removed_waits_table import REMOVED_WAITS_KEPT


class RemovalStore(StoreBase):
    """Delete, purge and item retention, each in bounded batches."""

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
        p, i, w = self.tables.partitions, self.tables.items, self.tables.waits
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
                # The waits of these items go with them; their tokens are remembered.
                await self._waits_removed(conn, [w.c.partition_id == partition_id,
                                                 w.c.item_id <= last],
                                          [i.c.partition_id == partition_id, i.c.id <= last])
                await conn.execute(
                    delete(i).where(i.c.partition_id == partition_id, i.c.id <= last))
            if count >= batch:
                return DeleteBatch(count, done=False)
            t = self.tables.timelines
            await conn.execute(delete(t).where(t.c.partition_id == partition_id))
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

        Only ``complete`` and ``skipped`` items go: a reduce reads the available items at its
        gate and, under ``on_item_failure=continue``, the failed ones, never a
        complete or skipped one, so no reduce's view changes; failed items stay for
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
            wanted = [i.c.partition_id == partition_id, i.c.status.in_((COMPLETE, SKIPPED)),
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
            # Their waits (used, timed out or replaced) go first: bounded by the page.
            w = self.tables.waits
            await self._waits_removed(
                conn, [w.c.partition_id == partition_id, w.c.item_id <= last,
                       *([w.c.item_id > after] if after is not None else []),
                       exists().where(i.c.id == w.c.item_id, *wanted)],
                [*wanted, i.c.id <= last])
            removed = await conn.execute(delete(i).where(*wanted, i.c.id <= last))
            return int(removed.rowcount), (last if count >= batch else None)

    async def _waits_removed(self, conn: AsyncConnection, where: list[ColumnElement[bool]],
                             items_where: list[ColumnElement[bool]]) -> None:
        """Before the items matching ``items_where`` are deleted: keep their last waits'
        keys, and those of the ``waits`` rows matching ``where`` (their items' other
        keys: operators' tokens, replaced waits), in ``removed_waits`` with the clock's
        time, and delete those rows; so a late completion is told the wait is over
        (409), not that it is unknown."""
        w, removed = self.tables.waits, self.tables.removed_waits
        now = self.statements.now
        await conn.execute(self.statements.waits.item_keys_removed(*items_where))
        for key in (w.c.token, w.c.operator_token):
            await conn.execute(insert(removed).from_select(
                ["token", "removed_at"],
                select(key, now).where(*where, key.is_not(None))))
        await conn.execute(delete(w).where(*where))

    async def removed_waits_purge(self, *, batch: int) -> int:
        """Forget up to ``batch`` tokens of deleted items' waits kept longer than
        :data:`~watcher.store.sql.removed_waits_table.REMOVED_WAITS_KEPT` (the oldest
        first, through their index); returns how many went.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed.
        """
        removed = self.tables.removed_waits
        async with self._write() as conn:
            old = (select(removed.c.token)
                   .where(removed.c.removed_at < self.statements.now_plus(-REMOVED_WAITS_KEPT))
                   .order_by(removed.c.removed_at).limit(batch))
            tokens = [row.token for row in await conn.execute(old)]
            if tokens:
                await conn.execute(delete(removed).where(removed.c.token.in_(tokens)))
        return len(tokens)
