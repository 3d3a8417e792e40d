"""Migrated table namespaces for tests, migrated once per database per test process.

A full Alembic upgrade and downgrade per test cost most of the suite's time. Instead:

- on a server database (PostgreSQL, MariaDB, SQL Server), a :class:`NamespacePool`
  keeps prefixes that were migrated once; a test borrows one, its rows are deleted
  before the test gets it, and it goes back to the pool afterwards. The version table
  stays. The tables have no sequences or auto-increment columns (every key is a
  string, but for the notifications' ``seq``, which no test assumes starts anywhere), so
  an emptied table is as good as a new one. A prefix that cannot be
  emptied (a lock a stray session holds, a test that dropped a table) is dropped
  and replaced by a newly migrated one.
- on SQLite, whose database is a file in the test's own folder, the pool migrates one
  template file and copies it to the test's path.

The tests of migrations use :func:`fresh_namespace`, which migrates for real. The
acceptance harness's clusters (tests/acceptance/harness/cluster.py) borrow from the
test process's pool too, through :func:`session_pool`.
"""

from __future__ import annotations

import contextlib
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import Engine, Table, create_engine, text
from sqlalchemy.pool import NullPool

from watcher.store.db.migrate import downgrade, upgrade
from watcher.store.db.urls import parse_database_url
from watcher.store.sql.schema import Tables, tables_for

# How long emptying a borrowed namespace waits on a lock before it gives the namespace
# up (a session a failed test left behind may hold one).
LOCK_WAIT_SECONDS = 5


def namespace_tables(tables: Tables) -> list[Table]:
    """Every table of a namespace (a table a migration adds is one field more of
    :class:`~watcher.store.sql.schema.Tables`), children before the tables they refer to."""
    mine = {table.name: table for table in vars(tables).values() if isinstance(table, Table)}
    ordered = reversed(tables.partitions.metadata.sorted_tables)
    return [mine[table.name] for table in ordered if table.name in mine]


def new_prefix() -> str:
    """A table prefix no other test (nor test process) uses."""
    return f"t{uuid.uuid4().hex[:10]}_"


@contextlib.contextmanager
def fresh_namespace(db_url: str) -> Iterator[str]:
    """A table prefix migrated for this caller alone and dropped afterwards (the old,
    costly way: for the tests of migrations and of what a fresh table looks like)."""
    prefix = new_prefix()
    upgrade(db_url, prefix)
    try:
        yield prefix
    finally:
        downgrade(db_url, prefix)


def _sqlite_path(db_url: str) -> Path | None:
    """The file of a SQLite URL, or ``None`` for another database or an in-memory one."""
    parsed = parse_database_url(db_url)
    if parsed.dialect != "sqlite":
        return None
    database = parsed.sync_url.database
    return Path(database) if database and database != ":memory:" else None


class NamespacePool:
    """Migrated namespaces kept for the whole test session (one pool per process, so
    each xdist worker has its own): see the module's docstring."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self._free: dict[str, list[str]] = {}
        self._engines: dict[str, Engine] = {}
        self._migrated: list[tuple[str, str]] = []
        self._template: tuple[Path, str] | None = None

    @contextlib.contextmanager
    def borrow(self, db_url: str) -> Iterator[str]:
        """An empty, migrated namespace on ``db_url`` for one test.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database refused the migration.
        """
        path = _sqlite_path(db_url)
        if path is not None and not path.exists():
            yield self._copy_template(path)
            return
        if path is not None or parse_database_url(db_url).dialect == "sqlite":
            # A file someone else made already, or an in-memory database: migrate.
            with fresh_namespace(db_url) as prefix:
                yield prefix
            return
        prefix = self._take(db_url)
        try:
            yield prefix
        finally:
            self._free.setdefault(db_url, []).append(prefix)

    def close(self) -> None:
        """Drop every namespace the pool migrated (at the end of the session)."""
        for engine in self._engines.values():
            engine.dispose()
        for db_url, prefix in self._migrated:
            with contextlib.suppress(Exception):  # the server may be gone by now
                downgrade(db_url, prefix)

    def _copy_template(self, path: Path) -> str:
        if self._template is None:
            template = self._folder / "template.db"
            prefix = new_prefix()
            upgrade(f"sqlite:///{template}", prefix)
            # The migration's engine is closed, so the write-ahead log was checkpointed
            # into the file and removed: the one file is the whole database.
            assert not template.with_name(template.name + "-wal").exists()
            self._template = (template, prefix)
        template, prefix = self._template
        shutil.copyfile(template, path)
        return prefix

    def _take(self, db_url: str) -> str:
        free = self._free.setdefault(db_url, [])
        while free:
            prefix = free.pop()
            if self._empty(db_url, prefix):
                return prefix
            self._drop(db_url, prefix)
        prefix = new_prefix()
        upgrade(db_url, prefix)
        self._migrated.append((db_url, prefix))
        return prefix

    def _engine(self, db_url: str) -> Engine:
        if db_url not in self._engines:
            self._engines[db_url] = create_engine(parse_database_url(db_url).sync_url,
                                                  poolclass=NullPool)
        return self._engines[db_url]

    def _empty(self, db_url: str, prefix: str) -> bool:
        """Delete every row of the namespace but its version; ``False`` if that failed."""
        tables = tables_for(prefix)
        engine = self._engine(db_url)
        try:
            with engine.begin() as conn:
                if engine.dialect.name == "postgresql":
                    conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_WAIT_SECONDS}s'"))
                elif engine.dialect.name in ("mysql", "mariadb"):
                    conn.execute(text(
                        f"SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_SECONDS}"))
                for table in namespace_tables(tables):
                    conn.execute(table.delete())
        except Exception:  # any failure: this namespace is replaced by a new one
            return False
        return True

    def _drop(self, db_url: str, prefix: str) -> None:
        with contextlib.suppress(Exception):
            downgrade(db_url, prefix)
        with contextlib.suppress(ValueError):
            self._migrated.remove((db_url, prefix))


_SESSION_POOLS: list[NamespacePool] = []


def set_session_pool(pool: NamespacePool | None) -> None:
    """Make ``pool`` the one :func:`session_pool` returns (``None``: no pool)."""
    _SESSION_POOLS[:] = [] if pool is None else [pool]


def session_pool() -> NamespacePool | None:
    """The test process's pool (the ``namespace_pool`` fixture of tests/conftest.py sets
    it for the whole session), or ``None`` when there is none."""
    return _SESSION_POOLS[0] if _SESSION_POOLS else None
