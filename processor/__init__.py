"""statefeed's service side and public client API.

    from processor import Client, NewItem
"""

from __future__ import annotations

from processor.client import AsyncClient, Client
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
from watcher.records import ItemInfo, NewItem, PartitionInfo

__all__ = [
    "AsyncClient",
    "Client",
    "ConfigError",
    "DatabaseError",
    "DuplicateItemError",
    "GateError",
    "InvalidInputError",
    "ItemInfo",
    "NewItem",
    "PartitionExistsError",
    "PartitionInfo",
    "PartitionNotFoundError",
    "StatefeedError",
]
