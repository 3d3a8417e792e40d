"""The ``processors`` table: each running processor's row, written by its lease keeper
(:mod:`watcher.leasing.registration`), and the reads that set the open partitions'
places against the live processors (:func:`watcher.rules.served.places.unserved`)."""

from __future__ import annotations

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from watcher.models import AVAILABLE
from watcher.reports import PlaceCount, ProcessorInfo
from watcher.rules.checks import check_seconds
from watcher.rules.served.places import Serves, place_order, serves_of, serves_text
from watcher.store.base import StoreBase


class ProcessorsStore(StoreBase):
    """The processors' rows; the open partitions per place."""

    async def processors_register(self, owner: str, serves: Serves, duration: float) -> None:
        """Write ``owner``'s row: it serves ``serves`` (``None``: everything) and counts as
        live for ``duration`` seconds from now by the database clock. Made at the first
        write, overwritten after.

        Raises:
            ConfigError: ``duration`` is not a positive number of seconds.
            sqlalchemy.exc.SQLAlchemyError: the database failed (nothing was written).
        """
        check_seconds("processor registration duration", duration)
        processors = self.tables.processors
        now = self.statements.now
        values = {"serves": serves_text(serves), "until": self.statements.now_plus(duration),
                  "updated_at": now}
        for _ in range(2):  # an insert that lost a race to its own twin updates after all
            async with self._write() as conn:
                written = await conn.execute(
                    update(processors).where(processors.c.owner == owner).values(**values))
                if written.rowcount == 1:
                    return
            try:
                async with self._write() as conn:
                    await conn.execute(insert(processors).values(owner=owner, **values))
                return
            except IntegrityError:
                continue

    async def processors_unregister(self, owner: str) -> bool:
        """Delete ``owner``'s row (a clean stop). Returns whether it had one.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed (nothing was deleted).
        """
        processors = self.tables.processors
        async with self._write() as conn:
            deleted = await conn.execute(delete(processors).where(processors.c.owner == owner))
        return deleted.rowcount == 1

    async def processors_live(self) -> list[ProcessorInfo]:
        """The processors whose rows' ``until`` has not passed by the database clock, by
        owner, with what each serves. One read of the (small) table."""
        processors = self.tables.processors
        async with self._read() as conn:
            rows = (await conn.execute(
                select(processors.c.owner, processors.c.serves, processors.c.until,
                       processors.c.updated_at)
                .where(processors.c.until > self.statements.now)
                .order_by(processors.c.owner))).all()
        return [ProcessorInfo(row.owner, serves_of(row.serves), row.until, row.updated_at)
                for row in rows]

    async def partitions_open_places(self) -> list[PlaceCount]:
        """The open (available) partitions per place (pipeline, pinned version, gate), with
        how many are at each, by pipeline, version (``None`` first) then gate. One grouped
        read of the open partitions (by the status index): no finished partition and no
        item is read."""
        p = self.tables.partitions
        async with self._read() as conn:
            rows = (await conn.execute(
                select(p.c.pipeline, p.c.pipeline_version, p.c.gate, func.count())
                .where(p.c.status == AVAILABLE)
                .group_by(p.c.pipeline, p.c.pipeline_version, p.c.gate))).all()
        return sorted((PlaceCount(row[0], row[1], int(row[2]), int(row[3])) for row in rows),
                      key=place_order)
