"""Item waits: an item's current wait lives in its own row, so parking is one write.

Revision ID: 0021_item_waits
Revises: 0020_removed_waits
Create Date: 2026-11-29

- ``items.wait_key``, ``wait_timeout``, ``wait_policy``, ``wait_traceparent``: the
  item's last wait (its token's key, timeout, timeout policy, and the traceparent of
  the call that parked it). The key stays once the wait is over, so a late
  completion finds the item and is told the wait is over (409). A parking answer
  writes them in the item's own ``UPDATE``: no ``waits`` row any more.
- ``ix_items_wait`` on ``wait_key``: a completion finds its item through it. On
  PostgreSQL, SQLite and SQL Server it holds only the items that ever parked, so the
  other items' writes never meet it; MariaDB has no partial index.
- ``waits`` keeps the other keys: an operator's token of a current wait (a row at the
  item's version), and the key a new wait replaced (version 0: always over).

The waits that are on (their item waits at the row's version) move into their
items' rows, and an operator token of theirs becomes a row of its own. Nullable
columns are a metadata-only change on every supported database, the moved rows are
the waiting items only, and the index is built online (``CONCURRENTLY`` on
PostgreSQL). The types are spelled out here rather than imported from
:mod:`watcher.models`.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import mssql, mysql

from watcher.migrations.existing import column_exists
from watcher.migrations.indexes import create_index_online

revision = "0021_item_waits"
down_revision = "0020_removed_waits"
branch_labels = None
depends_on = None

MYSQL = ("mysql", "mariadb")
KEY_LENGTH = 64
POLICY_LENGTH = 16
WAITED_ONLY = sa.text("wait_key IS NOT NULL")


def _key() -> sa.types.TypeEngine[Any]:
    return (
        sa.Unicode(KEY_LENGTH)
        .with_variant(mysql.VARCHAR(KEY_LENGTH, collation="utf8mb4_bin"), *MYSQL)
        .with_variant(mssql.NVARCHAR(KEY_LENGTH, collation="Latin1_General_100_BIN2"),
                      "mssql")
    )


def _columns() -> list[sa.Column[Any]]:
    return [sa.Column("wait_key", _key(), nullable=True),
            sa.Column("wait_timeout", sa.Float(), nullable=True),
            sa.Column("wait_policy", sa.Unicode(POLICY_LENGTH), nullable=True),
            sa.Column("wait_traceparent", _key(), nullable=True)]


def _on(items: str, waits: str) -> str:
    """The SQL condition that the ``waits`` row ``w`` is the current wait of its item."""
    return (f"w.partition_id = {items}.partition_id AND w.item_id = {items}.id "
            f"AND w.version = {items}.version AND {items}.status = 'waiting'")


def upgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    items, waits = f"{prefix}items", f"{prefix}waits"
    # A run cut short during the index build below committed the columns already.
    if not column_exists(items, "wait_key"):
        for column in _columns():
            op.add_column(items, column)
        on = _on(items, waits)
        for name, source in (("wait_key", "token"), ("wait_timeout", "timeout"),
                               ("wait_policy", "on_timeout"),
                               ("wait_traceparent", "traceparent")):
            op.execute(f"UPDATE {items} SET {name} = (SELECT w.{source} FROM {waits} w "
                       f"WHERE {on}) WHERE status = 'waiting'")
        # An operator's token of a moved wait: a row of its own at the item's version.
        op.execute(
            f"INSERT INTO {waits} (token, partition_id, item_id, version, timeout, "
            f"on_timeout, created_at) SELECT w.operator_token, w.partition_id, w.item_id, "
            f"w.version, w.timeout, w.on_timeout, w.created_at FROM {waits} w "
            f"JOIN {items} ON w.token = {items}.wait_key WHERE w.operator_token IS NOT NULL")
        op.execute(f"DELETE FROM {waits} WHERE token IN "
                   f"(SELECT wait_key FROM {items} WHERE wait_key IS NOT NULL)")
    # Last: on PostgreSQL it commits the columns and builds the index CONCURRENTLY.
    create_index_online(f"{prefix}ix_items_wait", items, ["wait_key"],
                        postgresql_where=WAITED_ONLY, sqlite_where=WAITED_ONLY,
                        mssql_where=WAITED_ONLY)


def downgrade() -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    items, waits = f"{prefix}items", f"{prefix}waits"
    # Every key an item holds goes back to ``waits``: a current wait at its version, a
    # wait that is over at version 0 (so it stays "already completed").
    op.execute(
        f"INSERT INTO {waits} (token, partition_id, item_id, version, timeout, on_timeout, "
        f"created_at, traceparent) SELECT wait_key, partition_id, id, "
        f"CASE WHEN status = 'waiting' THEN version ELSE 0 END, "
        f"COALESCE(wait_timeout, 0), COALESCE(wait_policy, ''), updated_at, "
        f"wait_traceparent FROM {items} WHERE wait_key IS NOT NULL")
    op.drop_index(f"{prefix}ix_items_wait", table_name=items)
    with op.batch_alter_table(items) as batch:
        for column in reversed(_columns()):
            batch.drop_column(column.name)
