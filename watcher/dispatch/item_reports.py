"""What one partition's supervisor reports of its items: the hooks of their calls and
writes, each with the partition's pipeline, and the log lines of items that failed for
good, parked, went stale or could not be written (``partition=... pipeline=...``).

Per-item hooks that a watcher's hooks do not override (their no-op) are not called at
all: the no-op would cost a call per item."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from watcher.dispatch.context import PartitionContext
from watcher.dispatch.failures import item_failed
from watcher.hooks import overrides
from watcher.models import FAILED
from watcher.records import ItemWrite, ReadyItem
from watcher.waits import item_parked

log = logging.getLogger(__name__)


class ItemReports:
    """Reports one leased partition's items (``context``'s) to the hooks and the log."""

    def __init__(self, context: PartitionContext) -> None:
        self.hooks = context.hooks
        self.partition_id = context.partition_id
        self.pipeline = context.lease.settings.pipeline
        self.dispatches = overrides(self.hooks, "item_dispatched")
        self.outcomes = overrides(self.hooks, "item_outcome")

    def dispatched(self, items: Sequence[ReadyItem]) -> None:
        """``items`` were handed to the processor."""
        if self.dispatches:
            for item in items:
                self.hooks.item_dispatched(self.partition_id, item.id, item.gate,
                                           pipeline=self.pipeline)

    def outcome(self, item: ReadyItem, outcome: str, seconds: float) -> None:
        """``item``'s call ended with ``outcome`` (held, or written) ``seconds`` after it
        was dispatched."""
        if self.outcomes:
            self.hooks.item_outcome(self.partition_id, item.id, item.gate, outcome, seconds,
                                    pipeline=self.pipeline)

    def written(self, item: ReadyItem, write: ItemWrite, outcome: str,
                seconds: float) -> None:
        """``write``, ``item``'s result, was written: its outcome, and its one log line
        when it failed for good or parked."""
        self.outcome(item, outcome, seconds)
        if write.status == FAILED:
            item_failed(self.partition_id, item.id, item.gate, write.attempts,
                        write.last_error, pipeline=self.pipeline)
        elif write.wait is not None:
            item_parked(self.partition_id, item.id, item.gate, write.wait.timeout,
                        pipeline=self.pipeline)

    def stale(self, item: ReadyItem, seconds: float) -> None:
        """``item``'s result was not written: the item or the lease moved on."""
        self.outcome(item, "stale", seconds)
        self.hooks.stale_result(self.partition_id, item.id, pipeline=self.pipeline)
        log.debug("action=stale_result partition=%s pipeline=%s item=%s", self.partition_id,
                  self.pipeline, item.id)

    def not_written(self, item: ReadyItem, error: BaseException) -> None:
        """The database refused ``item``'s result, a failure included: it runs again."""
        log.error("action=result_not_written partition=%s pipeline=%s item=%s error=%s "
                  "(the item stays available)", self.partition_id, self.pipeline, item.id,
                  type(error).__name__)

    def spawned(self, count: int) -> None:
        """A written result inserted ``count`` items."""
        self.hooks.items_spawned(self.partition_id, count, pipeline=self.pipeline)
