"""Index changes the revisions share."""

from __future__ import annotations

from typing import Any

from alembic import op


def create_index_online(name: str, table: str, columns: list[str],
                        **dialect_options: Any) -> None:
    """Create index ``name`` on ``table`` (``columns``) while processors keep writing;
    ``dialect_options`` go to :func:`alembic.op.create_index` (``postgresql_where``...).

    PostgreSQL builds it ``CONCURRENTLY``, which cannot run inside a transaction:
    what the revision did before is committed first. An index left invalid by a
    build cut short is dropped first, so running the upgrade again completes it
    (the revision's earlier steps must pass over what they made:
    :mod:`watcher.migrations.existing`).
    MariaDB and MySQL build an index in place, online; SQLite and SQL Server build it
    in the migration's transaction.
    """
    if op.get_context().dialect.name != "postgresql":
        op.create_index(name, table, columns, **dialect_options)
        return
    with op.get_context().autocommit_block():
        op.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"')
        op.create_index(name, table, columns, postgresql_concurrently=True,
                        **dialect_options)


def rebuild_index(name: str, table: str, columns: list[str]) -> None:
    """Give index ``name`` of ``table`` the key ``columns``, keeping its name.

    PostgreSQL builds the new index beside the old one without blocking writes
    (``CONCURRENTLY``, which cannot run inside a transaction), then drops the old
    one the same way and renames the new: reads keep an index all along, and
    processors keep writing. A build cut short leaves an invalid index behind,
    which the next run drops first, so running the upgrade again completes it.
    Elsewhere the index is dropped and created again in the migration's
    transaction (MariaDB and MySQL build it in place, online; SQLite holds its
    write lock meanwhile).
    """
    if op.get_context().dialect.name != "postgresql":
        op.drop_index(name, table_name=table)
        op.create_index(name, table, columns)
        return
    building = f"{name}_next"
    with op.get_context().autocommit_block():
        op.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{building}"')
        op.create_index(building, table, columns, postgresql_concurrently=True)
        # IF EXISTS: a run cut short between this drop and the rename dropped it already.
        op.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"')
        op.execute(f'ALTER INDEX "{building}" RENAME TO "{name}"')
