"""The tokens of waits whose item was deleted (revision 0020), beside
:mod:`watcher.models`, whose column types it shares; the statements that use it are in
:mod:`watcher.store.removal` and :mod:`watcher.store.waits`."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Column, Index
from sqlmodel import Field, SQLModel

from watcher.models import MYSQL_TABLE_OPTIONS, TOKEN_HASH_LENGTH, key_type, timestamp_type


class RemovedWait(SQLModel, table=True):
    """The key of one token (a handler's or an operator's) whose wait's item was deleted
    (by ``processor delete``, partition retention or item retention), and when.

    A completion with that token is told the wait is over (409 ``already_completed``,
    "the item was deleted"), not that the token is unknown, so an outside system that
    calls back late stops retrying. Rows older than :data:`REMOVED_WAITS_KEPT` go in
    the next purge (``processor purge``, or retention's pass); after that the token is
    unknown (404).
    """

    __tablename__ = "removed_waits"
    __table_args__ = (Index("ix_removed_waits_at", "removed_at"), MYSQL_TABLE_OPTIONS)

    token: str = Field(sa_column=Column(key_type(TOKEN_HASH_LENGTH), primary_key=True))
    removed_at: datetime = Field(sa_column=Column(timestamp_type(), nullable=False))


# How long the token of a deleted item's wait answers "already completed": 30 days.
REMOVED_WAITS_KEPT = 30 * 24 * 3600.0
