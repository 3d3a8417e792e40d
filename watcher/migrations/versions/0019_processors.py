"""Processors: each running processor and the places it serves.

Revision ID: 0019_processors
Revises: 0018_reduce_spawns
Create Date: 2026-12-05

- ``processors``: one row per running processor (``owner``, its owner id), written at
  its first lease cycle and every renew interval, rewritten when its routes change,
  deleted when it stops cleanly. ``serves`` is JSON of the (pipeline, version, gates)
  tables it serves, NULL when it serves everything; ``until`` is set by the database
  clock as a lease's is: a row past it does not count as live. ``processor status``,
  the console and the ``statefeed_partitions_unserved`` gauge read it to show the
  open partitions whose place no live processor serves.

A new, small table (one row per processor): instant on every supported database.
The types are spelled out here rather than imported from :mod:`watcher.models`.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import mssql, mysql

from watcher.migrations.existing import table_exists

revision = "0019_processors"
down_revision = "0018_reduce_spawns"
branch_labels = None
depends_on = None

MYSQL = ("mysql", "mariadb")
OWNER_LENGTH = 255


def _time() -> sa.types.TypeEngine[Any]:
    return (sa.DateTime()
            .with_variant(mysql.DATETIME(fsp=6), *MYSQL)
            .with_variant(mssql.DATETIME2(precision=6), "mssql"))


def _key() -> sa.types.TypeEngine[Any]:
    return (
        sa.Unicode(OWNER_LENGTH)
        .with_variant(mysql.VARCHAR(OWNER_LENGTH, collation="utf8mb4_bin"), *MYSQL)
        .with_variant(mssql.NVARCHAR(OWNER_LENGTH, collation="Latin1_General_100_BIN2"),
                      "mssql")
    )


def _text() -> sa.types.TypeEngine[Any]:
    return (sa.UnicodeText()
            .with_variant(mysql.MEDIUMTEXT(), *MYSQL)
            .with_variant(mssql.NVARCHAR(), "mssql"))


def upgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    table = f"{prefix}processors"
    if table_exists(table):
        return
    options: dict[str, Any] = {f"{name}_{option}": value for name in MYSQL
                               for option, value in (("engine", "InnoDB"),
                                                     ("charset", "utf8mb4"))}
    op.create_table(
        table,
        sa.Column("owner", _key(), primary_key=True),
        sa.Column("serves", _text(), nullable=True),
        sa.Column("until", _time(), nullable=False),
        sa.Column("updated_at", _time(), nullable=False),
        **options,
    )


def downgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    op.drop_table(f"{prefix}processors")
