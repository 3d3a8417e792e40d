"""PostgreSQL's engine settings: bounded waits, keepalives, stuck transactions, custom plans.

The server ends a statement (or a lock wait) after the store's ``timeout``;
connects are bounded by it too, and TCP keepalives notice a vanished peer
(:mod:`watcher.store.db.round_trips` bounds the rest). Sessions left idle inside a
transaction for :data:`STUCK_TRANSACTION_SECONDS` are ended by the server.
The direct path (:mod:`.direct`) opens its connections with the same settings.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from watcher.store.db.urls import DatabaseURL
from watcher.store.drivers.postgresql import pooler

# statefeed's transactions never wait on anything but the database, so a session
# idle inside one this long belongs to a frozen or cut-off process; PostgreSQL
# ends it, which frees the rows it locked for the processors taking over.
STUCK_TRANSACTION_SECONDS = 5.0
# TCP keepalives, so that a connection whose peer vanished (a failover, a half-open
# connection) fails within idle + interval * count seconds even while idle.
KEEPALIVE_IDLE = 10
KEEPALIVE_INTERVAL = 5
KEEPALIVE_COUNT = 3


def connect_options(timeout: float, given: Collection[str] = ()) -> dict[str, Any]:
    """libpq connection options bounding a connection's waits by ``timeout`` seconds:
    the connect (``connect_timeout``, 2 at least), TCP keepalives, and unacknowledged
    data (``tcp_user_timeout``). Options the URL sets (``given``) are left to it."""
    options: dict[str, Any] = {
        "connect_timeout": max(2, math.ceil(timeout)), "keepalives": 1,
        "keepalives_idle": KEEPALIVE_IDLE, "keepalives_interval": KEEPALIVE_INTERVAL,
        "keepalives_count": KEEPALIVE_COUNT, "tcp_user_timeout": int(timeout * 1000)}
    return {key: value for key, value in options.items() if key not in given}


def statement_timeout(timeout: float) -> str:
    """The SET that makes the server end a statement (or a lock wait) after ``timeout``
    seconds; a SET rather than a startup option, which poolers such as PgBouncer refuse."""
    return f"SET statement_timeout = {max(1, int(timeout * 1000))}"


def engine_options(url: DatabaseURL, timeout: float) -> dict[str, Any]:
    """``create_async_engine``'s options for PostgreSQL: bounded connects, keepalives,
    and no prepared statements behind a transaction pooler (:mod:`.pooler`)."""
    return {"pool_pre_ping": True,
            "connect_args": {**connect_options(timeout, url.async_url.query),
                             **pooler.psycopg_options(url.async_url)}}


def configure(engine: AsyncEngine, timeout: float) -> None:
    """Set each new connection's timeouts and plan cache mode.

    A SET on each new connection rather than a startup option, which poolers
    such as PgBouncer refuse. Behind a transaction pooler, the SETs land on the
    server session that served them (every statefeed connection sets the same
    values); docs/how-to/databases.md says to set them on the role as well.
    """
    milliseconds = int(STUCK_TRANSACTION_SECONDS * 1000)

    @event.listens_for(engine.sync_engine, "do_connect")
    def _without_pooler_option(_dialect: Any, _record: Any, _args: Any,
                               params: dict[str, Any]) -> None:
        # The URL's pooler= option is statefeed's (read by .pooler), not libpq's.
        params.pop(pooler.OPTION, None)

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(f"SET idle_in_transaction_session_timeout = {milliseconds}")
        cursor.execute(statement_timeout(timeout))
        # psycopg prepares a statement after a few runs, and PostgreSQL may then
        # switch to a generic plan; for the guarded item write that plan can walk
        # the ready index over the whole partition instead of seeking the primary
        # key (seen on reduce pages: a tenfold slower write). Plan each run.
        cursor.execute("SET plan_cache_mode = force_custom_plan")
        cursor.close()
        dbapi_connection.commit()
