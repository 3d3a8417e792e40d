"""The synchronous client: create partitions, add items, inspect and steer them.

``Client`` offers the methods of the asyncio API
(:class:`processor.client.async_client.AsyncClient`) to synchronous code, running them
on a private event loop thread. Bad input
raises a :class:`watcher.errors.InvalidInputError` subclass naming what is
wrong, and nothing is written.
"""


from __future__ import annotations

import asyncio
import threading
from collections.abc import Collection, Coroutine, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from processor.client.async_client import AsyncClient
from processor.client.checks import (
    DEFAULT_COUNT_CAP,
    DEFAULT_PAGE,
    DEFAULT_THROUGHPUT_MINUTES,
)
from processor.client.feed import SyncFeed
from processor.client.items import DEFAULT_FIND_LIMIT
from processor.client.notifications import SyncNotificationsClient
from processor.client.schedules import SyncScheduleClient
from processor.client.waits import SyncWaits
from processor.feed.hub import FeedSettings
from watcher.config import DEFAULT_MAX_ITEM_BYTES
from watcher.records import ItemInfo, NewItem, Page, PartitionInfo
from watcher.reports import (
    Backlog,
    FlowControlInfo,
    PipelineCount,
    PipelineMove,
    PlaceCount,
    ProcessorInfo,
    PurgeReport,
    RetryReport,
    RewindReport,
    Throughput,
)
from watcher.retention import (
    DEFAULT_BATCH,
    DEFAULT_STATUSES,
)
from watcher.store.db.urls import DatabaseURL

T = TypeVar("T")


class Client(SyncScheduleClient, SyncWaits, SyncNotificationsClient, SyncFeed):
    """The synchronous client: the same methods as :class:`AsyncClient`.

    Calls run on a private event loop in a background thread, so this works
    from plain scripts and from threads that already run an event loop.

    Raises:
        ConfigError: the URL, the table prefix or a ``feed`` setting is invalid.
    """

    def __init__(self, db_url: str | DatabaseURL, table_prefix: str = "", *,
                 max_item_bytes: int = DEFAULT_MAX_ITEM_BYTES,
                 tracer_provider: Any = None, notify_default: str | None = None,
                 feed: FeedSettings | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="statefeed-client",
                                        daemon=True)
        self._thread.start()
        try:
            self._async = self._run(self._make(db_url, table_prefix, max_item_bytes,
                                               tracer_provider, notify_default, feed))
        except BaseException:
            self._stop_loop()
            raise

    @staticmethod
    async def _make(db_url: str | DatabaseURL, table_prefix: str,
                    max_item_bytes: int, tracer_provider: Any,
                    notify_default: str | None, feed: FeedSettings | None) -> AsyncClient:
        return AsyncClient(db_url, table_prefix, max_item_bytes=max_item_bytes,
                           tracer_provider=tracer_provider, notify_default=notify_default,
                           feed=feed)

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if self._loop.is_closed():
            coroutine.close()
            raise RuntimeError("this Client is closed")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the database connections and the background loop. Safe to call twice."""
        if self._loop.is_closed():
            return
        try:
            self._run(self._async.close())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def create_partition(self, partition_id: str, items: Sequence[NewItem] = (), *,
                         reduce_gates: Iterable[int] = (),
                         on_item_failure: str = "fail",
                         start_at: datetime | None = None, priority: int = 0,
                         key: str | None = None,
                         quorum: Mapping[int, int] | None = None,
                         notify: str | None = None, pipeline: str | None = None,
                         pipeline_version: str | None = None) -> None:
        """See :meth:`AsyncClient.create_partition`."""
        return self._run(self._async.create_partition(
            partition_id, items, reduce_gates=reduce_gates, on_item_failure=on_item_failure,
            start_at=start_at, priority=priority, key=key, quorum=quorum, notify=notify,
            pipeline=pipeline, pipeline_version=pipeline_version))

    def add_items(self, partition_id: str, items: Sequence[NewItem]) -> bool:
        """See :meth:`AsyncClient.add_items`."""
        return self._run(self._async.add_items(partition_id, items))

    def partition(self, partition_id: str) -> PartitionInfo:
        """See :meth:`AsyncClient.partition`."""
        return self._run(self._async.partition(partition_id))

    def partitions(self, status: str | None = None, limit: int = DEFAULT_PAGE, *,
                   after: str | None = None, id_prefix: str | None = None,
                   with_counts: bool = True) -> Page[PartitionInfo]:
        """See :meth:`AsyncClient.partitions`."""
        return self._run(self._async.partitions(status, limit, after=after,
                                                id_prefix=id_prefix,
                                                with_counts=with_counts))

    def gate_counts(self, partition_ids: Sequence[str]) -> dict[str, dict[int, dict[str, int]]]:
        """See :meth:`AsyncClient.gate_counts`."""
        return self._run(self._async.gate_counts(partition_ids))

    def lease_holders(self) -> dict[str, int]:
        """See :meth:`AsyncClient.lease_holders`."""
        return self._run(self._async.lease_holders())

    def backlog(self, cap: int = DEFAULT_COUNT_CAP) -> Backlog:
        """See :meth:`AsyncClient.backlog`."""
        return self._run(self._async.backlog(cap))

    def throughput(self, minutes: int = DEFAULT_THROUGHPUT_MINUTES,
                   cap: int = DEFAULT_COUNT_CAP) -> Throughput:
        """See :meth:`AsyncClient.throughput`."""
        return self._run(self._async.throughput(minutes, cap))

    def now(self) -> datetime:
        """See :meth:`AsyncClient.now`."""
        return self._run(self._async.now())

    def iter_partitions(self, status: str | None = None, *,
                        page_size: int = DEFAULT_PAGE) -> Iterator[PartitionInfo]:
        """See :meth:`AsyncClient.iter_partitions` (a page is read as the last one runs out)."""
        after: str | None = None
        while True:
            page = self.partitions(status, page_size, after=after)
            yield from page
            if page.next_cursor is None:
                return
            after = page.next_cursor

    def items(self, partition_id: str, *, status: str | None = None, gate: int | None = None,
              limit: int = DEFAULT_PAGE, after: str | None = None,
              with_data: bool = True) -> Page[ItemInfo]:
        """See :meth:`AsyncClient.items`."""
        return self._run(self._async.items(partition_id, status=status, gate=gate, limit=limit,
                                           after=after, with_data=with_data))

    def item(self, partition_id: str, item_id: str, *, with_data: bool = True) -> ItemInfo:
        """See :meth:`AsyncClient.item`."""
        return self._run(self._async.item(partition_id, item_id, with_data=with_data))

    def find_items(self, item_id: str, *, limit: int = DEFAULT_FIND_LIMIT) -> list[ItemInfo]:
        """See :meth:`AsyncClient.find_items`."""
        return self._run(self._async.find_items(item_id, limit=limit))

    def iter_items(self, partition_id: str, *, status: str | None = None,
                   gate: int | None = None, page_size: int = DEFAULT_PAGE,
                   with_data: bool = True) -> Iterator[ItemInfo]:
        """See :meth:`AsyncClient.iter_items` (a page is read as the last one runs out)."""
        after: str | None = None
        while True:
            page = self.items(partition_id, status=status, gate=gate, limit=page_size,
                              after=after, with_data=with_data)
            yield from page
            if page.next_cursor is None:
                return
            after = page.next_cursor

    def retry_failed(self, partition_id: str) -> RetryReport:
        """See :meth:`AsyncClient.retry_failed`."""
        return self._run(self._async.retry_failed(partition_id))

    def rewind(self, partition_id: str, gate: int, *, failed_only: bool = False,
               items: Collection[str] | None = None,
               version: int | None = None) -> RewindReport:
        """See :meth:`AsyncClient.rewind`."""
        return self._run(self._async.rewind(partition_id, gate, failed_only=failed_only,
                                            items=items, version=version))

    def cancel(self, partition_id: str) -> bool:
        """See :meth:`AsyncClient.cancel`."""
        return self._run(self._async.cancel(partition_id))

    def set_key_limit(self, key: str, max_inflight: int | None, *,
                      define: bool = False) -> None:
        """See :meth:`AsyncClient.set_key_limit`."""
        return self._run(self._async.set_key_limit(key, max_inflight, define=define))

    def set_key_rate(self, key: str, calls_per_second: float | None, *,
                     define: bool = False) -> None:
        """See :meth:`AsyncClient.set_key_rate`."""
        return self._run(self._async.set_key_rate(key, calls_per_second, define=define))

    def key_grants(self, limit: int = 10_000) -> dict[str, list[tuple[str, int, int]]]:
        """See :meth:`AsyncClient.key_grants`."""
        return self._run(self._async.key_grants(limit))

    def pause_key(self, key: str) -> bool:
        """See :meth:`AsyncClient.pause_key`."""
        return self._run(self._async.pause_key(key))

    def resume_key(self, key: str) -> bool:
        """See :meth:`AsyncClient.resume_key`."""
        return self._run(self._async.resume_key(key))

    def pause_all(self) -> bool:
        """See :meth:`AsyncClient.pause_all`."""
        return self._run(self._async.pause_all())

    def resume_all(self) -> bool:
        """See :meth:`AsyncClient.resume_all`."""
        return self._run(self._async.resume_all())

    def flow_controls(self, scope: str | None = None, *, limit: int = 1000,
                      after: tuple[str, str] | None = None) -> list[FlowControlInfo]:
        """See :meth:`AsyncClient.flow_controls`."""
        return self._run(self._async.flow_controls(scope, limit=limit, after=after))

    def pause(self, partition_id: str) -> bool:
        """See :meth:`AsyncClient.pause`."""
        return self._run(self._async.pause(partition_id))

    def resume(self, partition_id: str) -> bool:
        """See :meth:`AsyncClient.resume`."""
        return self._run(self._async.resume(partition_id))

    def delete_partition(self, partition_id: str, *, force: bool = False,
                         batch: int = DEFAULT_BATCH) -> int:
        """See :meth:`AsyncClient.delete_partition`."""
        return self._run(self._async.delete_partition(partition_id, force=force, batch=batch))

    def purge(self, *, older_than: float | timedelta,
              statuses: Collection[str] = DEFAULT_STATUSES, batch: int = DEFAULT_BATCH,
              dry_run: bool = False) -> PurgeReport:
        """See :meth:`AsyncClient.purge`."""
        return self._run(self._async.purge(older_than=older_than, statuses=statuses,
                                           batch=batch, dry_run=dry_run))

    def move_pipeline_version(self, partition_id: str, pipeline_version: str, *,
                              version: int | None = None) -> PipelineMove:
        """See :meth:`AsyncClient.move_pipeline_version`."""
        return self._run(self._async.move_pipeline_version(partition_id, pipeline_version,
                                                           version=version))

    def pipelines(self) -> list[PipelineCount]:
        """See :meth:`AsyncClient.pipelines`."""
        return self._run(self._async.pipelines())

    def processors(self) -> list[ProcessorInfo]:
        """See :meth:`AsyncClient.processors`."""
        return self._run(self._async.processors())

    def unserved_places(self) -> list[PlaceCount]:
        """See :meth:`AsyncClient.unserved_places`."""
        return self._run(self._async.unserved_places())

    def set_gate(self, partition_id: str, gate: int) -> None:
        """See :meth:`AsyncClient.set_gate`."""
        return self._run(self._async.set_gate(partition_id, gate))

    def wait(self, partition_id: str, timeout: float) -> PartitionInfo:
        """See :meth:`AsyncClient.wait`."""
        return self._run(self._async.wait(partition_id, timeout))

