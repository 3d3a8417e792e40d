"""Faults a test inflicts on purpose: a database outage through a TCP proxy it
controls, and freezing a processor at a clean point.
"""

from __future__ import annotations

import asyncio

from tests.acceptance.harness.database import Sessions
from tests.acceptance.harness.processes import Processor
from tests.support.engine import wait_until


async def pause_outside_transaction(proc: Processor, sessions: Sessions,
                                    attempts: int = 50) -> None:
    """SIGSTOP ``proc`` at a moment it holds no open transaction.

    A process frozen inside a transaction keeps its row locks, and every
    other processor's write to those rows waits for it without a timeout
    (``test_a_stuck_row_lock_costs_only_its_own_partition``); callers that
    test something else pause at a clean point instead.

    Raises:
        AssertionError: every one of ``attempts`` pauses caught it inside a transaction.
    """
    for _ in range(attempts):
        proc.pause()
        states = await wait_until(
            lambda: sessions.quiet_states(proc.owner), timeout=10,
            message=f"{proc.owner}'s queries to finish")
        if not any(state.startswith("idle in transaction") for state in states):
            return
        proc.resume()
        await wait_until(lambda: sessions.no_transaction(proc.owner), timeout=10,
                         message=f"{proc.owner} to leave its transaction")
    raise AssertionError(f"could not pause {proc.owner} outside a transaction")


class TcpProxy:
    """A loopback TCP proxy to a target: ``forward``, ``stall`` (connections stay open
    but no byte moves: a network partition), ``reject`` (accept and close at once:
    the server is down) and ``cut`` (close every open connection).

    ``accepted`` counts connection attempts, so a test can see retries happen.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.mode = "reject"
        self.accepted = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._flowing = asyncio.Event()

    async def __aenter__(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self.cut()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def forward(self) -> None:
        """Pass connections through to the target (and release stalled traffic)."""
        self.mode = "forward"
        self._flowing.set()

    def stall(self) -> None:
        """Keep connections (and accept new ones) but move no data until :meth:`forward`."""
        self.mode = "stall"
        self._flowing.clear()

    def reject(self) -> None:
        """Accept new connections and close them at once (the database is down)."""
        self.mode = "reject"

    def cut(self) -> None:
        """Close every open connection, both ways."""
        for writer in list(self._links):
            writer.transport.abort()
        self._links.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.mode == "reject":
            writer.transport.abort()
            return
        # Registered at once, so a cut() while the upstream connects closes it too.
        self._links.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        if writer not in self._links:  # cut meanwhile
            up_writer.transport.abort()
            return
        self._links.add(up_writer)
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                await self._flowing.wait()
                sink.write(data)
                await sink.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            sink.transport.abort()
            self._links.discard(sink)
