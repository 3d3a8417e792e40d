"""Wait links: the parking call's trace context, and an operator's completion token.

Revision ID: 0014_wait_links
Revises: 0012_schedules
Create Date: 2026-11-28

- ``waits.traceparent``: the W3C ``traceparent`` of the call span that received
  the parking answer (or of the caller whose completion parked the item again),
  so the span of the completion links to it; NULL when tracing was off.
- ``waits.operator_token``: the SHA-256 (hex) of a second completion token for
  the same wait, minted when an operator asks the console for a completion URL;
  asking again replaces it. NULL until then. Either token completes the wait,
  exactly once, as the handler's does.
- ``ix_waits_operator``: finds a wait by its operator token's hash.

Nullable columns are metadata-only changes on every supported database. The index
is built online (``CONCURRENTLY`` on PostgreSQL), so parking writes go on while it
builds. The types are spelled out here rather than imported from
:mod:`watcher.models`.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import mssql, mysql

from watcher.migrations.existing import column_exists
from watcher.migrations.indexes import create_index_online

revision = "0014_wait_links"
down_revision = "0012_schedules"
branch_labels = None
depends_on = None

MYSQL = ("mysql", "mariadb")
TOKEN_LENGTH = 64
TRACEPARENT_LENGTH = 64


def _key(length: int) -> sa.types.TypeEngine[Any]:
    return (
        sa.Unicode(length)
        .with_variant(mysql.VARCHAR(length, collation="utf8mb4_bin"), *MYSQL)
        .with_variant(mssql.NVARCHAR(length, collation="Latin1_General_100_BIN2"), "mssql")
    )


def upgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    table = f"{prefix}waits"
    # A run cut short during the index build below committed these columns already.
    for column, length in (("traceparent", TRACEPARENT_LENGTH),
                           ("operator_token", TOKEN_LENGTH)):
        if not column_exists(table, column):
            op.add_column(table, sa.Column(column, _key(length), nullable=True))
    # Last: on PostgreSQL it commits the columns and builds the index CONCURRENTLY.
    create_index_online(f"{prefix}ix_waits_operator", table, ["operator_token"])


def downgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    op.drop_index(f"{prefix}ix_waits_operator", table_name=f"{prefix}waits")
    with op.batch_alter_table(f"{prefix}waits") as batch:
        batch.drop_column("operator_token")
        batch.drop_column("traceparent")
