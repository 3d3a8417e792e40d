"""The assembled :class:`Store`, one part per kind of caller, and the check that
a database holds statefeed's tables.

See :mod:`watcher.store` for the seam's rules."""


from __future__ import annotations

from collections.abc import Sequence

from watcher.errors import DatabaseError
from watcher.store.codecs import decode_partition_cursor, encode_partition_cursor
from watcher.store.db.urls import DatabaseURL
from watcher.store.fleet import FleetStore
from watcher.store.hot import HotPathStore
from watcher.store.leases import LeasesStore
from watcher.store.operations import OperationsStore
from watcher.store.operator.pipelines import PipelinesStore
from watcher.store.operator.replays import ReplaysStore
from watcher.store.operator.rewind import RewindsStore
from watcher.store.outbox.deliveries import NotificationsStore
from watcher.store.partitions import PartitionsStore
from watcher.store.reduce import ReduceStore
from watcher.store.registry.processors import ProcessorsStore
from watcher.store.removal import RemovalStore
from watcher.store.schedules import SchedulesStore
from watcher.store.sql.schema import tables_for
from watcher.store.waits import WaitsStore


class Store(SchedulesStore, PartitionsStore, OperationsStore, RewindsStore, PipelinesStore,
            RemovalStore, FleetStore, ProcessorsStore, LeasesStore, HotPathStore, ReduceStore,
            ReplaysStore, WaitsStore, NotificationsStore):
    """All reads and writes of the ``partitions``, ``items``, ``leaders``,
    ``processors`` and flow tables.

    ``clock`` is where statements take the time from: the database's own
    (:class:`~watcher.store.db.clock.DatabaseClock`, the default) or a test's
    :class:`~watcher.store.db.clock.FixedClock`. The per-database driver is chosen
    here, once, from the engine's dialect.

    Raises:
        ConfigError: statefeed has no driver for the engine's database.
    """

async def missing_tables(store: Store) -> list[str]:
    """Names of statefeed tables that do not exist yet (empty when migrated).

    Raises the driver's error when the database cannot be reached.
    """
    from sqlalchemy import inspect as inspect_schema

    tables = store.tables
    names = [table.name for table in (tables.partitions, tables.items, tables.leaders,
                                      tables.flow_controls, tables.flow_grants,
                                      tables.schedules, tables.waits,
                                      tables.notifications, tables.processors)]
    async with store.round_trips.transaction(store.engine.connect(), "missing_tables") as conn:
        present = await conn.run_sync(
            lambda sync: {name for name in names if inspect_schema(sync).has_table(name)})
    return [name for name in names if name not in present]

def sqlite_file_missing(url: DatabaseURL) -> bool:
    """Whether ``url`` is a SQLite database whose file does not exist.

    Opening one would create an empty file; only ``processor migrate`` (or
    ``processor run --migrate``) should, so the other verbs ask this first.
    """
    import os

    return url.dialect == "sqlite" and not os.path.exists(str(url.sync_url.database))

def not_migrated(url: DatabaseURL, table_prefix: str, missing: Sequence[str]) -> DatabaseError:
    """The error of every verb but ``migrate`` on a database that lacks statefeed's tables
    (``missing``): one line, the same everywhere, saying what to do."""
    where = f" with prefix {table_prefix!r}" if table_prefix else ""
    return DatabaseError(
        f"database {url.redacted()} has no statefeed tables{where} (missing: "
        f"{', '.join(missing)}): run `processor migrate` first")

async def require_migrated(url: DatabaseURL, table_prefix: str = "") -> None:
    """Check that the database at ``url`` has statefeed's tables, without creating
    anything: a SQLite file that does not exist is reported, not made.

    Raises:
        DatabaseError: the tables are missing (:func:`not_migrated`).
        ConfigError: the prefix is invalid, or the database's driver is not installed.
        sqlalchemy.exc.SQLAlchemyError | OSError: the database cannot be reached.
    """
    tables = tables_for(table_prefix)
    if sqlite_file_missing(url):
        raise not_migrated(url, table_prefix,
                           [tables.partitions.name, tables.items.name, tables.leaders.name,
                            tables.flow_controls.name, tables.flow_grants.name,
                            tables.schedules.name, tables.notifications.name,
                            tables.processors.name])
    store = Store.open(url, table_prefix)
    try:
        missing = await missing_tables(store)
    finally:
        await store.close()
    if missing:
        raise not_migrated(url, table_prefix, missing)

__all__ = [
    "Store",
    "decode_partition_cursor",
    "encode_partition_cursor",
    "missing_tables",
    "not_migrated",
    "require_migrated",
    "sqlite_file_missing",
]
