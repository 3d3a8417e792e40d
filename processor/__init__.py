"""statefeed's service side and public client API.

    from processor import Client, NewItem

The clients load on first use (they bring SQLAlchemy's async engine); the
records and errors load with the package.

The service may import :mod:`watcher` and :mod:`handlers`; neither imports it. Its
folders, bottom up: ``wire``, ``observe``, ``notify``, ``feed``, ``client``, ``http``,
``testing`` (the handlers' test kit), ``console``, ``api``, ``cli``; each imports only
from the folders below it and from the shared top-level modules here (the service's
wiring, health, the views), which import folders only where that makes no circle.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from watcher.errors import (
    AlreadyCompletedError,
    CompletionRefusedError,
    ConfigError,
    ConnectionLostError,
    DatabaseError,
    DuplicateItemError,
    GateError,
    InvalidInputError,
    ItemNotFoundError,
    KeyNotFoundError,
    PartitionChangedError,
    PartitionExistsError,
    PartitionFinishedError,
    PartitionLeasedError,
    PartitionNotFoundError,
    ScheduleExistsError,
    ScheduleNotFoundError,
    StatefeedError,
    ValueRefusedError,
    WaitNotFoundError,
)
from watcher.protocol import NonRetryableError, RetryableError
from watcher.records import ErrorEntry, ItemInfo, NewItem, PartitionInfo
from watcher.reports import RetryReport, RewindReport

if TYPE_CHECKING:
    from processor.client.async_client import AsyncClient
    from processor.client.sync_client import Client
    from processor.feed.hub import FeedBusyError

# Public names whose modules import SQLAlchemy: loaded by __getattr__ on first use.
_LAZY = {
    "AsyncClient": "processor.client.async_client",
    "Client": "processor.client.sync_client",
    "FeedBusyError": "processor.feed.hub",
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
    "AlreadyCompletedError",
    "AsyncClient",
    "Client",
    "CompletionRefusedError",
    "ConfigError",
    "ConnectionLostError",
    "DatabaseError",
    "DuplicateItemError",
    "ErrorEntry",
    "FeedBusyError",
    "GateError",
    "InvalidInputError",
    "ItemInfo",
    "ItemNotFoundError",
    "KeyNotFoundError",
    "NewItem",
    "NonRetryableError",
    "PartitionChangedError",
    "PartitionExistsError",
    "PartitionFinishedError",
    "PartitionInfo",
    "PartitionLeasedError",
    "PartitionNotFoundError",
    "RetryReport",
    "RetryableError",
    "RewindReport",
    "ScheduleExistsError",
    "ScheduleNotFoundError",
    "StatefeedError",
    "ValueRefusedError",
    "WaitNotFoundError",
]
