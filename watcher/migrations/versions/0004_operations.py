"""Operating statefeed: indexes for retention and paged listings, and the leaders table.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23

Two indexes on ``partitions``: ``(status, updated_at)`` answers retention's
"finished partitions last updated before the cutoff" and the per-status
gauges; ``(created_at, id)`` answers the paged listing, newest first. On
PostgreSQL both are built with ``CREATE INDEX CONCURRENTLY``, so processors
keep renewing leases while they build. The new ``leaders`` table holds one
row per duty that one processor at a time performs (background retention)
and who holds it until when. The types are spelled out here rather than
imported from :mod:`watcher.models`, as in revision 0001.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import mssql, mysql

from watcher.migrations.existing import table_exists
from watcher.migrations.indexes import create_index_online

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

ID_LENGTH = 255
MYSQL = ("mysql", "mariadb")
TABLE_OPTIONS: dict[str, Any] = {
    f"{name}_{option}": value
    for name in MYSQL
    for option, value in (("engine", "InnoDB"), ("charset", "utf8mb4"))
}
INDEXES = {"ix_partitions_updated": ["status", "updated_at"],
           "ix_partitions_created": ["created_at", "id"]}


def _key() -> sa.types.TypeEngine[Any]:
    return (
        sa.Unicode(ID_LENGTH)
        .with_variant(mysql.VARCHAR(ID_LENGTH, collation="utf8mb4_bin"), *MYSQL)
        .with_variant(mssql.NVARCHAR(ID_LENGTH, collation="Latin1_General_100_BIN2"), "mssql")
    )


def _time() -> sa.types.TypeEngine[Any]:
    return (
        sa.DateTime()
        .with_variant(mysql.DATETIME(fsp=6), *MYSQL)
        .with_variant(mssql.DATETIME2(precision=6), "mssql")
    )


def upgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    # A run cut short during the index builds below committed this table already.
    if not table_exists(f"{prefix}leaders"):
        _create_leaders(prefix)
    for name, columns in INDEXES.items():
        create_index_online(f"{prefix}{name}", f"{prefix}partitions", columns)


def _create_leaders(prefix: str) -> None:
    op.create_table(
        f"{prefix}leaders",
        sa.Column("name", _key(), primary_key=True),
        sa.Column("owner", _key(), nullable=False),
        sa.Column("until", _time(), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("updated_at", _time(), nullable=False),
        **TABLE_OPTIONS,
    )


def downgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    for name in reversed(INDEXES):
        op.drop_index(f"{prefix}{name}", table_name=f"{prefix}partitions")
    op.drop_table(f"{prefix}leaders")
