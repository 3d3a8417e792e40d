"""MariaDB's and MySQL's engine settings: READ COMMITTED, bounded statements and lock waits.

InnoDB defaults to REPEATABLE READ: a transaction's reads come from the
snapshot of its first read, and guarded UPDATEs take gap/next-key locks that
deadlock concurrent writers. statefeed's guarded writes (``version = :seen``)
want the latest committed row and record locks only, which is READ COMMITTED.
The server ends a statement, or a row lock wait, after the store's
``timeout``, and TCP keepalives notice a vanished peer. The direct path
(:mod:`.direct`) sets the same on its own connections.
"""

from __future__ import annotations

import math
import socket
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from watcher.store.db.urls import DatabaseURL

ISOLATION_LEVEL = "READ COMMITTED"
# TCP keepalives, so that a connection whose peer vanished fails within idle +
# interval * count seconds even while idle (aiomysql turns keepalives on).
KEEPALIVE_IDLE = 10
KEEPALIVE_INTERVAL = 5
KEEPALIVE_COUNT = 3
def session_timeouts(timeout: float, mariadb: bool) -> list[str]:
    """The SETs that make the server end a statement, or a row lock wait, after
    ``timeout`` seconds (MySQL bounds only SELECTs that way; the lock wait, in whole
    seconds, bounds its writes' waits)."""
    limit = (f"SET SESSION max_statement_time = {timeout:g}" if mariadb
             else f"SET SESSION max_execution_time = {max(1, int(timeout * 1000))}")
    return [limit, f"SET SESSION innodb_lock_wait_timeout = {max(1, math.ceil(timeout))}"]


def tune_keepalive(conn: Any) -> None:
    """Set the keepalive timing on an aiomysql connection's socket (Linux), if it has one."""
    writer = getattr(conn, "_writer", None)  # aiomysql exposes no socket of its own
    sock = writer.transport.get_extra_info("socket") if writer is not None else None
    if sock is None or not hasattr(socket, "TCP_KEEPIDLE"):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_COUNT)


def engine_options(url: DatabaseURL, timeout: float) -> dict[str, Any]:
    """``create_async_engine``'s options for MariaDB and MySQL: READ COMMITTED, a
    bounded connect (unless the URL sets one)."""
    options: dict[str, Any] = {"pool_pre_ping": True, "isolation_level": ISOLATION_LEVEL}
    if "connect_timeout" not in url.async_url.query:
        options["connect_args"] = {"connect_timeout": timeout}
    return options


def configure(engine: AsyncEngine, timeout: float) -> None:
    """Tune each new connection's keepalives and bound its statements and lock waits."""

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        driver_connection = dbapi_connection.driver_connection
        tune_keepalive(driver_connection)
        mariadb = "MariaDB" in driver_connection.get_server_info()
        cursor = dbapi_connection.cursor()
        for setting in session_timeouts(timeout, mariadb):
            cursor.execute(setting)
        cursor.close()
