"""Idempotent creation: each partition's request digest.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25

``partitions.request_digest`` is the SHA-256 (hex) of the ingest API request
that created the partition: its idempotency key, settings and body. A create
retried with the same digest answers as the first did; any other create of
the same id is refused. NULL for partitions the client library created. A
nullable column is a metadata-only change on every supported database.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

DIGEST_LENGTH = 64


def upgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    op.add_column(f"{prefix}partitions",
                  sa.Column("request_digest", sa.Unicode(DIGEST_LENGTH), nullable=True))


def downgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    with op.batch_alter_table(f"{prefix}partitions") as batch:
        batch.drop_column("request_digest")
