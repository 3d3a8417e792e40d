"""Table objects for a table prefix, and validation of the prefix itself."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from sqlalchemy import MetaData, Table
from sqlalchemy.sql.elements import quoted_name
from sqlmodel import SQLModel

from watcher.errors import ConfigError
from watcher.models import (
    FlowControl,
    FlowGrant,
    Item,
    Leader,
    Partition,
    Wait,
)
from watcher.outbox import Notification
from watcher.store.sql.processors_table import ProcessorRow
from watcher.store.sql.removed_waits_table import RemovedWait
from watcher.store.sql.schedule_table import Schedule
from watcher.store.sql.timeline_table import PartitionTimeline

TABLE_PREFIX_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,29}$")


def validate_table_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is a safe table prefix.

    Raises:
        ConfigError: the prefix is not empty and does not match ``[a-z][a-z0-9_]{0,29}``.
    """
    if prefix == "" or TABLE_PREFIX_PATTERN.fullmatch(prefix):
        return prefix
    raise ConfigError(
        f"invalid table prefix {prefix!r}: use 1 to 30 characters of lower-case letters, "
        "digits and underscores, starting with a letter (for example 'sf_'), or leave it empty"
    )


@dataclass(frozen=True)
class Tables:
    """The tables of one statefeed namespace: partitions, items, the leaders of duties
    one processor at a time performs (retention), the flow controls and grants, the
    schedules, the waits of parked items, the partitions' timelines, the
    notifications' outbox, the live processors with what they serve, and the tokens
    of waits whose item was deleted."""

    prefix: str
    partitions: Table
    items: Table
    leaders: Table
    flow_controls: Table
    flow_grants: Table
    schedules: Table
    waits: Table
    timelines: Table
    notifications: Table
    processors: Table
    removed_waits: Table

    @property
    def version_table(self) -> str:
        """The name of this namespace's Alembic version table."""
        return f"{self.prefix}alembic_version"


def _copy(table: Table, metadata: MetaData, prefix: str) -> Table:
    copied = table.to_metadata(metadata, name=f"{prefix}{table.name}")
    for index in copied.indexes:
        index.name = quoted_name(f"{prefix}{index.name}", None)
    return copied


@functools.cache
def tables_for(prefix: str = "") -> Tables:
    """Return the tables for ``prefix`` ("" gives the plain SQLModel tables).

    Raises:
        ConfigError: the prefix is invalid.
    """
    validate_table_prefix(prefix)
    plain = [_table_of(model)
             for model in (Partition, Item, Leader, FlowControl, FlowGrant, Schedule, Wait,
                           PartitionTimeline, Notification, ProcessorRow, RemovedWait)]
    if prefix == "":
        return Tables("", *plain)
    metadata = MetaData()
    return Tables(prefix, *(_copy(table, metadata, prefix) for table in plain))


def _table_of(model: type[SQLModel]) -> Table:
    """The table SQLModel made for ``model`` (its registry names it by ``__tablename__``)."""
    return SQLModel.metadata.tables[str(model.__tablename__)]
