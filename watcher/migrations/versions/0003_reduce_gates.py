"""Reduce gates: the partition's reduce settings, its result and a paged reduce's progress.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22

Every column is added to ``partitions`` only, nullable or with a constant
default, so each database adds it without rewriting or scanning the table
(PostgreSQL 11+ and MariaDB 10.3+ store the default in the catalogue; SQLite
and SQL Server append the column). The types are spelled out here rather than
imported from :mod:`watcher.models`, as in revision 0001.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy import text
from sqlalchemy.dialects import mssql, mysql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

ID_LENGTH = 255
MYSQL = ("mysql", "mariadb")
COLUMNS = ("reduce_gates", "on_item_failure", "result", "reduce_pass", "reduce_page",
           "reduce_after", "reduce_acc", "reduce_attempts", "last_error")


def _key() -> sa.types.TypeEngine[Any]:
    return (
        sa.Unicode(ID_LENGTH)
        .with_variant(mysql.VARCHAR(ID_LENGTH, collation="utf8mb4_bin"), *MYSQL)
        .with_variant(mssql.NVARCHAR(ID_LENGTH, collation="Latin1_General_100_BIN2"), "mssql")
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
    with op.batch_alter_table(f"{prefix}partitions", recreate="never") as table:
        table.add_column(sa.Column("reduce_gates", sa.Unicode(1000), nullable=True))
        table.add_column(sa.Column("on_item_failure", sa.Unicode(16), nullable=False,
                                   server_default="fail"))
        table.add_column(sa.Column("result", _data(), nullable=True))
        table.add_column(sa.Column("reduce_pass", sa.Unicode(8), nullable=True))
        table.add_column(sa.Column("reduce_page", sa.Integer, nullable=False,
                                   server_default=text("0")))
        table.add_column(sa.Column("reduce_after", _key(), nullable=True))
        table.add_column(sa.Column("reduce_acc", _data(), nullable=True))
        table.add_column(sa.Column("reduce_attempts", sa.Integer, nullable=False,
                                   server_default=text("0")))
        table.add_column(sa.Column("last_error", _error(), nullable=True))


def downgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    with op.batch_alter_table(f"{prefix}partitions") as table:
        for name in reversed(COLUMNS):
            table.drop_column(name)
