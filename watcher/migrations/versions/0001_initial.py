"""Create the partitions and items tables.

Revision ID: 0001
Revises:
Create Date: 2026-11-21

The column types are spelled out here, not imported from :mod:`watcher.models`,
so that this revision keeps creating the same tables when the models change
later; ``tests/unit/test_dialects.py`` checks that the two agree.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import mssql, mysql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

ID_LENGTH = 255
STATUS_LENGTH = 16
MYSQL = ("mysql", "mariadb")
TABLE_OPTIONS: dict[str, Any] = {
    f"{name}_{option}": value
    for name in MYSQL
    for option, value in (("engine", "InnoDB"), ("charset", "utf8mb4"))
}


def _key() -> sa.types.TypeEngine[Any]:
    # Exact (binary) comparison of ids everywhere; NVARCHAR on SQL Server.
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


def _data() -> sa.types.TypeEngine[Any]:
    return (
        sa.LargeBinary()
        .with_variant(mysql.LONGBLOB(), *MYSQL)
        .with_variant(mssql.VARBINARY("max"), "mssql")
    )


def _error() -> sa.types.TypeEngine[Any]:
    return sa.UnicodeText().with_variant(mssql.NVARCHAR(), "mssql")


def upgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    op.create_table(
        f"{prefix}partitions",
        sa.Column("id", _key(), primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("gate", sa.Integer, nullable=False),
        sa.Column("status", sa.Unicode(STATUS_LENGTH), nullable=False),
        sa.Column("owner", _key(), nullable=False),
        sa.Column("until", _time(), nullable=False),
        sa.Column("created_at", _time(), nullable=False),
        sa.Column("updated_at", _time(), nullable=False),
        **TABLE_OPTIONS,
    )
    # Free and live lease scans: status = 'available' AND until <=/> now [AND owner = ?].
    op.create_index(
        f"{prefix}ix_partitions_lease", f"{prefix}partitions", ["status", "until", "owner"]
    )
    op.create_table(
        f"{prefix}items",
        sa.Column("partition_id", _key(), primary_key=True),
        sa.Column("id", _key(), primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("gate", sa.Integer, nullable=False),
        sa.Column("status", sa.Unicode(STATUS_LENGTH), nullable=False),
        sa.Column("data", _data(), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("last_error", _error(), nullable=True),
        sa.Column("retry_at", _time(), nullable=False),
        sa.Column("created_at", _time(), nullable=False),
        sa.Column("updated_at", _time(), nullable=False),
        **TABLE_OPTIONS,
    )
    # Ready items and gate summaries: partition, status, gate, ordered by retry time.
    op.create_index(
        f"{prefix}ix_items_ready",
        f"{prefix}items",
        ["partition_id", "status", "gate", "retry_at"],
    )
    if op.get_context().dialect.name == "mssql":
        # Engine writes touch one item by primary key, but a client's bulk statement
        # (retry_failed over a large partition, a large create) takes thousands of row
        # locks; escalating those to a table lock would stall every watcher's reads and
        # writes on the items table. Row locks cost memory (about 100 bytes each) instead.
        op.execute(f"ALTER TABLE {prefix}items SET (LOCK_ESCALATION = DISABLE)")


def downgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    op.drop_index(f"{prefix}ix_items_ready", table_name=f"{prefix}items")
    op.drop_table(f"{prefix}items")
    op.drop_index(f"{prefix}ix_partitions_lease", table_name=f"{prefix}partitions")
    op.drop_table(f"{prefix}partitions")
