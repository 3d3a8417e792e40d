"""Leave room in each page of ``partitions`` for HOT updates (PostgreSQL).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23

The partition row is written often: each ``add_items``, gate advance and
reduce page bumps its version. Those writes change no indexed column, so
PostgreSQL can make them HOT updates (no new index entries, old versions
pruned inside the page), but only when the row's page has room for the new
version. A fill factor of 80 keeps a fifth of each page free for that. It
takes effect for pages written from now on (no rewrite; a moment's
``SHARE UPDATE EXCLUSIVE`` lock, which lease writes do not wait for). Other
databases have no such setting: nothing to do there.
"""

from __future__ import annotations

from alembic import context, op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

FILLFACTOR = 80


def upgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    prefix = context.config.attributes.get("table_prefix", "")
    op.execute(f'ALTER TABLE "{prefix}partitions" SET (fillfactor = {FILLFACTOR})')


def downgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    prefix = context.config.attributes.get("table_prefix", "")
    op.execute(f'ALTER TABLE "{prefix}partitions" RESET (fillfactor)')
