"""The store seam: every SQL statement statefeed runs is built here or in its database's driver.

Engine writes are guarded: ``UPDATE ... SET version = version + 1 ... WHERE
<key> AND version = :seen`` and count only when exactly one row changed. Lease
held writes also match the owner. Times come from the store's clock
(:mod:`watcher.store.db.clock`): the database's own in production, a fixed time in
tests, sent as a parameter of the same statements.

:class:`Store` (in
:mod:`~watcher.store.assembly`) is assembled from one part per kind of caller, each in its own
module: :mod:`~watcher.store.partitions` (client writes and reads),
:mod:`~watcher.store.schedules` (schedules and their ticks),
:mod:`~watcher.store.outbox.deliveries` (the notifications' outbox),
:mod:`~watcher.store.operations` (retry, set-gate, cancel),
:mod:`~watcher.store.operator.rewind` (rewind),
:mod:`~watcher.store.operator.replays` (an operator's answer for one item),
:mod:`~watcher.store.removal` (delete, purge, item retention),
:mod:`~watcher.store.fleet` (leader leases, backlog),
:mod:`~watcher.store.registry.processors` (the running processors and the places they
serve), :mod:`~watcher.store.leases`
(reading and taking leases, a holder's transitions) on
:mod:`~watcher.store.renewals` (renewals, releases and the timelines they carry),
:mod:`~watcher.store.hot` (the dispatch
path) and :mod:`~watcher.store.reduce` (reduce gates), both on
:mod:`~watcher.store.spawns` (what their answers spawn and the waits they begin),
with :mod:`~watcher.store.waits` (expired waits, completions and heartbeats), on
:mod:`~watcher.store.base` (engine, transactions, the partition lock and the lease
guard) and :mod:`~watcher.store.codecs` (shared values). The SQL every database
shares is :class:`watcher.store.sql.shared.Statements`; what a database does its own way
belongs to the driver the store opens once (:mod:`watcher.store.drivers`).

Methods are named entity first (``leases_take``, ``items_ready``, ...). Each one
is a single transaction. They raise :class:`sqlalchemy.exc.SQLAlchemyError`
subclasses when the database fails; client-facing methods raise the
:mod:`watcher.errors` types for bad input and write nothing in that case.

May import :mod:`watcher.rules`, :mod:`watcher.schedules` and the engine's shared
top-level modules (its sub-folders import each other); never :mod:`watcher.flow`,
:mod:`watcher.leasing` or :mod:`watcher.dispatch`, which are above it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from watcher.store.assembly import (
        Store,
        missing_tables,
        not_migrated,
        require_migrated,
        sqlite_file_missing,
    )

# The package's face is lazy: a driver, a statement module or the URL parser can be
# imported without loading every part of the store.
_LAZY = {
    "Store": "watcher.store.assembly",
    "missing_tables": "watcher.store.assembly",
    "not_migrated": "watcher.store.assembly",
    "require_migrated": "watcher.store.assembly",
    "sqlite_file_missing": "watcher.store.assembly",
}

__all__ = ['Store', 'missing_tables', 'not_migrated', 'require_migrated', 'sqlite_file_missing']


def __getattr__(name: str) -> Any:
    """Load a public name of the store on first use.

    Raises:
        AttributeError: ``name`` is not a public name of the package.
    """
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
