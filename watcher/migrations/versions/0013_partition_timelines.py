"""Partition timelines out of the partition row: ``partition_timelines``.

Revision ID: 0013_partition_timelines
Revises: 0012_schedules
Create Date: 2026-11-28

- ``partition_timelines``: one row per partition, keyed by its id, holding the
  timeline (bounded JSON of gate times and items done per minute,
  :mod:`watcher.rules.timeline`) that ``partitions.timeline`` held. The partition
  row is rewritten by every lease take, renewal, close and re-open; with a
  kilobyte of timeline in it, each of those left a kilobyte-sized dead version
  behind, and the pages filled too fast for HOT updates. The timeline is written
  only when it changes (a gate move, a close, a renewal carrying items done), so it
  lives apart now. On PostgreSQL the new table keeps half of each page free
  (``fillfactor = 50``): its one index is the key, which no write changes, so
  every rewrite can be a HOT update when the page has room.
- Every partition's timeline is copied into it (one ``INSERT ... SELECT``: it reads
  ``partitions`` without blocking its writers). ``partitions.timeline`` stays, no
  longer written, so an older processor still running through the upgrade does not
  fail; a partition such a processor creates meanwhile gets its row at its first
  timeline write.

A new table and a copy: nothing existing is rewritten or locked against writes,
so it is online on every database. The types are spelled out here rather than
imported from :mod:`watcher.models`.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import mssql, mysql

revision = "0013_partition_timelines"
down_revision = "0012_schedules"
branch_labels = None
depends_on = None

MYSQL = ("mysql", "mariadb")
ID_LENGTH = 255
FILLFACTOR = 50


def _key() -> sa.types.TypeEngine[Any]:
    return (
        sa.Unicode(ID_LENGTH)
        .with_variant(mysql.VARCHAR(ID_LENGTH, collation="utf8mb4_bin"), *MYSQL)
        .with_variant(mssql.NVARCHAR(ID_LENGTH, collation="Latin1_General_100_BIN2"), "mssql")
    )


def _text() -> sa.types.TypeEngine[Any]:
    return sa.UnicodeText().with_variant(mssql.NVARCHAR(), "mssql")


def upgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    options: dict[str, Any] = {f"{name}_{option}": value for name in MYSQL
               for option, value in (("engine", "InnoDB"), ("charset", "utf8mb4"))}
    if op.get_context().dialect.name == "postgresql":
        options["postgresql_with"] = {"fillfactor": FILLFACTOR}
    table = f"{prefix}partition_timelines"
    op.create_table(
        table,
        sa.Column("partition_id", _key(), primary_key=True),
        sa.Column("timeline", _text(), nullable=True),
        **options,
    )
    op.execute(f"INSERT INTO {table} (partition_id, timeline) "
               f"SELECT id, timeline FROM {prefix}partitions")


def downgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    table = f"{prefix}partition_timelines"
    op.execute(f"UPDATE {prefix}partitions SET timeline = (SELECT t.timeline FROM {table} t "
               f"WHERE t.partition_id = {prefix}partitions.id)")
    op.drop_table(table)
