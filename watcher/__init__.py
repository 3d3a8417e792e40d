"""statefeed's engine: partitions, items, leases, gates and the watch loop."""

from __future__ import annotations

from watcher.config import WatcherConfig
from watcher.errors import (
    ConfigError,
    DatabaseError,
    DuplicateItemError,
    GateError,
    InvalidInputError,
    PartitionExistsError,
    PartitionNotFoundError,
    StatefeedError,
)
from watcher.hooks import CountingHooks, Hooks
from watcher.models import Status
from watcher.protocol import (
    NonRetryableError,
    Processor,
    Result,
    RetryableError,
    WorkItem,
)
from watcher.records import ItemInfo, NewItem, PartitionInfo
from watcher.store import Store
from watcher.watcher import Watcher

__all__ = [
    "ConfigError",
    "CountingHooks",
    "DatabaseError",
    "DuplicateItemError",
    "GateError",
    "Hooks",
    "InvalidInputError",
    "ItemInfo",
    "NewItem",
    "NonRetryableError",
    "PartitionExistsError",
    "PartitionInfo",
    "PartitionNotFoundError",
    "Processor",
    "Result",
    "RetryableError",
    "StatefeedError",
    "Status",
    "Store",
    "Watcher",
    "WatcherConfig",
    "WorkItem",
]
