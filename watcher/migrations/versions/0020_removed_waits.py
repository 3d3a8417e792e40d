"""Removed waits: the tokens of waits whose item was deleted answer "already completed".

Revision ID: 0020_removed_waits
Revises: 0019_processors
Create Date: 2026-11-29

- ``removed_waits``: one row per token key (a handler's or an operator's) of a wait
  whose item was deleted (``processor delete``, partition retention, item retention),
  with the database clock's time of the delete. A completion with such a token gets
  409 ``already_completed`` (the item was deleted) rather than 404, so an outside
  system stops calling back. A purge removes rows older than 30 days, through
  ``ix_removed_waits_at``.

A new table, empty, with its index: instant on every supported database. The types are
spelled out here rather than imported from :mod:`watcher.models`.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import mssql, mysql

from watcher.migrations.existing import table_exists

revision = "0020_removed_waits"
down_revision = "0019_processors"
branch_labels = None
depends_on = None

MYSQL = ("mysql", "mariadb")
TOKEN_LENGTH = 64


def _time() -> sa.types.TypeEngine[Any]:
    return (sa.DateTime()
            .with_variant(mysql.DATETIME(fsp=6), *MYSQL)
            .with_variant(mssql.DATETIME2(precision=6), "mssql"))


def _key() -> sa.types.TypeEngine[Any]:
    return (
        sa.Unicode(TOKEN_LENGTH)
        .with_variant(mysql.VARCHAR(TOKEN_LENGTH, collation="utf8mb4_bin"), *MYSQL)
        .with_variant(mssql.NVARCHAR(TOKEN_LENGTH, collation="Latin1_General_100_BIN2"),
                      "mssql")
    )


def upgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    table = f"{prefix}removed_waits"
    if table_exists(table):
        return
    options: dict[str, Any] = {f"{name}_{option}": value for name in MYSQL
                               for option, value in (("engine", "InnoDB"),
                                                     ("charset", "utf8mb4"))}
    op.create_table(
        table,
        sa.Column("token", _key(), primary_key=True),
        sa.Column("removed_at", _time(), nullable=False),
        **options,
    )
    op.create_index(f"{prefix}ix_removed_waits_at", table, ["removed_at"])


def downgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    op.drop_index(f"{prefix}ix_removed_waits_at", table_name=f"{prefix}removed_waits")
    op.drop_table(f"{prefix}removed_waits")
