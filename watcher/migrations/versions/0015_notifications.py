"""Notifications: an outbox of partition ends, and the URL a partition notifies.

Revision ID: 0015_notifications
Revises: 0014_wait_links
Create Date: 2026-11-28

- ``partitions.notify``: the http(s) URL POSTed a signed event when the partition
  ends (complete, failed or cancelled); NULL: none.
- ``notifications``: the outbox. One row per end of a partition that names a
  URL, written in the transaction that ends it: the event's random id, the
  partition, the URL, the status and gate it ended with, the delivery state
  (``pending``, ``delivered``, ``dead``), attempts, the next attempt's time by the
  database clock (``ix_notifications_due`` on (state, next_at) serves the delivery
  loop's claim), the lease holder, the body as first sent, and the last error.
  ``ix_notifications_partition`` (partition_id, seq) keeps a partition's events in
  order.

A new table and a nullable column: metadata-only on every supported database (a
nullable column without a default rewrites nothing on PostgreSQL, and is instant
on MariaDB); the indexes on the new table are built with it, empty.

The types are spelled out here rather than imported from :mod:`watcher.models`.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import mssql, mysql

revision = "0015_notifications"
down_revision = "0014_wait_links"
branch_labels = None
depends_on = None

MYSQL = ("mysql", "mariadb")
ID_LENGTH = 255
URL_LENGTH = 2000


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


def _text() -> sa.types.TypeEngine[Any]:
    return sa.UnicodeText().with_variant(mssql.NVARCHAR(), "mssql")


def upgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    options: dict[str, Any] = {f"{name}_{option}": value for name in MYSQL
               for option, value in (("engine", "InnoDB"), ("charset", "utf8mb4"))}
    table = f"{prefix}notifications"
    op.create_table(
        table,
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.Unicode(64), nullable=False),
        sa.Column("partition_id", _key(), nullable=False),
        sa.Column("target", sa.Unicode(URL_LENGTH), nullable=False),
        sa.Column("status", sa.Unicode(16), nullable=False),
        sa.Column("gate", sa.Integer, nullable=False),
        sa.Column("state", sa.Unicode(16), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("owner", sa.Unicode(255), nullable=False),
        sa.Column("next_at", _time(), nullable=False),
        sa.Column("body", _data(), nullable=True),
        sa.Column("last_error", _text(), nullable=True),
        sa.Column("created_at", _time(), nullable=False),
        sa.Column("updated_at", _time(), nullable=False),
        **options,
    )
    op.create_index(f"{prefix}ix_notifications_due", table, ["state", "next_at"])
    op.create_index(f"{prefix}ix_notifications_partition", table, ["partition_id", "seq"])
    op.add_column(f"{prefix}partitions",
                  sa.Column("notify", sa.Unicode(URL_LENGTH), nullable=True))


def downgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    with op.batch_alter_table(f"{prefix}partitions") as batch:
        batch.drop_column("notify")
    op.drop_index(f"{prefix}ix_notifications_partition", table_name=f"{prefix}notifications")
    op.drop_index(f"{prefix}ix_notifications_due", table_name=f"{prefix}notifications")
    op.drop_table(f"{prefix}notifications")
