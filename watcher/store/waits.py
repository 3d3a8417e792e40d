"""Waits: the items parked at their gates, their deadlines, and their completions.

An item's current wait lives in its own row (its token's key, timeout, policy and
traceparent, revision 0021). A completion is one guarded transaction: the token's
key finds the item (through ``ix_items_wait``; else a ``waits`` row: an operator's
token, or a key a newer wait replaced), and the item is written only while it is
``waiting`` at the version the wait began with and its partition is open; anything
else is refused as already completed and writes nothing. Two completions racing for
one token: the item write of the second waits for the first's row lock, then finds
the version moved and matches nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Float, and_, bindparam, delete, exists, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.expression import Update

from watcher.errors import AlreadyCompletedError, CompletionRefusedError, WaitNotFoundError
from watcher.models import AVAILABLE, WAITING
from watcher.records import ReadyItem
from watcher.reports import WaitSummary
from watcher.rules.completions import Answer, completion_write, settles_at
from watcher.rules.decisions import RetryPolicy
from watcher.rules.spawn import DEFAULT_SPAWN_LIMITS, SpawnLimits
from watcher.store.codecs import IN_CHUNK, chunks, decode_quorum
from watcher.store.spawns import SpawnsStore
from watcher.store.sql.sources import ResultSource
from watcher.waits import new_completion_token, timeout_problem, token_hash, token_well_formed

DEFAULT_POLICY = RetryPolicy()


@dataclass(frozen=True, slots=True)
class ExpiredWait:
    """A waiting item whose deadline passed, with its wait's timeout and policy."""

    item: ReadyItem
    timeout: float
    on_timeout: str


@dataclass(frozen=True, slots=True)
class CompletedWait:
    """What a completion did: the item's new state, the new token when the answer
    parked it again (``completion_token``; ``None`` otherwise), and the ``traceparent``
    the wait stored of the call that parked the item (``parked_by``; ``None`` when
    tracing was off), which the completion's span links to."""

    partition_id: str
    item_id: str
    status: str
    gate: int
    version: int
    attempts: int
    last_error: str | None = None
    completion_token: str | None = None
    deadline: datetime | None = None
    parked_by: str | None = None


class WaitsStore(SpawnsStore):
    """The reads and writes of waits: expired ones for the holder, completions and
    heartbeats for whoever holds a token."""

    async def items_wait_expired(self, partition_id: str, gate: int,
                                 limit: int) -> list[ExpiredWait]:
        """Up to ``limit`` items waiting at ``gate`` whose deadline (their ``retry_at``)
        passed by the store's clock, with their waits' timeouts and policies; read
        through the ready index, so completed items are never visited."""
        i = self.tables.items
        query = (
            select(i.c.id, i.c.version, i.c.gate, i.c.attempts, i.c.error_history,
                   i.c.wait_key, i.c.wait_timeout, i.c.wait_policy)
            .where(i.c.partition_id == partition_id, i.c.status == WAITING, i.c.gate == gate,
                   i.c.retry_at <= self.statements.now)
            .order_by(i.c.retry_at, i.c.id).limit(limit))
        async with self._read() as conn:
            rows = (await conn.execute(query)).all()
        return [ExpiredWait(ReadyItem(row.id, row.version, row.gate, b"", row.attempts,
                                      error_history=row.error_history,
                                      wait_key=row.wait_key),
                            float(row.wait_timeout or 0.0), row.wait_policy or "")
                for row in rows]

    async def _waiting(self, conn: AsyncConnection, token: str) -> tuple[Any, Any]:
        """The wait of ``token`` (the handler's, or an operator's:
        :meth:`wait_operator_token`) and its item and partition's state, one row
        serving as both: the item whose last wait has the token's key
        (:attr:`~watcher.store.sql.waits.WaitStatements.item_by_key`), else the
        ``waits`` row with it (:attr:`~watcher.store.sql.waits.WaitStatements.by_token`).

        Raises:
            WaitNotFoundError: no wait has this token (or it is malformed).
            AlreadyCompletedError: its wait is over, its partition is not open, or its
                item was deleted (in the last 30 days: ``removed_waits``).
        """
        if not isinstance(token, str) or not token_well_formed(token):
            raise WaitNotFoundError()
        waits = self.statements.waits
        digest = {"digest": token_hash(token)}
        wait = (await conn.execute(waits.item_by_key, digest)).first()
        # Second looks, each through its own index, only for a miss: an operator's token
        # or a replaced key, an operator's token stored before revision 0021, a deleted
        # item's key.
        if wait is None:
            wait = (await conn.execute(waits.by_token[False], digest)).first()
        if wait is None:
            wait = (await conn.execute(waits.by_token[True], digest)).first()
        if wait is None:
            removed = self.tables.removed_waits
            if (await conn.execute(select(removed.c.token).where(
                    removed.c.token == digest["digest"]))).first() is not None:
                raise AlreadyCompletedError(deleted=True)
            raise WaitNotFoundError()
        _require_waiting(wait, wait.item_version, wait.version)
        return wait, wait

    async def _waiting_item(self, conn: AsyncConnection, partition_id: str,
                            item_id: str) -> tuple[Any, Any]:
        """The current wait of the item, from its row, and its state (one row as both).

        Raises:
            WaitNotFoundError: the partition has no such item.
            AlreadyCompletedError: the item is not waiting (its wait, if it had one, is
                over), or its partition is not open.
        """
        row = (await conn.execute(self.statements.waits.item_by_id,
                                  {"pid": partition_id, "iid": item_id})).first()
        if row is None:
            raise WaitNotFoundError()
        _require_waiting(row, row.item_version, row.version)
        return row, row

    def _completion_write(self, *, new_data: bool, delayed: bool, parking: bool) -> Update:
        """A completion's guarded item write from bound parameters, built once per
        shape (as :meth:`~watcher.store.sql.shared.Statements.item_write` is): the
        version read, still waiting, the partition open; no lease fence."""
        shape = (new_data, delayed, parking)
        found = self._completion_writes.get(shape)
        if found is None:
            source = ResultSource.parameters(self.tables.items.c.data.type,
                                             new_data=new_data, delayed=delayed,
                                             parking=parking)
            found = self._completion_writes[shape] = (
                self.statements.result_write(source, fenced=False)
                .where(*self.statements.waits.still_waiting()))
        return found

    @functools.cached_property
    def _completion_writes(self) -> dict[tuple[bool, bool, bool], Update]:
        return {}

    async def partition_park(self, partition_id: str, version: int, owner: str) -> bool:
        """Let ``owner``'s lease on ``partition_id`` go while every open item at its gate
        waits for a completion: ``owner`` becomes ``''`` and ``until`` the earliest
        deadline of those waits, so no processor takes the partition (nor polls it)
        before that deadline, unless a completion brings ``until`` back to now
        (:meth:`_wake_parked`). One statement, guarded by the lease's ``version``: a
        completion, a client's write or a new lease in between bumps it, and then
        nothing is written. Returns whether the lease was let go.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed (nothing was written).
        """
        p, i = self.tables.partitions, self.tables.items
        at_gate = and_(i.c.partition_id == p.c.id, i.c.gate == p.c.gate)
        deadline = (select(func.min(i.c.retry_at)).where(at_gate, i.c.status == WAITING)
                    .scalar_subquery())
        statement = (
            update(p).where(*self.statements.lease_held(partition_id, owner, version=version),
                            exists().where(at_gate, i.c.status == WAITING),
                            ~exists().where(at_gate, i.c.status == AVAILABLE))
            .values(owner="", until=deadline, version=p.c.version + 1))
        async with self._write() as conn:
            touched = await conn.execute(statement)
        return touched.rowcount == 1

    async def _wake_parked(self, conn: AsyncConnection, partition_id: str,
                           until: Any = None, params: dict[str, Any] | None = None) -> None:
        """In a completion's (or heartbeat's) transaction: bump the partition's version,
        which fences off a park decided before it, and, when its lease was let go
        while its items wait (:meth:`partition_park`), bring its ``until`` to
        ``until`` (default now; never later than it was) so a processor takes it."""
        waits = self.statements.waits
        statement = waits.wake if until is None else waits.wake_to(until)
        await conn.execute(statement, {**(params or {}), "wake_pid": partition_id})

    async def wait_complete(self, token: str, answer: Answer, *,
                            policy: RetryPolicy = DEFAULT_POLICY,
                            max_data_bytes: int | None = None,
                            spawn_limits: SpawnLimits = DEFAULT_SPAWN_LIMITS,
                            traceparent: str | None = None) -> CompletedWait:
        """Apply ``answer`` to the item waiting on ``token`` (its handler's, or an
        operator's), exactly once: the item, what the answer spawns and, when it parks
        the item again, the new wait (with the completer's ``traceparent``), in one
        transaction guarded by the wait's item version, the waiting status and the
        open partition; when the item's gate has a quorum that this completion meets,
        the gate's other open items are skipped in the same transaction. Under a
        quorum, the gate is counted under the partition's lock before the write: once
        ``k`` items passed, the completion writes nothing but the skip, and is refused
        as already completed (the item is skipped). The
        partition's processors are woken.

        Raises:
            WaitNotFoundError: no wait has this token (or it is malformed).
            AlreadyCompletedError: the wait is over (completed, timed out, cancelled,
                retried, or replaced); nothing was written.
            CompletionRefusedError: the answer cannot be applied (the field is named);
                nothing was written and the token stays usable.
            SpawnConflictError: the answer spawns an id the partition holds already.
        """
        async with self._write() as conn:
            wait, row = await self._waiting(conn, token)
            done = await self._complete(conn, wait, row, answer, policy=policy,
                                        max_data_bytes=max_data_bytes,
                                        spawn_limits=spawn_limits, traceparent=traceparent)
        if done is None:  # a racing completion, timeout or cancel won: say what it did
            raise AlreadyCompletedError(await self._item_status(wait.partition_id,
                                                                wait.item_id))
        return done

    async def wait_complete_item(self, partition_id: str, item_id: str, answer: Answer, *,
                                 policy: RetryPolicy = DEFAULT_POLICY,
                                 max_data_bytes: int | None = None,
                                 spawn_limits: SpawnLimits = DEFAULT_SPAWN_LIMITS,
                                 traceparent: str | None = None) -> CompletedWait:
        """Apply ``answer`` to the item ``item_id`` while it waits, without its token
        (the console's operator): the same guarded write as :meth:`wait_complete`, on
        the wait row at the item's current version, so exactly one of the two wins.

        Raises:
            WaitNotFoundError: the partition has no such item.
            AlreadyCompletedError: the item is not waiting (the wait is over, or it never
                waited); nothing was written.
            CompletionRefusedError: the answer cannot be applied (the field is named).
            SpawnConflictError: the answer spawns an id the partition holds already.
        """
        async with self._write() as conn:
            wait, row = await self._waiting_item(conn, partition_id, item_id)
            done = await self._complete(conn, wait, row, answer, policy=policy,
                                        max_data_bytes=max_data_bytes,
                                        spawn_limits=spawn_limits, traceparent=traceparent)
        if done is None:
            raise AlreadyCompletedError(await self._item_status(partition_id, item_id))
        return done

    async def _complete(self, conn: AsyncConnection, wait: Any, row: Any, answer: Answer, *,
                        policy: RetryPolicy, max_data_bytes: int | None,
                        spawn_limits: SpawnLimits,
                        traceparent: str | None) -> CompletedWait | None:
        """The guarded write of a completion, in the caller's transaction; ``None`` when
        the item moved on meanwhile (nothing was written: the caller says what won).

        Raises:
            CompletionRefusedError, SpawnConflictError: as :meth:`wait_complete`.
        """
        k = dict(decode_quorum(row.quorum)).get(row.gate, 0)
        # Counted before the write, under the partition's lock (as every write toward
        # the quorum is): a completion that would pass the gate after k others did
        # skips its item with the rest instead, and is told so.
        full = bool(k) and await self._quorum_count_in(conn, wait.partition_id,
                                                       row.gate, k) >= k
        new_token = new_completion_token()
        item = ReadyItem(wait.item_id, wait.version, row.gate, b"", row.attempts,
                         error_history=row.error_history, wait_key=row.item_wait_key)
        write = completion_write(wait.partition_id, item, answer, row.partition_gate,
                                 policy, new_token=new_token, max_data_bytes=max_data_bytes,
                                 spawn_limits=spawn_limits, traceparent=traceparent)
        if full and settles_at(write, row.gate):
            await self._quorum_in(conn, wait.partition_id, row.gate, k)
            return None
        statement = self._completion_write(new_data=write.data is not None,
                                           delayed=bool(write.retry_delay),
                                           parking=write.wait is not None)
        touched = await conn.execute(statement, self.statements.item_write_params(write, ""))
        if touched.rowcount != 1:
            return None
        if write.spawn:
            await self._spawn_in(conn, [(write.partition_id, write.item_id, write.spawn)])
        await self._replaced_waits_in(conn, [write])
        if k and settles_at(write, row.gate):
            await self._quorum_in(conn, wait.partition_id, row.gate, k)
        await self._wake_parked(conn, wait.partition_id)
        await self._notify(conn, wait.partition_id)
        gate = row.gate if write.gate is None else write.gate
        return CompletedWait(wait.partition_id, wait.item_id, write.status, gate,
                             wait.version + 1, write.attempts, write.last_error,
                             new_token if write.wait is not None else None,
                             parked_by=wait.traceparent)

    async def wait_operator_token(self, partition_id: str, item_id: str) -> str:
        """Mint an operator's completion token for the current wait of the waiting item
        ``item_id`` and store its key in ``waits`` at the item's waiting version, in
        place of the operator token minted before for this wait (which stops working:
        no wait has it). The handler's token stays usable; whichever completes first
        wins, exactly once. Returns the token (only its key is stored; never log it).

        Raises:
            WaitNotFoundError: the partition has no such item.
            AlreadyCompletedError: the item is not waiting (its wait is over), or its
                partition is not open; nothing was written.
        """
        token = new_completion_token()
        w = self.tables.waits
        async with self._write() as conn:
            wait, _ = await self._waiting_item(conn, partition_id, item_id)
            # This wait's other rows are the operator tokens minted for it before.
            await conn.execute(delete(w).where(w.c.partition_id == partition_id,
                                               w.c.item_id == item_id,
                                               w.c.version == wait.version))
            await conn.execute(self.statements.waits.insert, {
                "w_token": token_hash(token), "w_pid": partition_id, "w_iid": item_id,
                "w_version": wait.version, "w_timeout": float(wait.timeout or 0.0),
                "w_policy": wait.on_timeout or "", "w_traceparent": wait.traceparent})
        return token

    async def waits_summary(self, partition_ids: Sequence[str]) -> dict[str, WaitSummary]:
        """The parked items of each partition in ``partition_ids`` that has some: counts
        per gate, the longest wait so far (since the item parked: its last write, by
        the store's clock) and the earliest deadline. One grouped read per 500 ids
        through the ready index's (partition, status) prefix; a partition without
        parked items is left out."""
        i = self.tables.items
        found: dict[str, WaitSummary] = {}
        async with self._read() as conn:
            for chunk in chunks(list(dict.fromkeys(partition_ids)), IN_CHUNK):
                rows = (await conn.execute(
                    select(i.c.partition_id, i.c.gate, func.count(), func.min(i.c.updated_at),
                           func.min(i.c.retry_at), self.statements.now)
                    .where(i.c.partition_id.in_(chunk), i.c.status == WAITING)
                    .group_by(i.c.partition_id, i.c.gate))).all()
                for partition_id, gate, count, since, deadline, now in rows:
                    age = 0.0 if since is None else max(0.0, (now - since).total_seconds())
                    known = found.get(partition_id)
                    if known is None:
                        found[partition_id] = WaitSummary({gate: count}, age, deadline)
                        continue
                    known.by_gate[gate] = count
                    earliest = min(filter(None, (known.next_deadline, deadline)), default=None)
                    found[partition_id] = WaitSummary(known.by_gate,
                                                      max(known.oldest_seconds, age), earliest)
        return found

    async def _item_status(self, partition_id: str, item_id: str) -> str | None:
        """The item's status now, read in a fresh transaction (``None``: it is gone)."""
        i = self.tables.items
        async with self._read() as conn:
            return (await conn.execute(select(i.c.status).where(
                i.c.partition_id == partition_id, i.c.id == item_id))).scalar_one_or_none()

    async def wait_heartbeat(self, token: str, seconds: float) -> datetime:
        """Move the deadline of the wait ``token`` names to ``seconds`` from now
        (the store's clock); returns the new deadline. The token stays usable.

        Raises:
            WaitNotFoundError: no wait has this token (or it is malformed).
            AlreadyCompletedError: the wait is over; nothing was written.
            CompletionRefusedError: ``seconds`` is not a usable wait timeout.
        """
        problem = timeout_problem(seconds, "'timeout'")
        if problem is not None:
            raise CompletionRefusedError("timeout", problem)
        i = self.tables.items
        deadline = self.statements.now_plus(bindparam("timeout", type_=Float()))
        async with self._write() as conn:
            wait, _ = await self._waiting(conn, token)
            touched = await conn.execute(
                update(i).where(i.c.partition_id == wait.partition_id, i.c.id == wait.item_id,
                                i.c.version == wait.version, *self.statements.waits.still_waiting())
                .values(retry_at=deadline, wait_timeout=float(seconds)),
                {"timeout": float(seconds)})
            if touched.rowcount != 1:
                raise AlreadyCompletedError(None)
            await self._wake_parked(conn, wait.partition_id, deadline,
                                    {"timeout": float(seconds)})
            return (await conn.execute(select(i.c.retry_at).where(
                i.c.partition_id == wait.partition_id, i.c.id == wait.item_id))).scalar_one()


def _require_waiting(row: Any, item_version: int | None, wait_version: int) -> None:
    """Check that the wait of ``row`` (its item's ``status`` at ``item_version`` and its
    partition's ``partition_status``) is still on: the item waits at the wait's
    version in an open partition.

    Raises:
        AlreadyCompletedError: the wait is over (the item moved on, or is gone), or
            its partition is not open.
    """
    if (row.status != WAITING or item_version != wait_version
            or row.partition_status != AVAILABLE):
        raise AlreadyCompletedError(None if row.status is None else str(row.status))
