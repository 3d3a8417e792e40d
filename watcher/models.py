"""SQLModel tables: ``partitions`` and ``items``.

These classes define the canonical schema. :mod:`watcher.schema` copies them
under a table prefix; the Alembic migrations in ``watcher/migrations`` create
them. A partition is *free* when it is ``available`` and its ``until`` has
passed: unleased partitions carry ``owner = ''`` and an ``until`` in the past,
so one index on ``(status, until, owner)`` serves both "free" and "live" scans.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from sqlalchemy import Column, DateTime, Index, Integer, LargeBinary, String, Text
from sqlmodel import Field, SQLModel

ID_MAX_LENGTH = 255
OWNER_MAX_LENGTH = 255


class Status(StrEnum):
    """The status of a partition or an item."""

    AVAILABLE = "available"
    COMPLETE = "complete"
    FAILED = "failed"


class Partition(SQLModel, table=True):
    """A top-level job: its current gate, status and lease."""

    __tablename__ = "partitions"
    __table_args__ = (Index("ix_partitions_lease", "status", "until", "owner"),)

    id: str = Field(sa_column=Column(String(ID_MAX_LENGTH), primary_key=True))
    version: int = Field(default=1, sa_column=Column(Integer, nullable=False))
    gate: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    status: str = Field(default=Status.AVAILABLE, sa_column=Column(String(16), nullable=False))
    owner: str = Field(default="", sa_column=Column(String(OWNER_MAX_LENGTH), nullable=False))
    until: datetime = Field(sa_column=Column(DateTime, nullable=False))
    created_at: datetime = Field(sa_column=Column(DateTime, nullable=False))
    updated_at: datetime = Field(sa_column=Column(DateTime, nullable=False))


class Item(SQLModel, table=True):
    """One unit of work inside a partition, with its opaque bytes."""

    __tablename__ = "items"
    __table_args__ = (Index("ix_items_ready", "partition_id", "status", "gate", "retry_at"),)

    partition_id: str = Field(sa_column=Column(String(ID_MAX_LENGTH), primary_key=True))
    id: str = Field(sa_column=Column(String(ID_MAX_LENGTH), primary_key=True))
    version: int = Field(default=1, sa_column=Column(Integer, nullable=False))
    gate: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    status: str = Field(default=Status.AVAILABLE, sa_column=Column(String(16), nullable=False))
    data: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    attempts: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    last_error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    retry_at: datetime = Field(sa_column=Column(DateTime, nullable=False))
    created_at: datetime = Field(sa_column=Column(DateTime, nullable=False))
    updated_at: datetime = Field(sa_column=Column(DateTime, nullable=False))
