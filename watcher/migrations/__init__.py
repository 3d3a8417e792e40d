"""The Alembic migrations: the environment (:mod:`~watcher.migrations.env`), one revision
per schema change in ``versions/`` (Alembic loads them by path), and what revisions share
(:mod:`~watcher.migrations.indexes`, :mod:`~watcher.migrations.existing`).

May import :mod:`watcher.store.db` and :mod:`watcher.store.sql` (URLs, the table
prefix) and the engine's shared top-level modules; nothing of the engine imports it.
Outside the folder order, and exempt from the size rules (a revision is never split).
"""
