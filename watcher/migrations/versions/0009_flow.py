"""Flow control: keys, priority, the lease queue's order, pauses, limits and grants.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26

- ``partitions.priority``: from -10 to 10, 0 by default; fixed at creation.
- ``partitions.rank_at``: the partition's place in the lease queue, a time: when
  it may start (its creation, or its ``start_at``) less its priority times the
  aging step (:data:`watcher.rules.priority.AGING_STEP`). The lease scan takes free
  partitions in ``rank_at`` order through ``ix_partitions_rank``, so a higher
  priority goes first, and a lower one waits at most the priority gap times the
  step, however much higher-priority work keeps arriving. Existing rows get
  their creation time.
- ``partitions.paused_at``: when a client paused the partition; NULL while it
  runs. A paused partition is not leased, and its holder starts no new calls.
- ``partitions.flow_key``: the partition's concurrency key (a tenant, a
  customer); ``''`` for none. Keyed partitions are queued fairly across keys.
- ``flow_controls``: one row per key (scope ``key``), per rate-limited handler
  (scope ``handler``) and for the whole fleet (scope ``fleet``): a key's virtual
  clock for fair queuing (``next_start``), its in-flight limit, rate limit,
  pause, a fleet-wide ``Retry-After`` block, and a token bucket.
- ``flow_grants``: the in-flight slots each processor holds for a limited key;
  their live sum never exceeds the key's limit.

The types are spelled out here rather than imported from :mod:`watcher.models`.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import mssql, mysql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

MYSQL = ("mysql", "mariadb")
ID_LENGTH = 255
SCOPE_LENGTH = 16


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


def upgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    table = f"{prefix}partitions"
    options: dict[str, Any] = {f"{name}_{option}": value for name in MYSQL
               for option, value in (("engine", "InnoDB"), ("charset", "utf8mb4"))}
    op.add_column(table, sa.Column("flow_key", _key(), nullable=False,
                                   server_default=sa.text("''")))
    op.create_table(
        f"{prefix}flow_controls",
        sa.Column("scope", sa.Unicode(SCOPE_LENGTH), primary_key=True),
        sa.Column("name", _key(), primary_key=True),
        sa.Column("next_start", _time(), nullable=True),
        sa.Column("max_inflight", sa.Integer, nullable=True),
        sa.Column("rate_limit", sa.Float, nullable=True),
        sa.Column("paused_at", _time(), nullable=True),
        sa.Column("blocked_until", _time(), nullable=True),
        sa.Column("tokens", sa.Float, nullable=True),
        sa.Column("refilled_at", _time(), nullable=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("updated_at", _time(), nullable=False),
        **options,
    )
    op.create_table(
        f"{prefix}flow_grants",
        sa.Column("scope", sa.Unicode(SCOPE_LENGTH), primary_key=True),
        sa.Column("name", _key(), primary_key=True),
        sa.Column("owner", _key(), primary_key=True),
        sa.Column("slots", sa.Integer, nullable=False),
        sa.Column("wanted", sa.Integer, nullable=False),
        sa.Column("until", _time(), nullable=False),
        **options,
    )
    op.add_column(table, sa.Column("priority", sa.Integer, nullable=False,
                                   server_default=sa.text("0")))
    op.add_column(table, sa.Column("rank_at", _time(), nullable=True))
    op.add_column(table, sa.Column("paused_at", _time(), nullable=True))
    op.execute(sa.text(f"UPDATE {table} SET rank_at = created_at"))
    op.create_index(f"{prefix}ix_partitions_rank", table, ["status", "rank_at"])


def downgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    table = f"{prefix}partitions"
    op.drop_index(f"{prefix}ix_partitions_rank", table_name=table)
    op.drop_table(f"{prefix}flow_grants")
    op.drop_table(f"{prefix}flow_controls")
    with op.batch_alter_table(table) as batch:
        batch.drop_column("flow_key", mssql_drop_default=True)
        batch.drop_column("paused_at")
        batch.drop_column("rank_at")
        batch.drop_column("priority", mssql_drop_default=True)
