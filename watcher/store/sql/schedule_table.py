"""The schedules' table (revision 0012, with each tick's notify URL and pipeline from
revision 0017), beside :mod:`watcher.models`, whose column types it shares; the
statements that use it are in :mod:`watcher.store.schedules`."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Column, Float, Index, Integer, Unicode, text
from sqlmodel import Field, SQLModel

from watcher.models import (
    ID_MAX_LENGTH,
    MYSQL_TABLE_OPTIONS,
    NOTIFY_URL_MAX_LENGTH,
    PIPELINE_MAX_LENGTH,
    POLICY_MAX_LENGTH,
    REDUCE_GATES_MAX_LENGTH,
    data_type,
    key_type,
    timestamp_type,
)
from watcher.records import DEFAULT_PIPELINE

CRON_MAX_LENGTH = 255
TIMEZONE_MAX_LENGTH = 64
CATCH_UP_MAX_LENGTH = 8


class Schedule(SQLModel, table=True):
    """A schedule: a partition created at each tick of a cron expression (in a time zone)
    or of a fixed interval (revision 0012_schedules).

    ``next_at`` is its next tick (naive UTC); the ticker's one read per poll takes
    the schedules whose ``next_at`` has passed by the database clock through
    ``ix_schedules_due``. ``last_tick`` is the latest tick handled (created or
    passed over), written in the transaction that creates its partition, guarded
    by ``version``; ``counted_from`` is when it began counting ticks (its creation,
    or its last resume); ``last_partition`` the partition its latest created tick
    made. ``items`` holds the items each tick's partition gets, as JSON; the
    partition settings are columns, as on ``partitions`` (``notify``, ``pipeline`` and
    ``pipeline_version`` from revision 0017).
    """

    __tablename__ = "schedules"
    __table_args__ = (Index("ix_schedules_due", "next_at"), MYSQL_TABLE_OPTIONS)

    name: str = Field(sa_column=Column(key_type(ID_MAX_LENGTH), primary_key=True))
    version: int = Field(default=1, sa_column=Column(Integer, nullable=False))
    cron: str | None = Field(default=None,
                             sa_column=Column(Unicode(CRON_MAX_LENGTH), nullable=True))
    timezone: str = Field(default="UTC",
                          sa_column=Column(Unicode(TIMEZONE_MAX_LENGTH), nullable=False))
    every: float | None = Field(default=None, sa_column=Column(Float, nullable=True))
    catch_up: str = Field(sa_column=Column(Unicode(CATCH_UP_MAX_LENGTH), nullable=False))
    no_overlap: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    items: bytes = Field(sa_column=Column(data_type(), nullable=False))
    item_count: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    reduce_gates: str | None = Field(
        default=None, sa_column=Column(Unicode(REDUCE_GATES_MAX_LENGTH), nullable=True))
    on_item_failure: str = Field(sa_column=Column(Unicode(POLICY_MAX_LENGTH), nullable=False))
    priority: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    flow_key: str = Field(default="", sa_column=Column(key_type(ID_MAX_LENGTH), nullable=False))
    created_at: datetime = Field(sa_column=Column(timestamp_type(), nullable=False))
    counted_from: datetime = Field(sa_column=Column(timestamp_type(), nullable=False))
    next_at: datetime | None = Field(default=None,
                                     sa_column=Column(timestamp_type(), nullable=True))
    last_tick: datetime | None = Field(default=None,
                                       sa_column=Column(timestamp_type(), nullable=True))
    last_partition: str | None = Field(
        default=None, sa_column=Column(key_type(ID_MAX_LENGTH), nullable=True))
    paused_at: datetime | None = Field(default=None,
                                       sa_column=Column(timestamp_type(), nullable=True))
    updated_at: datetime = Field(sa_column=Column(timestamp_type(), nullable=False))
    # What each tick's partition names as a partition does (revision 0017): its notify
    # URL, its pipeline and the pipeline version it keeps (NULL: pinned at first lease).
    notify: str | None = Field(
        default=None, sa_column=Column(Unicode(NOTIFY_URL_MAX_LENGTH), nullable=True))
    pipeline: str = Field(default=DEFAULT_PIPELINE, sa_column=Column(
        key_type(PIPELINE_MAX_LENGTH), nullable=False, server_default=text("'default'")))
    pipeline_version: str | None = Field(
        default=None, sa_column=Column(key_type(PIPELINE_MAX_LENGTH), nullable=True))
