"""Observe: trace context, a partition's timeline, each item's error history.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26

- ``partitions.trace_context``: the W3C trace context (``traceparent`` and
  ``tracestate``, as JSON) of the caller that created the partition, so handler
  calls can link to it; NULL when tracing was off.
- ``partitions.timeline``: a bounded JSON record of when each gate began and
  ended and of items written per minute, written by the lease holder when a
  gate moves and when it renews its lease; NULL until then.
- ``items.error_history``: the item's last few errors (JSON, each with the time
  by the database clock, attempt and gate); NULL while it has none.
- ``ix_items_id``: finds an item by id across partitions (the console's search
  and ``processor items --find``) without scanning the table. It holds the
  partition too, so a lookup by the whole key through it is as exact as through
  the primary key, however many partitions share an item id.

Nullable columns are metadata-only changes on every supported database. The
index is built online (``CONCURRENTLY`` on PostgreSQL), so item writes go on while
it builds. The types are spelled out here rather than imported from
:mod:`watcher.models`.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import mssql

from watcher.migrations.existing import column_exists
from watcher.migrations.indexes import create_index_online

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def _text() -> sa.types.TypeEngine[Any]:
    return sa.UnicodeText().with_variant(mssql.NVARCHAR(), "mssql")


def upgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    # A run cut short during the index build below committed these columns already.
    for table, column in (("partitions", "trace_context"), ("partitions", "timeline"),
                          ("items", "error_history")):
        if not column_exists(f"{prefix}{table}", column):
            op.add_column(f"{prefix}{table}", sa.Column(column, _text(), nullable=True))
    # Last: on PostgreSQL it commits the columns and builds the index CONCURRENTLY.
    create_index_online(f"{prefix}ix_items_id", f"{prefix}items", ["id", "partition_id"])


def downgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    op.drop_index(f"{prefix}ix_items_id", table_name=f"{prefix}items")
    with op.batch_alter_table(f"{prefix}items") as batch:
        batch.drop_column("error_history")
    with op.batch_alter_table(f"{prefix}partitions") as batch:
        batch.drop_column("timeline")
        batch.drop_column("trace_context")
