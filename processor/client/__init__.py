"""The client library: the synchronous :class:`Client` and the asyncio
:class:`AsyncClient` that create partitions, add items, read them and steer them, with
the checks every write passes before it reaches the database.

May import :mod:`watcher` (the store and the rules), :mod:`handlers`, the service's
shared top-level modules and the folders below it (:mod:`processor.wire`,
:mod:`~processor.observe`, :mod:`~processor.notify`, :mod:`~processor.feed`); never the
HTTP hop, the console, the API or the CLI.
"""

from __future__ import annotations

from processor.client.async_client import AsyncClient
from processor.client.sync_client import Client

__all__ = ["AsyncClient", "Client"]
