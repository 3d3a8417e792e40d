"""Waits: an item parks at its gate until someone outside completes it.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28

- ``waits``: one row per wait an answer began, keyed by the SHA-256 (hex) of its
  completion token (the token itself is never stored): the item it parked, the
  item's version while it waits (a completion, a timeout, a cancel or a retry
  bumps it, so a second completion finds the row and is refused as already
  completed, never applied twice), the timeout in seconds (for the timeout's
  error text and a heartbeat), what a timeout does (``retry`` or ``fail``), and
  when it began. Rows outlive their item's wait on purpose: a token used, timed
  out or replaced by a newer wait still answers "already completed".
- ``partitions.quorum``: JSON ``{gate: k}``; the gate passes once ``k`` of its
  items are complete, the others are settled as ``skipped``. NULL: every item.

A waiting item is an ``items`` row with status ``waiting``; its ``retry_at`` is
the wait's deadline, so the ready index ``(partition_id, status, gate, retry_at,
id)`` finds the expired waits of a gate without reading a completed item.

A new table and a nullable column: metadata-only on every supported database;
the index on the new table is built with it, empty.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import mssql, mysql

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

MYSQL = ("mysql", "mariadb")
ID_LENGTH = 255
TOKEN_LENGTH = 64
POLICY_LENGTH = 16
QUORUM_LENGTH = 1000


def _time() -> sa.types.TypeEngine[Any]:
    return (sa.DateTime()
            .with_variant(mysql.DATETIME(fsp=6), *MYSQL)
            .with_variant(mssql.DATETIME2(precision=6), "mssql"))


def _key(length: int = ID_LENGTH) -> sa.types.TypeEngine[Any]:
    return (
        sa.Unicode(length)
        .with_variant(mysql.VARCHAR(length, collation="utf8mb4_bin"), *MYSQL)
        .with_variant(mssql.NVARCHAR(length, collation="Latin1_General_100_BIN2"), "mssql")
    )


def upgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    options: dict[str, Any] = {f"{name}_{option}": value for name in MYSQL
               for option, value in (("engine", "InnoDB"), ("charset", "utf8mb4"))}
    op.create_table(
        f"{prefix}waits",
        sa.Column("token", _key(TOKEN_LENGTH), primary_key=True),
        sa.Column("partition_id", _key(), nullable=False),
        sa.Column("item_id", _key(), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("timeout", sa.Float, nullable=False),
        sa.Column("on_timeout", sa.Unicode(POLICY_LENGTH), nullable=False),
        sa.Column("created_at", _time(), nullable=False),
        **options,
    )
    op.create_index(f"{prefix}ix_waits_item", f"{prefix}waits",
                    ["partition_id", "item_id", "version"])
    op.add_column(f"{prefix}partitions",
                  sa.Column("quorum", sa.Unicode(QUORUM_LENGTH), nullable=True))


def downgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    with op.batch_alter_table(f"{prefix}partitions") as batch:
        batch.drop_column("quorum")
    op.drop_index(f"{prefix}ix_waits_item", table_name=f"{prefix}waits")
    op.drop_table(f"{prefix}waits")
