"""A cluster: ``processor run`` subprocesses, a handler served on loopback and an empty
migrated table prefix of its own on the test PostgreSQL database, with the client
calls tests make on its data.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine

from processor import AsyncClient, ItemInfo, NewItem, PartitionInfo
from tests.acceptance.harness.database import Sessions, with_query
from tests.acceptance.harness.handler import RecordingHandler, initial_data
from tests.acceptance.harness.processes import FAST, Processor, spawn
from tests.conftest import POSTGRES_URL
from tests.support.engine import wait_until
from tests.support.namespaces import session_pool
from tests.support.servers import free_port, serve_app
from watcher.store.db.migrate import downgrade, upgrade
from watcher.store.db.urls import parse_database_url
from watcher.store.sql.schema import tables_for

SETTLED = ("complete", "failed")
# Settled while an operator cancels partitions too.
OPERATED = (*SETTLED, "cancelled")


class Cluster:
    """Processors, a handler and a table prefix of its own on the test PostgreSQL database.

    ``async with Cluster(tmp_path, handler) as cluster``: borrows an empty, migrated
    prefix from the test process's pool (tests/support/namespaces.py; outside pytest
    it migrates a new one) and serves the handler; on exit kills every process still
    running, stops the server and gives the prefix back (or drops its tables).
    ``cluster.client`` is a client on the prefix, ``cluster.db`` the test's own SQL
    and the processors' sessions.

    Each processor gets a unique owner id, its own handler URL path
    (``/p/<owner>``, so the handler knows who called) and its own
    ``application_name`` (so its PostgreSQL sessions can be found).
    """

    def __init__(self, tmp_path: Path, handler: RecordingHandler | Any | None = None, *,
                 db_url: str = POSTGRES_URL, name: str = "h") -> None:
        self.tmp_path = tmp_path
        self.handler = handler
        self.db_url = db_url
        self._name = name
        self.prefix = f"{name}{uuid.uuid4().hex[:10]}_"
        self.processors: list[Processor] = []
        self.base_url = ""
        self.client: AsyncClient
        self.db: Sessions
        self._stack = contextlib.AsyncExitStack()
        self._numbers = itertools.count(1)

    async def __aenter__(self) -> Cluster:
        pool = session_pool()
        if pool is None:
            await asyncio.to_thread(upgrade, self.db_url, self.prefix)
            self._stack.push_async_callback(asyncio.to_thread, downgrade, self.db_url,
                                            self.prefix)
        else:  # emptied before it is lent: as good as new, without a migration's cost
            borrowed = pool.borrow(self.db_url)
            self.prefix = await asyncio.to_thread(borrowed.__enter__)
            self._stack.push_async_callback(asyncio.to_thread, borrowed.__exit__, None, None,
                                            None)
        self.client = AsyncClient(self.db_url, self.prefix)
        self._stack.push_async_callback(self.client.close)
        engine = create_async_engine(parse_database_url(self.db_url).async_url)
        self._stack.push_async_callback(engine.dispose)
        # Its own names, not the prefix's: a borrowed prefix served earlier clusters.
        self.db = Sessions(engine, f"sft-{self._name}{uuid.uuid4().hex[:10]}_")
        if self.handler is not None:
            self.base_url = await self._stack.enter_async_context(serve_app(self.handler))
            if isinstance(self.handler, RecordingHandler):
                # Held calls would keep the server from shutting down.
                self._stack.callback(self.handler.release_all)
        self._stack.push_async_callback(self.kill_all)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    # -- processes --------------------------------------------------------------

    async def start(self, owner: str | None = None, *args: str, health: bool = False,
                    db_url: str | None = None, handler_url: str | None = None,
                    fast: bool = True, env: dict[str, str] | None = None) -> Processor:
        """Start ``processor run`` with a unique owner id (``p<n>`` unless given)."""
        owner = owner or f"p{next(self._numbers)}"
        if db_url is None:
            db_url = with_query(self.db_url, application_name=self.db.app_name(owner))
        if handler_url is None:
            handler_url = f"{self.base_url}/p/{owner}"
        health_port = free_port() if health else 0
        command = ["run", "--handler-url", handler_url, "--db-url", db_url,
                   "--table-prefix", self.prefix, "--owner-id", owner,
                   "--health-host", "127.0.0.1", "--health-port", str(health_port),
                   *(FAST if fast else ()), *args]
        proc = await spawn(owner, command, self.tmp_path, health_port=health_port, env=env)
        self.processors.append(proc)
        return proc

    async def start_many(self, count: int, *args: str, health: bool = False
                         ) -> list[Processor]:
        """Start ``count`` processors and wait until each one's watcher runs."""
        procs = [await self.start(None, *args, health=health) for _ in range(count)]
        await asyncio.gather(*(proc.wait_log("action=watcher_started") for proc in procs))
        return procs

    async def kill_all(self) -> None:
        """kill -9 every processor still running and reap it."""
        for proc in self.processors:
            proc.kill()
        for proc in self.processors:
            with contextlib.suppress(ProcessLookupError):
                await proc.process.wait()

    def log_tail(self, lines: int = 25) -> str:
        """The last lines of every processor's stderr, for failure messages."""
        return "\n".join(
            f"--- {proc.owner} (exit {proc.process.returncode}):\n"
            + "\n".join(proc.stderr().splitlines()[-lines:])
            for proc in self.processors)

    def assert_no_tracebacks(self) -> None:
        """Raises AssertionError (with its output) if any processor printed a traceback."""
        for proc in self.processors:
            assert "Traceback" not in proc.output(), f"{proc.owner}:\n{proc.output()[-4000:]}"

    # -- data -------------------------------------------------------------------

    async def create(self, partitions: int, items: int, *, name: str = "part",
                     data: bytes | None = None) -> dict[str, list[str]]:
        """Create pass-counter partitions; returns partition id -> item ids."""
        layout = {f"{name}{n:03d}": [f"item{m}" for m in range(items)]
                  for n in range(partitions)}
        for partition_id, item_ids in layout.items():
            await self.client.create_partition(
                partition_id, [NewItem(item_id, data or initial_data()) for item_id in item_ids])
        return layout

    async def create_layout(self, layout: dict[str, list[str]], *,
                            reduce_gates: Iterable[int] = ()) -> dict[str, list[str]]:
        """Create pass-counter partitions with the given item ids (and reduce gates);
        returns ``layout``."""
        gates = tuple(reduce_gates)
        for partition_id, item_ids in layout.items():
            await self.client.create_partition(
                partition_id, [NewItem(item_id, initial_data()) for item_id in item_ids],
                reduce_gates=gates)
        return layout

    async def partitions(self) -> dict[str, PartitionInfo]:
        """Every partition of the namespace by id."""
        return {info.id: info for info in await self.client.partitions(limit=10_000)}

    async def items(self, partition_ids: Iterable[str]) -> list[ItemInfo]:
        """Every item of the given partitions."""
        found: list[ItemInfo] = []
        for partition_id in partition_ids:
            found += [item async for item in self.client.iter_items(partition_id)]
        return found

    async def wait_settled(self, partition_ids: Iterable[str], timeout: float,  # noqa: ASYNC109
                           *, operated: bool = False) -> dict[str, PartitionInfo]:
        """Wait until every partition is complete or failed; returns them all.

        With ``operated`` (an operator cancels, deletes and purges partitions
        meanwhile), a cancelled partition counts as settled too, and so does one
        that is no longer there; the partitions returned are those still there.

        Raises:
            AssertionError: the deadline passed (naming the open partitions, with logs).
        """
        ids = set(partition_ids)
        finished = OPERATED if operated else SETTLED

        def open_ids(infos: dict[str, PartitionInfo]) -> list[str]:
            return [pid for pid in sorted(ids) if not (operated and pid not in infos)
                    and infos[pid].status not in finished]

        async def settled() -> dict[str, PartitionInfo] | None:
            infos = await self.partitions()
            return None if open_ids(infos) else infos

        try:
            return await wait_until(settled, timeout=timeout, interval=0.1,
                                    message=f"{len(ids)} partitions to settle")
        except AssertionError:
            infos = await self.partitions()
            open_ = {pid: (infos[pid].status, infos[pid].gate, infos[pid].owner,
                           infos[pid].counts) for pid in open_ids(infos)}
            raise AssertionError(
                f"partitions not settled after {timeout} s: {open_}\n" + self.log_tail()
            ) from None

    async def item_rows(self, partition_ids: Iterable[str]) -> dict[str, int]:
        """How many rows of the items table each partition still has (0 for none).

        Read in SQL: once a partition's row is gone the client answers
        PartitionNotFoundError, and would not show items a delete left behind.
        """
        ids = sorted(set(partition_ids))
        rows = await self.db.query(
            f"SELECT partition_id, count(*) FROM {tables_for(self.prefix).items.name} "
            "WHERE partition_id = ANY(:ids) GROUP BY partition_id", ids=ids)
        return {pid: 0 for pid in ids} | {pid: count for pid, count in rows}

    async def live_owners(self, *, lapsed_too: bool = False) -> dict[str, list[str]]:
        """Owner -> the available partitions it holds with an unexpired lease (DB clock);
        with ``lapsed_too``, the partitions whose row names it as owner, expired or not
        (who holds them until someone else takes them over)."""
        now = await self.client.store.now()
        owners: dict[str, list[str]] = defaultdict(list)
        for info in await self.client.partitions(status="available", limit=10_000):
            if info.owner and (lapsed_too or info.until > now):
                owners[info.owner].append(info.id)
        return dict(owners)
