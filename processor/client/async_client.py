"""The asyncio client: create partitions, add items, inspect and steer them.

Its reads of items (:mod:`processor.client.items`), its operator verbs on partitions
(:mod:`processor.client.verbs`) and its flow controls (:mod:`processor.client.flow`)
are parts of it, each in a module of its own. Bad input raises a
:class:`watcher.errors.InvalidInputError` subclass naming what is wrong
(:mod:`processor.client.checks`), and nothing is written.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Coroutine, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy.exc import SQLAlchemyError

from processor.client.checks import (
    DEFAULT_COUNT_CAP,
    DEFAULT_PAGE,
    DEFAULT_THROUGHPUT_MINUTES,
    FINISHED_STATUSES,
    MAX_COUNT_CAP,
    MAX_GATE_COUNT_PARTITIONS,
    MAX_PAGE,
    MAX_THROUGHPUT_MINUTES,
    PARTITION_STATUSES,
    WAIT_POLL_MAX,
    WAIT_POLL_START,
    check_cursor,
    check_id,
    check_items,
    check_limit,
    check_settings,
    check_start_at,
    check_status,
)
from processor.client.feed import FeedClient
from processor.client.flow import FlowClient
from processor.client.items import ItemReads
from processor.client.notifications import NotificationsClient
from processor.client.schedules import ScheduleClient
from processor.client.verbs import PartitionVerbs
from processor.client.waits import WaitsClient
from processor.feed.hub import FeedSettings
from processor.notify.targets import check_url
from processor.observe.tracing import capture_context
from watcher.config import DEFAULT_MAX_ITEM_BYTES
from watcher.errors import (
    ConnectionLostError,
    DatabaseError,
    InvalidInputError,
    PartitionNotFoundError,
)
from watcher.models import ID_MAX_LENGTH, Status
from watcher.records import NewItem, Page, PartitionInfo
from watcher.reports import Backlog, Throughput
from watcher.rules.checks import check_whole_number
from watcher.store import Store
from watcher.store.db.clock import Clock
from watcher.store.db.urls import DatabaseURL, parse_database_url
from watcher.text import first_line

T = TypeVar("T")


class AsyncClient(PartitionVerbs, FlowClient, ItemReads, ScheduleClient, WaitsClient,
                  NotificationsClient, FeedClient):
    """Insert and inspect partitions and items (asyncio), and control the flow of work
    (:class:`~processor.client.flow.FlowClient`), and schedule partitions
    (:class:`~processor.client.schedules.ScheduleClient`), and follow them live
    (:class:`~processor.client.feed.FeedClient`).

    ``db_url`` is a SQLAlchemy-style URL (``sqlite:///file.db``,
    ``postgresql://user:pass@host/db``); ``table_prefix`` namespaces the tables.
    ``max_item_bytes`` is the largest item data accepted (8 MiB by default, a
    size every supported database stores at its default settings); give the
    processors the same ``--max-item-bytes``. ``tracer_provider`` is the
    OpenTelemetry tracer provider of the completion spans (default: the
    application's global one, when it set one; docs/how-to/trace.md).
    ``notify_default`` is the processors' ``--notify-url``: a partition that names no
    notify URL and is cancelled through this client has its event sent there.
    ``feed`` is how :meth:`follow` polls (:class:`~processor.feed.hub.FeedSettings`:
    every 0.5 s by default, for all the client's follows at once). ``clock`` is where
    its statements take the time from (:mod:`watcher.store.db.clock`): the database's
    own by default; a test's :class:`~watcher.store.db.clock.FixedClock`, shared with
    the engine's store, makes the client judge deadlines by the test's time
    (:mod:`processor.testing`).

    Raises:
        ConfigError: the URL, the table prefix, the limit or a ``feed`` setting is
            invalid.
        InvalidInputError: ``notify_default`` is not an http(s) URL.
    """

    def __init__(self, db_url: str | DatabaseURL, table_prefix: str = "", *,
                 max_item_bytes: int = DEFAULT_MAX_ITEM_BYTES,
                 tracer_provider: Any = None, notify_default: str | None = None,
                 feed: FeedSettings | None = None, clock: Clock | None = None) -> None:
        self.max_item_bytes = check_whole_number("max_item_bytes", max_item_bytes)
        self.feed_settings = feed or FeedSettings()
        self.tracer_provider = tracer_provider
        self.notify_default = check_url("notify_default", notify_default)
        self._url = db_url if isinstance(db_url, DatabaseURL) else parse_database_url(db_url)
        self.store = Store.open(self._url, table_prefix, clock=clock)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """End the follows in progress and close the database connections."""
        await self._close_feed()
        await self.store.close()

    async def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Await ``coroutine``, turning a database failure into one readable error.

        Raises:
            ConnectionLostError: the connection was lost during the call (retry it).
            DatabaseError: the database failed; the message names it (no password).
        """
        try:
            return await coroutine
        except SQLAlchemyError as error:
            raise self.database_error(error) from None

    def database_error(self, error: SQLAlchemyError) -> DatabaseError:
        """The one readable error for a database failure: the URL without its password,
        and the driver's first line with every secret of the URL scrubbed."""
        cause = f"{type(error).__name__}: {self._url.scrub(first_line(error))}"
        if self.store.driver.session_lost(error):
            return ConnectionLostError(
                f"database {self._url.redacted()}: the connection was lost during the call "
                f"({cause}); its transaction was rolled back and the connection "
                "discarded: retry the call")
        return DatabaseError(f"database {self._url.redacted()} failed: {cause}")

    async def create_partition(self, partition_id: str, items: Sequence[NewItem] = (), *,
                               reduce_gates: Iterable[int] = (),
                               on_item_failure: str = "fail",
                               start_at: datetime | None = None,
                               priority: int = 0, key: str | None = None,
                               quorum: Mapping[int, int] | None = None,
                               notify: str | None = None, pipeline: str | None = None,
                               pipeline_version: str | None = None) -> None:
        """Create a partition with its items, in one transaction.

        ``reduce_gates`` are gates whose step is one reduce call for the whole
        gate (in pages for a big one) instead of one call per item.
        ``on_item_failure`` says what a failed item does: ``"fail"`` fails the
        partition at that gate (the default); ``"continue"`` carries on with
        the other items (a reduce sees the failed ones) and the partition
        completes with its failures counted. ``start_at`` (an aware datetime)
        schedules the partition: no processor leases it before then, by the
        database clock. An item's own ``NewItem.not_before`` holds back that item.
        ``priority`` (from -10 to 10, 0 by default) puts it ahead in the lease queue:
        each step counts as 30 s of waiting (:mod:`watcher.rules.priority`), so a lower
        priority still starts within a bounded time. ``key`` (a tenant or customer
        id) is the partition's concurrency key: partitions are queued fairly across
        keys, and the items in flight for one key, across the whole fleet, stay
        within its limit (:meth:`set_key_limit`). ``quorum`` (``{gate: k}``) lets a
        gate pass on the first ``k`` of its items to complete: the others, waiting,
        available or in flight, are settled as ``skipped`` (their late answers are
        discarded), in the transaction that completed the k-th
        (docs/how-to/park.md#the-first-k-of-n).
        ``notify`` (an http or https URL) is POSTed a signed JSON event when the
        partition ends: complete, failed or cancelled (docs/how-to/notifications.md).
        ``pipeline`` (``default`` when ``None``) names the pipeline whose routes serve
        it, and ``pipeline_version`` the version it keeps (``None``: the routes' current
        version when a processor first leases it; docs/how-to/pipelines.md).
        When an OpenTelemetry span is current, its trace context is stored with the
        partition: every handler call's span links to it (docs/how-to/trace.md).

        Raises:
            InvalidInputError: bad ids, data, gates, reduce gates or policy (a
                subclass names the case), or a ``start_at`` or ``not_before`` with no
                time zone or more than a year ahead, a priority out of range, a
                key that is not a valid id, or a quorum that is not ``{gate: k}``
                with whole numbers (k at least 1), or a ``notify`` that is not an
                http(s) URL, or a ``pipeline`` or ``pipeline_version`` that is not a
                name (letters, digits, ``_ . -``).
            PartitionExistsError: the partition exists already.
            DuplicateItemError: item ids repeat.
        """
        check_id("partition", partition_id)
        settings = check_settings(partition_id, reduce_gates, on_item_failure, priority,
                                  key, quorum, notify, pipeline, pipeline_version)
        trace_context = capture_context()
        if trace_context is not None:
            settings = replace(settings, trace_context=trace_context)
        start = check_start_at(partition_id, start_at)
        checked = check_items(partition_id, items, allow_empty=True,
                               max_item_bytes=self.max_item_bytes)
        await self._call(self.store.partition_create(partition_id, checked, settings,
                                                     start_at=start))

    async def add_items(self, partition_id: str, items: Sequence[NewItem]) -> bool:
        """Add items to a partition, re-opening it if it was complete.

        Returns whether the partition was re-opened. A failed partition stays
        failed until :meth:`retry_failed`.

        Raises:
            InvalidInputError: bad ids, data or gates.
            PartitionNotFoundError: no partition has this id.
            GateError: an item's gate is below the partition's current gate.
            DuplicateItemError: an item id repeats or is already stored.
        """
        check_id("partition", partition_id)
        checked = check_items(partition_id, items, allow_empty=False,
                               max_item_bytes=self.max_item_bytes)
        return await self._call(self.store.items_add(partition_id, checked))

    async def partition(self, partition_id: str) -> PartitionInfo:
        """Read a partition with its item counts per status.

        Raises:
            PartitionNotFoundError: no partition has this id.
        """
        check_id("partition", partition_id)
        info = await self._call(self.store.partition_get(partition_id))
        if info is None:
            raise PartitionNotFoundError(partition_id)
        return info

    async def partitions(self, status: str | None = None, limit: int = DEFAULT_PAGE, *,
                         after: str | None = None, id_prefix: str | None = None,
                         with_counts: bool = True) -> Page[PartitionInfo]:
        """One page of partitions, newest first, optionally only those with ``status``
        and those whose id starts with ``id_prefix`` (case counts).

        The page is a list of at most ``limit`` partitions; its ``next_cursor``,
        passed as ``after`` (with the same filters), reads the next page
        (``None``: this is the last). Pages stay stable while partitions change
        (the order is by creation time and id). :meth:`iter_partitions` walks
        them all. ``with_counts=False`` leaves the item counts unread
        (``counts`` is empty).

        Raises:
            InvalidInputError: ``status`` is not a known status, ``limit`` is not
                from 1 to 10,000, ``after`` is not a cursor of this listing, or
                ``id_prefix`` is not text of at most 255 characters without NUL.
        """
        check_status(status, PARTITION_STATUSES, "partition")
        check_limit("limit", limit, MAX_PAGE)
        check_cursor(after)
        if id_prefix is not None and (not isinstance(id_prefix, str)
                                      or len(id_prefix) > ID_MAX_LENGTH or "\x00" in id_prefix):
            raise InvalidInputError(f"id_prefix must be text of at most {ID_MAX_LENGTH} "
                                    f"characters without NUL, got {id_prefix!r:.60}")
        return await self._call(self.store.partitions_page(
            status=status, after=after, limit=limit, prefix=id_prefix or None,
            with_counts=with_counts))

    async def gate_counts(self, partition_ids: Sequence[str]
                          ) -> dict[str, dict[int, dict[str, int]]]:
        """Each partition's items counted per gate and status, for up to 1,000 partitions:
        ``{partition: {gate: {status: count}}}``, where an item counts at the gate it
        is at now. A partition without items maps to ``{}``; unknown ids are left out.

        It reads the items of the partitions asked for (through an index), so ask
        for one page of partitions at a time.

        Raises:
            InvalidInputError: an id is not a valid partition id, or more than 1,000
                are given.
        """
        ids = [check_id("partition", partition_id) for partition_id in partition_ids]
        if len(ids) > MAX_GATE_COUNT_PARTITIONS:
            raise InvalidInputError(f"gate_counts takes at most {MAX_GATE_COUNT_PARTITIONS} "
                                    f"partitions at once, got {len(ids)}")
        return await self._call(self.store.items_gate_counts(ids))

    async def lease_holders(self) -> dict[str, int]:
        """The processors holding live leases now, each with how many partitions it holds."""
        stats = await self._call(self.store.lease_stats())
        return dict(sorted(stats.owners.items(), key=lambda pair: (-pair[1], pair[0])))

    async def backlog(self, cap: int = DEFAULT_COUNT_CAP) -> Backlog:
        """Partitions per status, and available items at their open partition's current
        gate, each count stopping at ``cap`` (one bounded, indexed statement).

        Raises:
            InvalidInputError: ``cap`` is not from 1 to 1,000,000.
        """
        check_limit("cap", cap, MAX_COUNT_CAP)
        return await self._call(self.store.backlog_read(cap))

    async def throughput(self, minutes: int = DEFAULT_THROUGHPUT_MINUTES,
                         cap: int = DEFAULT_COUNT_CAP) -> Throughput:
        """Partitions finished (complete, failed, cancelled) in each of the last
        ``minutes`` minutes by the database clock, each count stopping at ``cap``.

        Raises:
            InvalidInputError: ``minutes`` is not from 1 to 60, or ``cap`` not from 1
                to 1,000,000.
        """
        check_limit("minutes", minutes, MAX_THROUGHPUT_MINUTES)
        check_limit("cap", cap, MAX_COUNT_CAP)
        return await self._call(self.store.partitions_finished_per_minute(minutes, cap))

    async def now(self) -> datetime:
        """The database clock's time (naive UTC, like the partitions' and items' times)."""
        return await self._call(self.store.now())

    async def iter_partitions(self, status: str | None = None, *,
                              page_size: int = DEFAULT_PAGE) -> AsyncIterator[PartitionInfo]:
        """Every partition (of ``status``), newest first, read a page at a time.

        Raises:
            InvalidInputError: see :meth:`partitions`.
        """
        after: str | None = None
        while True:
            page = await self.partitions(status, page_size, after=after)
            for info in page:
                yield info
            if page.next_cursor is None:
                return
            after = page.next_cursor

    async def wait(self, partition_id: str, timeout: float) -> PartitionInfo:  # noqa: ASYNC109
        """Wait until the partition is complete, failed or cancelled and return it.

        Raises:
            TimeoutError: it is still open after ``timeout`` seconds.
            PartitionNotFoundError: no partition has this id.
        """
        deadline = time.monotonic() + timeout
        delay = WAIT_POLL_START
        while True:
            info = await self.partition(partition_id)
            # A complete partition holding available items (stranded by a version
            # before the store re-opened it on every re-arm) is not done.
            stranded = info.status == Status.COMPLETE.value and info.counts.get(
                Status.AVAILABLE.value)
            if info.status in FINISHED_STATUSES and not stranded:
                return info
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                advice = ("; nothing dispatches the available items of a complete "
                          "partition: processor retry re-opens it" if stranded else "")
                raise TimeoutError(
                    f"partition {partition_id!r} is still {info.status} at gate {info.gate} "
                    f"after {timeout} s (items: {info.counts}){advice}")
            await asyncio.sleep(min(delay, remaining))
            delay = min(WAIT_POLL_MAX, delay * 2)

