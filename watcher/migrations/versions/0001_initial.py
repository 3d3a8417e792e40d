"""Create the partitions and items tables.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

ID_LENGTH = 255


def upgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    op.create_table(
        f"{prefix}partitions",
        sa.Column("id", sa.String(ID_LENGTH), primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("gate", sa.Integer, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("owner", sa.String(ID_LENGTH), nullable=False),
        sa.Column("until", sa.DateTime, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
    )
    op.create_index(
        f"{prefix}ix_partitions_lease", f"{prefix}partitions", ["status", "until", "owner"]
    )
    op.create_table(
        f"{prefix}items",
        sa.Column("partition_id", sa.String(ID_LENGTH), primary_key=True),
        sa.Column("id", sa.String(ID_LENGTH), primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("gate", sa.Integer, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("retry_at", sa.DateTime, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
    )
    op.create_index(
        f"{prefix}ix_items_ready",
        f"{prefix}items",
        ["partition_id", "status", "gate", "retry_at"],
    )


def downgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    op.drop_index(f"{prefix}ix_items_ready", table_name=f"{prefix}items")
    op.drop_table(f"{prefix}items")
    op.drop_index(f"{prefix}ix_partitions_lease", table_name=f"{prefix}partitions")
    op.drop_table(f"{prefix}partitions")
