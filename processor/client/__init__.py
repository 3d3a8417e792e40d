"""The client library: the synchronous :class:`Client` and the asyncio
:class:`AsyncClient` that create partitions, add items, read them and steer them, with
the checks every write passes before it reaches the database.

May import :mod:`watcher` (the store and the rules) and :mod:`processor.observe`;
never the CLI, the console, the API or the HTTP dispatch.
"""

from __future__ import annotations

from processor.client.async_client import AsyncClient
from processor.client.sync_client import Client

__all__ = ["AsyncClient", "Client"]
