"""Reduce spawns: which reduce spawned an item, and an index of a partition's spawned items.

Revision ID: 0018_reduce_spawns
Revises: 0017_schedule_settings
Create Date: 2026-11-29

- ``items.spawned_by_reduce``: the gate of the reduce whose answer spawned the item;
  NULL for the client's items and those an item spawned (``items.parent`` names
  that item). A rewind to a gate at or before that reduce removes the item, with
  what it spawned in turn, in its transaction: the reduce runs again and spawns it
  afresh.
- ``ix_items_spawned`` on ``(partition_id, parent, spawned_by_reduce)``: a rewind
  reads a partition's spawned items through it, those an item spawned (``parent``
  set) and those a reduce spawned (``parent`` NULL, ``spawned_by_reduce`` set), as
  ranges of the index, without reading the partition's other items. On PostgreSQL
  and SQLite it is partial: it holds the spawned items only, so writing the others
  costs nothing more, and a planner without statistics (a table filled moments ago)
  never takes it for the hot path's lookups by partition. MariaDB has no partial
  index, and SQL Server's filtered ones take no ``OR``: there it holds every item.

Existing rows stay as they are: the column is NULL on every item written before, so
an item a reduce spawned before this revision cannot be told from a client's, and a
rewind keeps it as it did before. A nullable column is a metadata-only change on
every supported database. The index is built online (``CONCURRENTLY`` on
PostgreSQL), so item writes go on while it builds. The type is spelled out here
rather than imported from :mod:`watcher.models`.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

from watcher.migrations.existing import column_exists
from watcher.migrations.indexes import create_index_online

revision = "0018_reduce_spawns"
down_revision = "0017_schedule_settings"
branch_labels = None
depends_on = None

# The rows the index holds on PostgreSQL and SQLite: spawned items only.
SPAWNED_ONLY = sa.text("parent IS NOT NULL OR spawned_by_reduce IS NOT NULL")


def upgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    table = f"{prefix}items"
    # A run cut short during the index build below committed the column already.
    if not column_exists(table, "spawned_by_reduce"):
        op.add_column(table, sa.Column("spawned_by_reduce", sa.Integer, nullable=True))
    # Last: on PostgreSQL it commits the column and builds the index CONCURRENTLY.
    create_index_online(f"{prefix}ix_items_spawned", table,
                        ["partition_id", "parent", "spawned_by_reduce"],
                        postgresql_where=SPAWNED_ONLY, sqlite_where=SPAWNED_ONLY)


def downgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    op.drop_index(f"{prefix}ix_items_spawned", table_name=f"{prefix}items")
    with op.batch_alter_table(f"{prefix}items") as batch:
        batch.drop_column("spawned_by_reduce")
