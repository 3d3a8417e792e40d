"""Spawn: each item's parent, and each partition's count of spawned items.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24

``items.parent`` names the item whose answer spawned the row (NULL for items
the client added, and for those a reduce spawned). ``partitions.spawned``
counts the items the partition's steps and reduces spawned; it is bumped in
the transaction that inserts them. Both are added without rewriting the
tables: a nullable column, and a column with a constant default, are
metadata-only changes on PostgreSQL 11+, MariaDB 10.3+ and SQL Server
(Enterprise; a size-of-data change on other editions); SQLite copies
nothing either. The types are spelled out here rather than imported from
:mod:`watcher.models`, as in revision 0001.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import mssql, mysql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

ID_LENGTH = 255
MYSQL = ("mysql", "mariadb")


def _key() -> sa.types.TypeEngine[Any]:
    return (
        sa.Unicode(ID_LENGTH)
        .with_variant(mysql.VARCHAR(ID_LENGTH, collation="utf8mb4_bin"), *MYSQL)
        .with_variant(mssql.NVARCHAR(ID_LENGTH, collation="Latin1_General_100_BIN2"), "mssql")
    )


def upgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    op.add_column(f"{prefix}items", sa.Column("parent", _key(), nullable=True))
    op.add_column(f"{prefix}partitions",
                  sa.Column("spawned", sa.Integer, nullable=False, server_default=sa.text("0")))


def downgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    with op.batch_alter_table(f"{prefix}partitions") as batch:
        batch.drop_column("spawned")
    with op.batch_alter_table(f"{prefix}items") as batch:
        batch.drop_column("parent")
