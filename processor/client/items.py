"""The client's reads of items: a page, every item, one item with its error history,
an item id across partitions, and a partition's timeline.

:class:`ItemReads` is a part of :class:`processor.AsyncClient`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

from processor.client.checks import (
    DEFAULT_PAGE,
    ITEM_STATUSES,
    MAX_PAGE,
    check_cursor,
    check_id,
    check_limit,
    check_status,
    is_gate,
)
from watcher.errors import InvalidInputError, ItemNotFoundError, PartitionNotFoundError
from watcher.models import MAX_GATE
from watcher.records import ItemInfo, Page
from watcher.rules.timeline import Timeline, decode_timeline
from watcher.store import Store

T = TypeVar("T")

# How many partitions find_items() lists by default, and at most.
DEFAULT_FIND_LIMIT = 20
MAX_FIND_LIMIT = 1000


class ItemReads:
    """Reads of items (a part of :class:`processor.AsyncClient`)."""

    store: Store

    async def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError  # AsyncClient's

    async def items(self, partition_id: str, *, status: str | None = None,
                    gate: int | None = None, limit: int = DEFAULT_PAGE,
                    after: str | None = None, with_data: bool = True) -> Page[ItemInfo]:
        """One page of a partition's items in id order, optionally only those with
        ``status`` and at ``gate``.

        The page is a list of at most ``limit`` items (1,000 by default); its
        ``next_cursor`` (the last item id) passed as ``after`` reads the next
        page, and is ``None`` on the last. Pages stay stable while items change
        status. ``with_data=False`` leaves the items' bytes unread (``data`` is
        ``b""``). :meth:`iter_items` walks a whole partition in bounded memory.

        Raises:
            InvalidInputError: an unknown status, a gate that is not a whole
                number from 0, ``limit`` not from 1 to 10,000, or a bad ``after``.
            PartitionNotFoundError: no partition has this id.
        """
        check_id("partition", partition_id)
        check_status(status, ITEM_STATUSES, "item")
        if gate is not None and not is_gate(gate):
            raise InvalidInputError(f"gate must be a whole number from 0 to {MAX_GATE}, "
                                    f"got {gate!r}")
        check_limit("limit", limit, MAX_PAGE)
        check_cursor(after)
        return await self._call(self.store.items_page(
            partition_id, status=status, gate=gate, after=after, limit=limit,
            with_data=with_data))

    async def item(self, partition_id: str, item_id: str, *,
                   with_data: bool = True) -> ItemInfo:
        """Read one item of a partition, with its error history (the oldest entry first)
        and, unless ``with_data`` is false, its data (``data`` is ``b""`` then).

        Raises:
            InvalidInputError: ``partition_id`` or ``item_id`` is not a valid id.
            PartitionNotFoundError: no partition has this id.
            ItemNotFoundError: the partition holds no item with this id.
        """
        check_id("partition", partition_id)
        check_id("item", item_id)
        info = await self._call(self.store.item_get(partition_id, item_id,
                                                    with_data=with_data))
        if info is None:
            raise ItemNotFoundError(partition_id, item_id)
        return info

    async def find_items(self, item_id: str, *, limit: int = DEFAULT_FIND_LIMIT
                         ) -> list[ItemInfo]:
        """The items with exactly this id, one per partition holding it (at most
        ``limit``, ordered by partition id), without their data (``data`` is ``b""``).

        One read through the index on item ids, whatever the number of partitions.

        Raises:
            InvalidInputError: ``item_id`` is not a valid id, or ``limit`` is not from 1
                to 1,000.
        """
        check_id("item", item_id)
        check_limit("limit", limit, MAX_FIND_LIMIT)
        return await self._call(self.store.items_find(item_id, limit))

    async def partition_timeline(self, partition_id: str) -> Timeline:
        """A partition's timeline (:mod:`watcher.rules.timeline`): when each gate began and
        ended, with the items that left it, and the items done in each of the last
        minutes, by the database clock. Empty until a processor has written it.

        Raises:
            InvalidInputError: ``partition_id`` is not a valid id.
            PartitionNotFoundError: no partition has this id.
        """
        check_id("partition", partition_id)
        found, text = await self._call(self.store.partition_timeline(partition_id))
        if not found:
            raise PartitionNotFoundError(partition_id)
        return decode_timeline(text)

    async def iter_items(self, partition_id: str, *, status: str | None = None,
                         gate: int | None = None, page_size: int = DEFAULT_PAGE,
                         with_data: bool = True) -> AsyncIterator[ItemInfo]:
        """Every item of a partition (with ``status``, at ``gate``), in id order, read a
        page at a time: memory holds one page, whatever the partition's size.

        Raises:
            InvalidInputError: see :meth:`items`.
            PartitionNotFoundError: no partition has this id.
        """
        after: str | None = None
        while True:
            page = await self.items(partition_id, status=status, gate=gate, limit=page_size,
                                    after=after, with_data=with_data)
            for item in page:
                yield item
            if page.next_cursor is None:
                return
            after = page.next_cursor
