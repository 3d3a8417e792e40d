"""The lease keeper's part in serving pipelines (:mod:`watcher.pipelines`): the version
pinned on a partition at its first lease, and the held partitions whose gate moved to a
place this watcher does not serve."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import replace

from sqlalchemy.exc import SQLAlchemyError

from watcher.config import WatcherConfig
from watcher.leasing.lease import Lease
from watcher.pipelines import ServedPipelines, ServedRoute
from watcher.records import LeaseRow
from watcher.store import Store

log = logging.getLogger(__name__)


def served_routes(config: WatcherConfig) -> tuple[ServedRoute, ...] | None:
    """The routes a watcher's lease reads are limited to; ``None``: every partition."""
    return None if config.pipelines is None else config.pipelines.routes


def unserved(leases: Iterable[Lease], pipelines: ServedPipelines | None,
             owner: str) -> tuple[str, ...]:
    """The held partitions of ``leases`` whose gate moved to a place ``pipelines`` does
    not serve, marked ``handing_over``: the watcher drains and releases them for a
    processor that serves it. None without ``pipelines`` (every place is served)."""
    if pipelines is None:
        return ()
    chosen = [lease for lease in leases
              if not (lease.handing_over or lease.lost or lease.closed)
              and not pipelines.serves(lease.settings.pipeline,
                                       lease.settings.pipeline_version, lease.gate)]
    for lease in chosen:
        lease.handing_over = True
        log.info("action=lease_handing_over partition=%s pipeline=%s owner=%s gate=%d "
                 "reason=not_served", lease.partition_id, lease.settings.pipeline, owner,
                 lease.gate)
    return tuple(lease.partition_id for lease in chosen)


async def pin_versions(store: Store, won: list[LeaseRow], pipelines: ServedPipelines | None,
                       owner: str) -> list[LeaseRow]:
    """``won`` (leases just taken) with their pipeline's current version pinned on the
    partitions that had none (:meth:`Store.partitions_pin_version`): from now on they
    keep it. A pin that fails (the database) leaves them unpinned, logged: they are
    routed by the current version all the same, and pinned at a later lease."""
    pins = {row.id: version for row in won if pipelines is not None and (
        version := pipelines.pin(row.settings.pipeline, row.settings.pipeline_version))}
    if not pins:
        return won
    try:
        pinned = set(await store.partitions_pin_version(list(pins.items()), owner))
    except SQLAlchemyError as error:
        log.warning("action=pipeline_pin_failed owner=%s partitions=%d error=%s", owner,
                    len(pins), type(error).__name__)
        return won
    return [replace(row, settings=replace(row.settings, pipeline_version=pins[row.id]))
            if row.id in pinned else row for row in won]
