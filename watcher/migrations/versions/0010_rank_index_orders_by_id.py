"""The lease queue's index orders partitions of one place by id: (status, rank_at, id).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27

The lease scan reads free partitions ``ORDER BY rank_at, id`` and stops at its
limit. With the index on ``(status, rank_at)`` alone, partitions that share a
place in the queue (scheduled for the same ``start_at``, or created in one
transaction, whose clock reads the same on PostgreSQL) came out of the index in
no particular order, so PostgreSQL and SQLite sorted every one of them on each
scan: 11-14 ms a scan with 10,000 tied partitions waiting, against 1.5-1.8 ms
when their places differ. With ``id`` in the index the scan reads them in order
and stops at the limit. InnoDB and SQL Server already carried the primary key
in the index's entries; the index is rebuilt there too, so every database has
the same one.

The index keeps its name (:func:`~watcher.migrations.indexes.rebuild_index`): on
PostgreSQL the new one is built ``CONCURRENTLY`` beside the old, so lease scans
and renewals go on meanwhile; MariaDB and MySQL build it online; SQLite holds its
write lock for the moment it takes.
"""

from __future__ import annotations

from alembic import context

from watcher.migrations.indexes import rebuild_index

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def _rebuild(columns: list[str]) -> None:
    prefix = context.config.attributes.get("table_prefix", "")
    rebuild_index(f"{prefix}ix_partitions_rank", f"{prefix}partitions", columns)


def upgrade() -> None:
    _rebuild(["status", "rank_at", "id"])


def downgrade() -> None:
    _rebuild(["status", "rank_at"])
