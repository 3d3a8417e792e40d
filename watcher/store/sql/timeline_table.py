"""The table of partitions' timelines (revision 0013), beside :mod:`watcher.models`,
whose column types it shares; the statements that use it are in
:mod:`watcher.store.sql.timelines`."""

from __future__ import annotations

from sqlalchemy import Column
from sqlmodel import Field, SQLModel

from watcher.models import ID_MAX_LENGTH, MYSQL_TABLE_OPTIONS, error_type, key_type


class PartitionTimeline(SQLModel, table=True):
    """A partition's timeline (revision 0013), out of the partition row: bounded JSON of
    when each gate began and ended and of the items done per minute
    (:mod:`watcher.rules.timeline`). One row per partition, inserted with it; the
    lease holder rewrites it when a gate moves, when it closes the partition and when a
    renewal carries items done. Its only index is the key, which no write changes, so
    PostgreSQL can make every rewrite a HOT update (revision 0013 leaves room in each
    page for that)."""

    __tablename__ = "partition_timelines"
    __table_args__ = (MYSQL_TABLE_OPTIONS,)

    partition_id: str = Field(sa_column=Column(key_type(ID_MAX_LENGTH), primary_key=True))
    # NULL while the partition has none yet.
    timeline: str | None = Field(default=None, sa_column=Column(error_type(), nullable=True))
