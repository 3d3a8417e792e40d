"""The table of live processors (revision 0019), beside :mod:`watcher.models`, whose
column types it shares; the statements that use it are in
:mod:`watcher.store.registry.processors`."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Column
from sqlalchemy.dialects import mysql
from sqlalchemy.types import TypeEngine
from sqlmodel import Field, SQLModel

from watcher.models import (
    MYSQL_TABLE_OPTIONS,
    OWNER_MAX_LENGTH,
    error_type,
    key_type,
    timestamp_type,
)


def serves_type() -> TypeEngine[str]:
    """The JSON of what a processor serves: text of any length (MEDIUMTEXT on MariaDB and
    MySQL, whose TEXT stops at 64 KiB)."""
    return error_type().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")


class ProcessorRow(SQLModel, table=True):
    """One running processor and the places it serves (revision 0019).

    Each watcher writes its row at its first lease cycle and again every renew
    interval, and when what it serves changes (a routes file reloaded); a clean stop
    deletes it. ``serves`` is JSON of the (pipeline, version, gates) tables it serves
    (:mod:`watcher.rules.served`), NULL when it serves everything (``--handler-url``
    alone, a library watcher). ``until`` is set as a lease's is, by the database
    clock: a row whose ``until`` has passed belongs to a processor that is gone, or
    stalled, and does not count as live.
    """

    __tablename__ = "processors"
    __table_args__ = (MYSQL_TABLE_OPTIONS,)

    owner: str = Field(sa_column=Column(key_type(OWNER_MAX_LENGTH), primary_key=True))
    serves: str | None = Field(default=None, sa_column=Column(serves_type(), nullable=True))
    until: datetime = Field(sa_column=Column(timestamp_type(), nullable=False))
    updated_at: datetime = Field(sa_column=Column(timestamp_type(), nullable=False))
