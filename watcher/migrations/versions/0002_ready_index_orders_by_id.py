"""Add the item id to the ready-items index, so a read of ready items stops at its limit.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22

The ready read orders by (retry_at, id). With the index ending at retry_at,
PostgreSQL had to fetch and sort every available item of the gate to return
the first few, which costs time in proportion to the partition's backlog;
with id in the index the scan returns rows already in order and stops at the
limit. (InnoDB appends the primary key to every secondary index, so on MySQL
and MariaDB this changes nothing but the name's definition.) On PostgreSQL the
new index is built with ``CREATE INDEX CONCURRENTLY`` beside the old one, so
processors keep reading and writing while it builds.
"""

from __future__ import annotations

from alembic import context

from watcher.migrations.indexes import rebuild_index

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

OLD_COLUMNS = ["partition_id", "status", "gate", "retry_at"]
NEW_COLUMNS = [*OLD_COLUMNS, "id"]


def _rebuild(columns: list[str]) -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    rebuild_index(f"{prefix}ix_items_ready", f"{prefix}items", columns)


def upgrade() -> None:
    _rebuild(NEW_COLUMNS)


def downgrade() -> None:
    _rebuild(OLD_COLUMNS)
