"""An operator's answer for one item: what ``processor replay --apply`` (and the console's
"Replay to…" form) writes once a handler answered a replayed call.

The answer is written as a processor would write it
(:func:`watcher.rules.decisions.write_for_outcome`), with one guard in place of the
lease: the item's version, read by the operator before the call. A processor that had
the item in hand meanwhile finds its own write fenced off by the same version, so
exactly one of the two answers lands.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.sql.expression import Update

from watcher.config import DEFAULT_MAX_ITEM_BYTES
from watcher.errors import AnswerRefusedError, ItemChangedError, ItemNotFoundError
from watcher.models import AVAILABLE, FAILED, WAITING
from watcher.protocol import ProcessorError, Result
from watcher.records import ReadyItem
from watcher.rules.completions import settles_at
from watcher.rules.decisions import RetryPolicy, write_for_outcome
from watcher.rules.delays import MAX_SNOOZE_SECONDS
from watcher.rules.spawn import DEFAULT_SPAWN_LIMITS, SpawnLimits
from watcher.store.codecs import decode_quorum
from watcher.store.sql.sources import ResultSource
from watcher.store.waits import DEFAULT_POLICY, WaitsStore

# The item statuses an operator's answer applies to: those a processor still calls.
ANSWERABLE = frozenset({AVAILABLE, FAILED, WAITING})


@dataclass(frozen=True, slots=True)
class AppliedAnswer:
    """What an operator's answer did to its item: its status, gate, version, attempts and
    error now (``completion_token`` is the replayed call's token when the answer parked
    the item, so that the handler's own token completes that wait)."""

    partition_id: str
    item_id: str
    status: str
    gate: int
    version: int
    attempts: int
    last_error: str | None = None
    completion_token: str | None = None
    deadline: datetime | None = None


class ReplaysStore(WaitsStore):
    """The guarded write of an operator's answer for one item."""

    async def item_apply_answer(self, partition_id: str, item_id: str, version: int,
                                outcome: Result | ProcessorError, *, completion_token: str,
                                policy: RetryPolicy = DEFAULT_POLICY,
                                max_data_bytes: int = DEFAULT_MAX_ITEM_BYTES,
                                spawn_limits: SpawnLimits = DEFAULT_SPAWN_LIMITS
                                ) -> AppliedAnswer:
        """Write ``outcome`` (a handler's answer, or the error its call became) to the item
        ``item_id`` as a processor would, only while the item is still at ``version`` (the
        version the operator read before calling the handler) and its partition is open;
        what the answer spawns, the wait it begins (keyed by ``completion_token``, the
        call's) and, at a gate with a quorum it meets, the skip of the gate's others are
        written in the same transaction. The partition's processors are woken.

        Raises:
            PartitionNotFoundError: no partition has this id.
            ItemNotFoundError: the partition holds no such item.
            AnswerRefusedError: the partition is not open, or the item is complete or
                skipped; nothing was written.
            ItemChangedError: the item is at another version than ``version``, or moved
                between the read and the write; nothing was written.
            SpawnConflictError: the answer spawns an id the partition holds already.
        """
        async with self._write() as conn:
            await self._require_partition(conn, partition_id)
            row = (await conn.execute(self.statements.waits.item_by_id,
                                      {"pid": partition_id, "iid": item_id})).first()
            if row is None:
                raise ItemNotFoundError(partition_id, item_id)
            if row.item_version != version:  # first: what moved it says more than its status
                raise ItemChangedError(partition_id, item_id, version, row.item_version)
            refusal = answer_refusal(partition_id, item_id, row.partition_status, row.status)
            if refusal is not None:
                raise AnswerRefusedError(refusal)
            item = ReadyItem(item_id, version, row.gate, b"", row.attempts,
                             error_history=row.error_history, wait_key=row.item_wait_key)
            write = write_for_outcome(partition_id, item, outcome, row.partition_gate, policy,
                                      max_data_bytes=max_data_bytes,
                                      max_snooze=MAX_SNOOZE_SECONDS,
                                      spawn_limits=spawn_limits,
                                      completion_token=completion_token)
            k = dict(decode_quorum(row.quorum)).get(row.gate, 0)
            if k and settles_at(write, row.gate) and \
                    await self._quorum_count_in(conn, partition_id, row.gate, k) >= k:
                raise AnswerRefusedError(
                    f"gate {row.gate} of partition {partition_id!r} has passed its quorum "
                    f"of {k}; nothing was written")
            touched = await conn.execute(
                self._answer_write(new_data=write.data is not None,
                                   delayed=bool(write.retry_delay),
                                   parking=write.wait is not None),
                self.statements.item_write_params(write, ""))
            if touched.rowcount != 1:
                raise ItemChangedError(partition_id, item_id, version, version + 1)
            if write.spawn:
                await self._spawn_in(conn, [(partition_id, item_id, write.spawn)])
            await self._replaced_waits_in(conn, [write])
            if k and settles_at(write, row.gate):
                await self._quorum_in(conn, partition_id, row.gate, k)
            await self._wake_parked(conn, partition_id)
            await self._notify(conn, partition_id)
        gate = row.gate if write.gate is None else write.gate
        return AppliedAnswer(partition_id, item_id, write.status, gate, version + 1,
                             write.attempts, write.last_error,
                             completion_token if write.wait is not None else None)

    def _answer_write(self, *, new_data: bool, delayed: bool, parking: bool) -> Update:
        """The item write of an operator's answer from bound parameters, built once per
        shape: guarded by the version read, with no lease fence (an operator holds none)."""
        shape = (new_data, delayed, parking)
        found = self._answer_writes.get(shape)
        if found is None:
            source = ResultSource.parameters(self.tables.items.c.data.type,
                                             new_data=new_data, delayed=delayed,
                                             parking=parking)
            found = self._answer_writes[shape] = self.statements.result_write(
                source, fenced=False)
        return found

    @functools.cached_property
    def _answer_writes(self) -> dict[tuple[bool, bool, bool], Update]:
        return {}


def answer_refusal(partition_id: str, item_id: str, partition_status: str | None,
                   item_status: str) -> str | None:
    """Why an operator's answer cannot apply to an item in ``item_status`` of a
    partition in ``partition_status`` (and what to do), or ``None`` when it can."""
    if partition_status != AVAILABLE:
        return (f"partition {partition_id!r} is {partition_status}, not open: an answer "
                "applies only to a partition that runs (`processor retry` re-opens a failed "
                "or cancelled one); nothing was written")
    if item_status not in ANSWERABLE:
        return (f"item {item_id!r} of partition {partition_id!r} is {item_status}: an "
                "answer applies only to an available, failed or waiting item (`processor "
                "rewind` sends it back first); nothing was written")
    return None
