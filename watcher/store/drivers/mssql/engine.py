"""SQL Server's engine settings: pymssql on a worker thread per connection, ``datetime2``.

READ COMMITTED is SQL Server's default; with READ_COMMITTED_SNAPSHOT on (see
docs/how-to/databases.md) it reads row versions and readers never block
writers. ``use_datetime2`` sends datetimes with microseconds instead of
DATETIME's 1/300 s. pymssql bounds each query and the login itself (whole
seconds); a statement in its worker thread cannot be interrupted from the
event loop.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from watcher.store.db.urls import DatabaseURL


def engine_options(url: DatabaseURL, timeout: float) -> dict[str, Any]:
    """``create_async_engine``'s options for SQL Server: datetime2, bounded queries and logins."""
    seconds = max(1, math.ceil(timeout))
    return {"pool_pre_ping": True,
            "connect_args": {"use_datetime2": True, "timeout": seconds,
                             "login_timeout": seconds}}


def configure(engine: AsyncEngine, timeout: float) -> None:
    """Nothing to set per connection: pymssql takes its bounds at connect."""
