"""Pipelines as an operator sees them: moving a partition to another version of its
pipeline, and the open partitions per pipeline and version (docs/how-to/pipelines.md)."""

from __future__ import annotations

from sqlalchemy import and_, case, func, select, update

from watcher.errors import PartitionChangedError, PartitionFinishedError, PartitionNotFoundError
from watcher.models import AVAILABLE, COMPLETE, DELETING
from watcher.reports import PipelineCount, PipelineMove
from watcher.store.base import StoreBase


class PipelinesStore(StoreBase):
    """Moving partitions between pipeline versions; counting them per version."""

    async def partition_move_version(self, partition_id: str, pipeline_version: str, *,
                                     version: int | None = None) -> PipelineMove:
        """Pin ``pipeline_version`` on a partition (checked by the caller) that is not
        complete: from its next lease on, its calls go to that version's routes. A
        processor holding it loses its lease now (``owner`` cleared, ``until`` now, the
        version bumped: its writes are fenced off, and a processor serving the new
        version takes it at once); a partition not held keeps its ``until`` (a scheduled
        one still waits for its start). With ``version``, only while the partition is at
        that version. One guarded write, after one read.

        Raises:
            PartitionNotFoundError: no partition has this id.
            PartitionFinishedError: it is complete, or being deleted.
            PartitionChangedError: ``version`` was given and it is at another one, or it
                changed between the read and the write (look again, and repeat).
            sqlalchemy.exc.SQLAlchemyError: the database failed (nothing was written).
        """
        p = self.tables.partitions
        now = self.statements.now
        async with self._write() as conn:
            row = (await conn.execute(
                select(p.c.status, p.c.version, p.c.pipeline, p.c.pipeline_version,
                       p.c.owner).where(p.c.id == partition_id))).first()
            if row is None:
                raise PartitionNotFoundError(partition_id)
            if row.status in (COMPLETE, DELETING):
                raise PartitionFinishedError(partition_id, row.status,
                                             f"move to version {pipeline_version!r}")
            if version is not None and version != row.version:
                raise PartitionChangedError(partition_id, version, row.version)
            held = row.owner != ""
            moved = await conn.execute(
                update(p).where(p.c.id == partition_id, p.c.version == row.version)
                .values(pipeline_version=pipeline_version, version=p.c.version + 1,
                        owner="", updated_at=now,
                        until=case((p.c.owner != "", now), else_=p.c.until)))
            if moved.rowcount != 1:  # a write between the read and this one
                raise PartitionChangedError(partition_id, None, row.version)
            await self._notify(conn, partition_id)
        return PipelineMove(partition_id, row.pipeline, row.pipeline_version,
                            pipeline_version, row.version + 1,
                            released=held and row.status == AVAILABLE)

    async def pipelines_count(self) -> list[PipelineCount]:
        """The open (available) partitions per pipeline and version, and how many a
        processor holds, by pipeline then version (``None`` first). One grouped read of
        the open partitions."""
        p = self.tables.partitions
        leased = func.sum(case((and_(p.c.owner != "", p.c.until > self.statements.now), 1),
                               else_=0))
        async with self._read() as conn:
            rows = (await conn.execute(
                select(p.c.pipeline, p.c.pipeline_version, func.count(), leased)
                .where(p.c.status == AVAILABLE)
                .group_by(p.c.pipeline, p.c.pipeline_version))).all()
        return sorted((PipelineCount(row[0], row[1], int(row[2]), int(row[3] or 0))
                       for row in rows),
                      key=lambda count: (count.pipeline, count.version or ""))
