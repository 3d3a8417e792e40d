"""Schedules carry a notify URL, a pipeline and a pipeline version to each tick's partition.

Revision ID: 0017_schedule_settings
Revises: 0016_pipelines
Create Date: 2026-11-28

- ``schedules.notify``: the URL each tick's partition names (NULL: none), as
  ``partitions.notify`` (revision 0015).
- ``schedules.pipeline``: the pipeline each tick's partition belongs to; ``default``
  for every schedule added before, and for those that name none.
- ``schedules.pipeline_version``: the version each tick's partition keeps; NULL: a
  processor pins it at the first lease, as for a partition created without one.

Columns with a constant server default or nullable: metadata-only on PostgreSQL 11 and
later and instant on MariaDB 10.3 and later; the table is small (one row a schedule).
The types are spelled out here rather than imported from :mod:`watcher.models`.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import mssql, mysql

from watcher.migrations.existing import column_exists

revision = "0017_schedule_settings"
down_revision = "0016_pipelines"
branch_labels = None
depends_on = None

MYSQL = ("mysql", "mariadb")
NAME_LENGTH = 64
URL_LENGTH = 2000


def _key() -> sa.types.TypeEngine[Any]:
    return (
        sa.Unicode(NAME_LENGTH)
        .with_variant(mysql.VARCHAR(NAME_LENGTH, collation="utf8mb4_bin"), *MYSQL)
        .with_variant(mssql.NVARCHAR(NAME_LENGTH, collation="Latin1_General_100_BIN2"),
                      "mssql")
    )


def upgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    table = f"{prefix}schedules"
    if not column_exists(table, "notify"):
        op.add_column(table, sa.Column("notify", sa.Unicode(URL_LENGTH), nullable=True))
    if not column_exists(table, "pipeline"):
        op.add_column(table, sa.Column("pipeline", _key(), nullable=False,
                                       server_default=sa.text("'default'")))
    if not column_exists(table, "pipeline_version"):
        op.add_column(table, sa.Column("pipeline_version", _key(), nullable=True))


def downgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    with op.batch_alter_table(f"{prefix}schedules") as batch:
        batch.drop_column("pipeline_version")
        batch.drop_column("pipeline")
        batch.drop_column("notify")
