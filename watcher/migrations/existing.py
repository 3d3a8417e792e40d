"""What a revision finds in place already, so that one cut short runs again to the end.

A revision that builds an index ``CONCURRENTLY`` on PostgreSQL
(:mod:`watcher.migrations.indexes`) commits what it did before the build, and
stamps its revision only after the build. If the build is cut short (a lost
connection, a cancelled deploy), the next upgrade runs the whole revision again:
its earlier steps must then pass over what they made the first time.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op


def _inspector() -> sa.Inspector | None:
    """The live database's inspector; ``None`` when writing SQL offline (then nothing
    exists yet, as far as the script can know)."""
    if context.is_offline_mode():
        return None
    return sa.inspect(op.get_bind())


def table_exists(table: str) -> bool:
    """Whether ``table`` exists (``False`` offline)."""
    inspector = _inspector()
    return inspector is not None and inspector.has_table(table)


def column_exists(table: str, column: str) -> bool:
    """Whether ``table`` has ``column`` (``False`` offline)."""
    inspector = _inspector()
    return inspector is not None and any(
        found["name"] == column for found in inspector.get_columns(table))
