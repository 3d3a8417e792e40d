"""The notifications' outbox table (revision 0015) and the states of a delivery.

Beside :mod:`watcher.models`, whose tables it shares the column types of.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from sqlalchemy import Column, Index, Integer, Unicode
from sqlmodel import Field, SQLModel

from watcher.models import (
    ID_MAX_LENGTH,
    MYSQL_TABLE_OPTIONS,
    NOTIFY_URL_MAX_LENGTH,
    OWNER_MAX_LENGTH,
    STATUS_MAX_LENGTH,
    data_type,
    error_type,
    key_type,
    timestamp_type,
)


class DeliveryState(StrEnum):
    """Where a notification's delivery stands."""

    PENDING = "pending"  # to be sent (again) at next_at
    DELIVERED = "delivered"  # the receiver answered 2xx
    DEAD = "dead"  # given up: attempts or age ran out, or the receiver refused it


EVENT_ID_LENGTH = 64
DELIVERY_STATE_LENGTH = 16


class Notification(SQLModel, table=True):
    """The outbox: one row per partition end (complete, failed, cancelled) of a
    partition that names a ``notify`` URL, written in the transaction that ends it
    (revision 0015).

    ``seq`` orders the events; a partition's events are sent in that order.
    ``target``, ``status`` and ``gate`` are the partition's at the end, copied so a
    deleted partition's event is still sent. ``next_at`` is when the next attempt
    may start by the database clock; a delivery loop that claims the row moves it a
    lease ahead (``owner``), so a processor killed mid-delivery leaves it to be
    claimed again once that passes. ``body`` is the event as first sent (frozen:
    every retry sends the same bytes). ``ix_notifications_due`` (state, next_at)
    serves the claim; ``ix_notifications_partition`` the order check.
    """

    __tablename__ = "notifications"
    __table_args__ = (Index("ix_notifications_due", "state", "next_at"),
                      Index("ix_notifications_partition", "partition_id", "seq"),
                      MYSQL_TABLE_OPTIONS)

    seq: int | None = Field(default=None, sa_column=Column(Integer, primary_key=True,
                                                           autoincrement=True))
    # A random UUID, unique by construction: the receiver's deduplication key.
    event_id: str = Field(sa_column=Column(Unicode(EVENT_ID_LENGTH), nullable=False))
    partition_id: str = Field(sa_column=Column(key_type(ID_MAX_LENGTH), nullable=False))
    target: str = Field(sa_column=Column(Unicode(NOTIFY_URL_MAX_LENGTH), nullable=False))
    status: str = Field(sa_column=Column(Unicode(STATUS_MAX_LENGTH), nullable=False))
    gate: int = Field(sa_column=Column(Integer, nullable=False))
    state: str = Field(sa_column=Column(Unicode(DELIVERY_STATE_LENGTH), nullable=False))
    version: int = Field(default=1, sa_column=Column(Integer, nullable=False))
    attempts: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    owner: str = Field(default="", sa_column=Column(Unicode(OWNER_MAX_LENGTH), nullable=False))
    next_at: datetime = Field(sa_column=Column(timestamp_type(), nullable=False))
    body: bytes | None = Field(default=None, sa_column=Column(data_type(), nullable=True))
    last_error: str | None = Field(default=None,
                                   sa_column=Column(error_type(), nullable=True))
    created_at: datetime = Field(sa_column=Column(timestamp_type(), nullable=False))
    updated_at: datetime = Field(sa_column=Column(timestamp_type(), nullable=False))
