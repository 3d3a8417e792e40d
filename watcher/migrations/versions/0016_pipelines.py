"""Pipelines: the pipeline a partition belongs to, and the version it keeps.

Revision ID: 0016_pipelines
Revises: 0015_notifications
Create Date: 2026-11-28

- ``partitions.pipeline``: the pipeline whose routes serve the partition (a
  processor's routes file maps each pipeline's gates to handler URLs); ``default``
  for every partition created before, and for those that name none.
- ``partitions.pipeline_version``: the version of its pipeline the partition keeps
  until it closes or an operator moves it; NULL until a processor pins it to its
  routes' current version at the first lease (or for a pipeline without versions).

A column with a constant server default and a nullable one: metadata-only on
PostgreSQL 11 and later (the default is stored in the catalogue, no row is
rewritten) and instant on MariaDB 10.3 and later. No index: the lease reads walk
``ix_partitions_rank`` as before and test the pipeline on the rows they pass.
The types are spelled out here rather than imported from :mod:`watcher.models`.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import mssql, mysql

from watcher.migrations.existing import column_exists

revision = "0016_pipelines"
down_revision = "0015_notifications"
branch_labels = None
depends_on = None

MYSQL = ("mysql", "mariadb")
NAME_LENGTH = 64


def _key() -> sa.types.TypeEngine[Any]:
    return (
        sa.Unicode(NAME_LENGTH)
        .with_variant(mysql.VARCHAR(NAME_LENGTH, collation="utf8mb4_bin"), *MYSQL)
        .with_variant(mssql.NVARCHAR(NAME_LENGTH, collation="Latin1_General_100_BIN2"),
                      "mssql")
    )


def upgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    table = f"{prefix}partitions"
    if not column_exists(table, "pipeline"):
        op.add_column(table, sa.Column("pipeline", _key(), nullable=False,
                                       server_default=sa.text("'default'")))
    if not column_exists(table, "pipeline_version"):
        op.add_column(table, sa.Column("pipeline_version", _key(), nullable=True))


def downgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    with op.batch_alter_table(f"{prefix}partitions") as batch:
        batch.drop_column("pipeline_version")
        batch.drop_column("pipeline")
