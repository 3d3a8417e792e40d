"""Items too large to dispatch: stored around the client's size limit, failed, never called."""

from __future__ import annotations

import logging

from watcher.dispatch.failures import item_failed
from watcher.dispatch.writer import ResultWriter
from watcher.protocol import NonRetryableError
from watcher.records import ReadyItem
from watcher.rules.decisions import RetryPolicy, write_for_error
from watcher.store import Store

log = logging.getLogger(__name__)


def oversize_error(partition_id: str, item: ReadyItem, limit: int) -> NonRetryableError:
    """The error an item over ``limit`` bytes (``max_item_bytes``) fails with."""
    size = len(item.data) if item.size is None else item.size
    return NonRetryableError(
        f"the item is {size} bytes, over the item size limit of {limit} bytes "
        "(max_item_bytes); it was stored around the client's limit and is not dispatched")


async def fail_unreadable(store: Store, writer: ResultWriter, partition_id: str, gate: int,
                          limit: int, policy: RetryPolicy, *, limit_rows: int,
                          pipeline: str) -> bool:
    """After a failed read of ready items: fail the items too large to read or dispatch,
    so that they cannot block their partition's reads (its pipeline, ``pipeline``, is in
    the log lines). Returns whether any was found.

    Raises the database's error when the look-up fails.
    """
    oversize = await store.items_oversize(partition_id, gate, limit, limit=limit_rows)
    for item in oversize:
        write = write_for_error(partition_id, item, oversize_error(partition_id, item, limit),
                                policy)
        if await writer.submit(write):
            item_failed(partition_id, item.id, item.gate, write.attempts, write.last_error,
                        pipeline=pipeline)
    if oversize:
        log.warning("action=items_unreadable partition=%s pipeline=%s gate=%d count=%d",
                    partition_id, pipeline, gate, len(oversize))
    return bool(oversize)
