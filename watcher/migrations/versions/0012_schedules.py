"""Schedules: a partition created at each tick of a cron expression or an interval.

Revision ID: 0012_schedules
Revises: 0010
Create Date: 2026-11-28

- ``schedules``: one row per schedule: its timing (``cron`` and ``timezone``, or
  ``every`` seconds), its catch-up policy, ``no_overlap``, the items and
  partition settings each tick's partition gets, its ``next_at`` tick (indexed:
  the ticker reads the due schedules through ``ix_schedules_due``), its
  ``last_tick`` and ``last_partition``, a pause, and a ``version`` that guards
  each tick's write.

A new table only: nothing existing is rewritten or locked, so it is online on
every database.

The types are spelled out here rather than imported from :mod:`watcher.models`.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import mssql, mysql

revision = "0012_schedules"
down_revision = "0011"
branch_labels = None
depends_on = None

MYSQL = ("mysql", "mariadb")
ID_LENGTH = 255


def _time() -> sa.types.TypeEngine[Any]:
    return (sa.DateTime()
            .with_variant(mysql.DATETIME(fsp=6), *MYSQL)
            .with_variant(mssql.DATETIME2(precision=6), "mssql"))


def _key() -> sa.types.TypeEngine[Any]:
    return (
        sa.Unicode(ID_LENGTH)
        .with_variant(mysql.VARCHAR(ID_LENGTH, collation="utf8mb4_bin"), *MYSQL)
        .with_variant(mssql.NVARCHAR(ID_LENGTH, collation="Latin1_General_100_BIN2"), "mssql")
    )


def _data() -> sa.types.TypeEngine[Any]:
    return (sa.LargeBinary()
            .with_variant(mysql.LONGBLOB(), *MYSQL)
            .with_variant(mssql.VARBINARY("max"), "mssql"))


def upgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    options: dict[str, Any] = {f"{name}_{option}": value for name in MYSQL
               for option, value in (("engine", "InnoDB"), ("charset", "utf8mb4"))}
    table = f"{prefix}schedules"
    op.create_table(
        table,
        sa.Column("name", _key(), primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("cron", sa.Unicode(255), nullable=True),
        sa.Column("timezone", sa.Unicode(64), nullable=False),
        sa.Column("every", sa.Float, nullable=True),
        sa.Column("catch_up", sa.Unicode(8), nullable=False),
        sa.Column("no_overlap", sa.Integer, nullable=False),
        sa.Column("items", _data(), nullable=False),
        sa.Column("item_count", sa.Integer, nullable=False),
        sa.Column("reduce_gates", sa.Unicode(1000), nullable=True),
        sa.Column("on_item_failure", sa.Unicode(16), nullable=False),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("flow_key", _key(), nullable=False),
        sa.Column("created_at", _time(), nullable=False),
        sa.Column("counted_from", _time(), nullable=False),
        sa.Column("next_at", _time(), nullable=True),
        sa.Column("last_tick", _time(), nullable=True),
        sa.Column("last_partition", _key(), nullable=True),
        sa.Column("paused_at", _time(), nullable=True),
        sa.Column("updated_at", _time(), nullable=False),
        **options,
    )
    op.create_index(f"{prefix}ix_schedules_due", table, ["next_at"])


def downgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    op.drop_index(f"{prefix}ix_schedules_due", table_name=f"{prefix}schedules")
    op.drop_table(f"{prefix}schedules")
