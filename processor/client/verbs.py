"""The client's operator verbs on partitions: retry the failed items, rewind to a gate,
cancel, pause and resume, move the gate by hand, delete one partition and purge old ones.

:class:`PartitionVerbs` is a part of :class:`processor.AsyncClient`; what the verbs
report (:class:`~watcher.reports.RetryReport`, :class:`~watcher.reports.PurgeReport`)
crosses the store seam as plain values. Bad input raises an
:class:`~watcher.errors.InvalidInputError` before anything is written.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Coroutine
from datetime import timedelta
from typing import Any, TypeVar

from processor.client.checks import (
    FINISHED_STATUSES,
    check_id,
    check_limit,
    check_pipeline,
    check_seconds_value,
    is_gate,
)
from watcher.errors import ConfigError, InvalidInputError
from watcher.models import MAX_GATE, Status
from watcher.protocol import ProcessorError, Result
from watcher.reports import (
    PipelineCount,
    PipelineMove,
    PlaceCount,
    ProcessorInfo,
    PurgeReport,
    RetryReport,
    RewindReport,
)
from watcher.retention import (
    DEFAULT_BATCH,
    DEFAULT_STATUSES,
    MAX_BATCH,
    check_statuses,
    delete_partition,
    purge,
)
from watcher.rules.served.places import unserved
from watcher.rules.spawn import SpawnLimits
from watcher.store import Store
from watcher.store.operator.replays import AppliedAnswer

T = TypeVar("T")
log = logging.getLogger(__name__)


class PartitionVerbs:
    """Operator verbs on partitions (a part of :class:`processor.AsyncClient`)."""

    store: Store
    notify_default: str | None
    max_item_bytes: int

    async def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError  # AsyncClient's

    async def retry_failed(self, partition_id: str) -> RetryReport:
        """Run the partition's failed items again (attempts reset), re-opening it if it
        stopped, and say what was done.

        A complete, failed or cancelled partition re-opens at its lowest failed
        gate; a reduce gate it had finished after that gate runs again, over
        the items it completed and the retried ones. A failed reduce is
        re-armed. A running partition keeps its gate: its failed items below
        it stay failed. See :meth:`watcher.store.Store.items_retry_failed`.

        Raises:
            PartitionNotFoundError: no partition has this id (or it is being deleted).
        """
        check_id("partition", partition_id)
        return await self._call(self.store.items_retry_failed(partition_id))

    async def rewind(self, partition_id: str, gate: int, *, failed_only: bool = False,
                     items: Collection[str] | None = None,
                     version: int | None = None) -> RewindReport:
        """Move the partition back to ``gate`` and run again what is chosen there, re-opening
        it if it stopped (complete, failed or cancelled), and say what was done.

        The chosen items (every item at ``gate`` or later; only the failed ones with
        ``failed_only``; only those named in ``items``) go back to ``gate`` with their
        attempts reset and their error history kept; the rest keep what they have.
        The items the chosen ones spawned at ``gate`` or later are removed, with
        their descendants. Every reduce at ``gate`` or later runs again (once) and
        the result is cleared. A processor holding the partition lets it go; its
        late results are refused. With ``version``, only while the partition is at
        that version (:attr:`PartitionInfo.version`). See
        :meth:`watcher.store.Store.partition_rewind`. Nothing is written when it raises.

        Raises:
            InvalidInputError: ``gate`` is not a whole number >= 0, ``items`` is empty
                or names a bad id, or ``version`` is not a whole number; a named item
                is before ``gate`` or, with ``failed_only``, not failed.
            PartitionNotFoundError: no partition has this id.
            ItemNotFoundError: a named item is not in the partition.
            PartitionChangedError: the partition is not at ``version``.
            GateError: ``gate`` is above the partition's gate, or nothing at ``gate``
                or later would run again.
        """
        check_id("partition", partition_id)
        if not is_gate(gate):
            raise InvalidInputError(f"gate must be a whole number from 0 to {MAX_GATE}, "
                                    f"got {gate!r}")
        named: list[str] | None = None
        if items is not None:
            if isinstance(items, str | bytes):
                raise InvalidInputError("items must be a list of item ids, not one string")
            named = [check_id("item", item_id) for item_id in items]
            if not named:
                raise InvalidInputError("items names no item; leave it out to rewind every "
                                        "item at the gate or later")
        if version is not None and (type(version) is not int or version < 1):
            raise InvalidInputError(f"version must be a whole number from 1, got {version!r}")
        return await self._call(self.store.partition_rewind(
            partition_id, gate, failed_only=failed_only, items=named, version=version))

    async def cancel(self, partition_id: str) -> bool:
        """Stop a partition: an open or failed partition becomes ``cancelled``.

        No processor dispatches its items again: its holder drops it within a
        poll interval, cancelling the calls in flight, and any result that
        arrives for it later is discarded as stale. Its items stay as they
        are: :meth:`retry_failed` resumes it where it stopped, and
        :meth:`delete_partition` or :meth:`purge` removes it. Its event goes to its
        notify URL, or else to the client's ``notify_default``. Returns ``True``
        when it was cancelled, ``False`` when it was complete or cancelled
        already (it is left as it was).

        Raises:
            PartitionNotFoundError: no partition has this id (or it is being deleted).
        """
        check_id("partition", partition_id)
        before = await self._call(self.store.partition_cancel(partition_id,
                                                              self.notify_default))
        return before in (Status.AVAILABLE.value, Status.FAILED.value)

    async def pause(self, partition_id: str) -> bool:
        """Pause a partition, durably, until :meth:`resume`.

        Its holder starts no new call from its next read (within a poll
        interval); the calls in flight finish and their results are written;
        then it lets the lease go, and no processor takes the partition while it
        is paused, through restarts and failovers. Returns ``True`` when it was
        running and is paused now, ``False`` when it was paused already.

        Raises:
            PartitionNotFoundError: no partition has this id (or it is being deleted).
            InvalidInputError: it is finished (complete, failed or cancelled): nothing
                would run to pause.
        """
        check_id("partition", partition_id)
        info = await self._call(self.store.partition_get(partition_id))
        status = info.status if info is not None else None  # none: the pause says so
        if status in FINISHED_STATUSES:
            raise InvalidInputError(
                f"partition {partition_id!r} is {status}: nothing of it runs, so there is "
                "nothing to pause (a retry or an add re-opens it; pause it then)")
        return await self._call(self.store.partition_pause(partition_id, True))

    async def resume(self, partition_id: str) -> bool:
        """Lift a pause: the partition is leased again as before (within a lease cycle;
        at once on PostgreSQL). Returns ``False`` when it was not paused.

        Raises:
            PartitionNotFoundError: no partition has this id (or it is being deleted).
        """
        check_id("partition", partition_id)
        return await self._call(self.store.partition_pause(partition_id, False))

    async def delete_partition(self, partition_id: str, *, force: bool = False,
                               batch: int = DEFAULT_BATCH) -> int:
        """Delete a partition and its items, ``batch`` items per transaction.

        Refused while a processor holds a live lease on it, unless ``force``,
        which cancels it first. A delete cut short (the database failed) leaves
        the partition ``deleting``: nothing runs or re-opens it, and deleting it
        again (or a purge) finishes the job. Returns how many items were deleted.

        Raises:
            InvalidInputError: ``batch`` is not from 1 to 100,000.
            PartitionNotFoundError: no partition has this id.
            PartitionLeasedError: a processor holds its lease and ``force`` is false.
        """
        check_id("partition", partition_id)
        check_limit("batch", batch, MAX_BATCH)
        return await self._call(delete_partition(self.store, partition_id, force=force,
                                                 batch=batch))

    async def purge(self, *, older_than: float | timedelta,
                    statuses: Collection[str] = DEFAULT_STATUSES, batch: int = DEFAULT_BATCH,
                    dry_run: bool = False) -> PurgeReport:
        """Delete the partitions in ``statuses`` (complete and cancelled by default; failed
        ones only when named) last updated more than ``older_than`` ago by the database
        clock, with their items, ``batch`` items per transaction.

        Partitions left ``deleting`` by a delete cut short are finished too.
        With ``dry_run`` nothing is deleted: the report counts what would be.

        Raises:
            InvalidInputError: ``older_than`` is not a positive number of seconds or
                timedelta, a status is not complete, failed or cancelled, or
                ``batch`` is not from 1 to 100,000.
        """
        seconds = check_seconds_value("older_than", older_than)
        try:
            wanted = check_statuses("statuses", statuses)
        except ConfigError as error:
            raise InvalidInputError(str(error)) from None
        check_limit("batch", batch, MAX_BATCH)
        if dry_run:
            partitions, items = await self._call(self.store.partitions_purgeable_count(
                older_than=seconds, statuses=wanted))
            return PurgeReport(partitions, items)
        return await self._call(purge(self.store, older_than=seconds, statuses=wanted,
                                      batch=batch))

    async def set_gate(self, partition_id: str, gate: int) -> None:
        """Move an open partition's gate forward (a manual checkpoint); moving it to the
        gate it is at changes nothing. Moves that mean nothing are refused, and
        nothing is written.

        Raises:
            InvalidInputError: ``gate`` is not a whole number >= 0.
            PartitionNotFoundError: no partition has this id.
            GateError: the partition is complete, failed or cancelled; ``gate`` is
                below the current gate; items below ``gate`` are still available;
                or no item of it is available.
        """
        check_id("partition", partition_id)
        if not is_gate(gate):
            raise InvalidInputError(f"gate must be a whole number from 0 to {MAX_GATE}, "
                                    f"got {gate!r}")
        await self._call(self.store.partition_set_gate(partition_id, gate))

    async def move_pipeline_version(self, partition_id: str, pipeline_version: str, *,
                                    version: int | None = None) -> PipelineMove:
        """Move a partition to another version of its pipeline: from its next lease on,
        its calls go to that version's routes (docs/how-to/pipelines.md). A processor
        holding it lets it go now (its lease ends; its writes are fenced off), and one
        serving the version takes it at once. With ``version`` (its partition version, as
        :meth:`partition` reads it), only while it is at that version.

        Raises:
            InvalidInputError: a bad partition id, or a version that is not a name.
            PartitionNotFoundError: no partition has this id.
            PartitionFinishedError: it is complete (or being deleted): nothing runs again.
            PartitionChangedError: ``version`` was given and it is at another one, or it
                changed during the move (read it again and repeat).
        """
        check_id("partition", partition_id)
        checked = check_pipeline(partition_id, "pipeline_version", pipeline_version)
        return await self._call(self.store.partition_move_version(partition_id, checked,
                                                                  version=version))

    async def pipelines(self) -> list[PipelineCount]:
        """The open partitions per pipeline and version (``None``: not pinned yet), and
        how many of them a processor holds, by pipeline then version."""
        return await self._call(self.store.pipelines_count())

    async def processors(self) -> list[ProcessorInfo]:
        """The live processors (their rows' ``until`` not passed by the database clock),
        by owner id, each with what it serves: the tables of routes
        (:class:`~watcher.pipelines.ServedRoute`) of its routes file, or ``None`` for
        every place (a library watcher without ``pipelines``; ``--handler-url`` alone serves
        the ``default`` pipeline)."""
        return await self._call(self.store.processors_live())

    async def unserved_places(self) -> list[PlaceCount]:
        """The places (pipeline, version, gate) where open partitions wait that no live
        processor serves, with how many wait at each, by pipeline, version (``None``
        first: not pinned yet) and gate. Empty when every open partition's place is
        served. Start a processor whose routes serve such a place, or check the routes
        of those running (:meth:`processors`)."""
        places = await self._call(self.store.partitions_open_places())
        live = await self._call(self.store.processors_live())
        return unserved(places, [processor.serves for processor in live])

    async def apply_answer(self, partition_id: str, item_id: str, version: int,
                           outcome: Result | ProcessorError, *,
                           completion_token: str) -> AppliedAnswer:
        """Write a handler's answer to one item (``processor replay --apply``, the
        console's replay form) as a processor would, only while the item is still at
        ``version``, the version read before the call; ``completion_token`` is the call's
        (a parking answer's wait is completed with it). See
        :meth:`watcher.store.Store.item_apply_answer`.

        Raises:
            InvalidInputError: a bad id.
            PartitionNotFoundError, ItemNotFoundError: no such partition or item.
            AnswerRefusedError: the partition is not open, or the item is complete or
                skipped; nothing was written.
            ItemChangedError: the item moved since ``version``; nothing was written.
            SpawnConflictError: the answer spawns an id the partition holds already.
        """
        check_id("partition", partition_id)
        check_id("item", item_id)
        limit = self.max_item_bytes
        applied = await self._call(self.store.item_apply_answer(
            partition_id, item_id, version, outcome, completion_token=completion_token,
            max_data_bytes=limit, spawn_limits=SpawnLimits(max_item_bytes=limit)))
        log.info("action=answer_applied partition=%r item=%r status=%s gate=%d by=operator",
                 partition_id, item_id, applied.status, applied.gate)
        return applied
