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

from alembic import context, op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

OLD_COLUMNS = ["partition_id", "status", "gate", "retry_at"]
NEW_COLUMNS = [*OLD_COLUMNS, "id"]


def _rebuild(columns: list[str]) -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    name, table = f"{prefix}ix_items_ready", f"{prefix}items"
    if op.get_context().dialect.name != "postgresql":
        op.drop_index(name, table_name=table)
        op.create_index(name, table, columns)
        return
    # PostgreSQL builds the new index beside the old one without blocking writes
    # (CONCURRENTLY, which cannot run inside a transaction), then swaps the names:
    # the ready reads keep an index all along, and processors keep writing.
    building = f"{prefix}ix_items_ready_next"
    with op.get_context().autocommit_block():
        op.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{building}"')  # a build cut short
        op.create_index(building, table, columns, postgresql_concurrently=True)
        op.drop_index(name, table_name=table, postgresql_concurrently=True)
        op.execute(f'ALTER INDEX "{building}" RENAME TO "{name}"')


def upgrade() -> None:
    _rebuild(NEW_COLUMNS)


def downgrade() -> None:
    _rebuild(OLD_COLUMNS)
