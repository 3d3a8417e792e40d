"""The direct paths' connection pool: a few connections of a driver's own, reused.

PostgreSQL's and MariaDB's direct paths (:mod:`.postgresql.direct`,
:mod:`.mysql.direct`) keep their connections here rather than in a pool
library: the engine already retries and backs off on outages and reports each
outage once, where a library pool waits for a connection in the background and
logs every connection a server restart kills. What differs by database (how
to open a connection, what an error says about it, how to close it) is a
subclass's; the rules are this module's.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

C = TypeVar("C")
T = TypeVar("T")


class Verdict(enum.Enum):
    """What a failed statement says about the connection it ran on."""

    # The statement failed; the connection is fine and goes back to the pool.
    KEEP = "keep"
    # The connection is gone (the server restarted or ended the session): it is
    # closed, and a statement that met it while it sat idle is sent once more on a
    # new connection, as an engine pool's pre-ping would have arranged.
    DEAD = "dead"
    # The session's state is unknown (cancelled mid-statement, a commit cut off):
    # the connection is closed and the statement never sent again.
    DROP = "drop"


class ConnectionPool(Generic[C]):
    """At most ``max_connections`` connections in use at once; idle ones are reused.

    Subclasses say how to :meth:`open` and :meth:`discard` a connection and
    judge a failure (:meth:`verdict`, :meth:`recover`).
    """

    def __init__(self, max_connections: int) -> None:
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[C] = []
        self.closed = False

    async def run(self, work: Callable[[C], Awaitable[T]]) -> T:
        """``work`` on a connection of the pool; returns what it returns.

        Raises:
            Exception: whatever ``work`` or opening a connection raised (a
                reused connection found dead is replaced once, silently).
        """
        async with self._slots:
            while True:
                reused = bool(self._idle)
                conn = self._idle.pop() if reused else await self.open()
                try:
                    result = await work(conn)
                except BaseException as error:
                    verdict = self.verdict(conn, error)
                    if verdict is Verdict.KEEP:
                        await self.recover(conn, error)
                        await self._give_back(conn)
                        raise
                    await self.discard(conn)
                    if verdict is Verdict.DEAD and reused:
                        log.debug("action=direct_connection_dead; "
                                  "sending again on a new connection")
                        continue
                    raise
                await self._give_back(conn)
                return result

    async def close(self) -> None:
        """Close the idle connections; those in use close when their statement ends."""
        self.closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await self.discard(conn)

    async def _give_back(self, conn: C) -> None:
        if self.closed:
            await self.discard(conn)
        else:
            self._idle.append(conn)

    # -- what differs by database --------------------------------------------

    async def open(self) -> C:
        """A new connection, set up for the direct path.

        Raises:
            Exception: the driver's error: the pool is closed, or the database
                cannot be reached.
        """
        raise NotImplementedError

    def verdict(self, conn: C, error: BaseException) -> Verdict:
        """What ``error``, raised by a statement on ``conn``, says about ``conn``."""
        raise NotImplementedError

    async def recover(self, conn: C, error: BaseException) -> None:
        """Make ``conn`` fit to reuse after a failed statement (:attr:`Verdict.KEEP`);
        nothing by default.

        Raises:
            Exception: it could not be (then ``conn`` is discarded first).
        """

    async def discard(self, conn: C) -> None:
        """Close ``conn``."""
        raise NotImplementedError
