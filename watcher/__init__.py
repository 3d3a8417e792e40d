"""statefeed's engine: partitions, items, leases, gates and the watch loop.

The contract types (:class:`Result`, :class:`WorkItem`, the errors, the hooks)
load with the package; :class:`Store`, :class:`Watcher` and the rest load on
first use, so that a handler importing only the contract does not pay for
SQLAlchemy's async engine.

The engine never imports :mod:`processor` or :mod:`handlers`: what it needs of the
service (a tracer, hooks, a clock) is passed in. Its folders, bottom up: ``rules``,
``schedules``, ``store``, ``flow``, ``leasing``, ``dispatch``; each imports only from
the folders below it and from the shared top-level modules here (errors, records,
config, models, ...), which import folders only where that makes no circle (the
:class:`Watcher` loop imports them all). ``migrations`` stands outside that order:
Alembic loads it by path.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from watcher.errors import (
    ConfigError,
    DatabaseError,
    DuplicateItemError,
    GateError,
    InvalidInputError,
    ItemNotFoundError,
    PartitionChangedError,
    PartitionExistsError,
    PartitionLeasedError,
    PartitionNotFoundError,
    StatefeedError,
    ValueRefusedError,
)
from watcher.hooks import CountingHooks, Hooks
from watcher.protocol import (
    HandlerUnavailableError,
    NonRetryableError,
    Processor,
    Result,
    RetryableError,
    ThrottledError,
    Wait,
    WorkItem,
)
from watcher.records import ErrorEntry, ItemInfo, NewItem, PartitionInfo

if TYPE_CHECKING:
    from watcher.config import WatcherConfig
    from watcher.models import Status
    from watcher.store import Store
    from watcher.watcher import Watcher

# Public names whose modules import SQLAlchemy: loaded by __getattr__ on first use.
_LAZY = {
    "Status": "watcher.models",
    "Store": "watcher.store",
    "Watcher": "watcher.watcher",
    "WatcherConfig": "watcher.config",
}


def __getattr__(name: str) -> Any:
    """Load a heavy public name on first use.

    Raises:
        AttributeError: ``name`` is not a public name of the package.
    """
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups find it without coming back here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "ConfigError",
    "CountingHooks",
    "DatabaseError",
    "DuplicateItemError",
    "ErrorEntry",
    "GateError",
    "HandlerUnavailableError",
    "Hooks",
    "InvalidInputError",
    "ItemInfo",
    "ItemNotFoundError",
    "NewItem",
    "NonRetryableError",
    "PartitionChangedError",
    "PartitionExistsError",
    "PartitionInfo",
    "PartitionLeasedError",
    "PartitionNotFoundError",
    "Processor",
    "Result",
    "RetryableError",
    "StatefeedError",
    "Status",
    "Store",
    "ThrottledError",
    "ValueRefusedError",
    "Wait",
    "Watcher",
    "WatcherConfig",
    "WorkItem",
]
