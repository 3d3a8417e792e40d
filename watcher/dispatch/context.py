"""What the parts of one leased partition's dispatch share.

A partition's supervisor, its reads of ready items, its gate steps and its reducer
each work on the same lease, with the watcher's store, lease keeper, configuration and
hooks. :class:`PartitionContext` names that bundle once, so each part takes it whole
instead of five loose arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from watcher.config import WatcherConfig
    from watcher.hooks import Hooks
    from watcher.leasing.keeper import LeaseKeeper
    from watcher.leasing.lease import Lease
    from watcher.store import Store


@dataclass(frozen=True, slots=True)
class PartitionContext:
    """One leased partition's ``lease``, and the watcher's ``store``, lease ``keeper``,
    ``config`` and ``hooks`` that every part of its dispatch uses."""

    lease: Lease
    store: Store
    keeper: LeaseKeeper
    config: WatcherConfig
    hooks: Hooks

    @property
    def partition_id(self) -> str:
        """The leased partition's id."""
        return self.lease.partition_id
