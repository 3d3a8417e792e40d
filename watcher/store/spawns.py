"""Spawned items: inserted in the transaction that writes the answers that spawned them;
and beside them, what else an answer's transaction writes: the waits of answers that
park their items, and the skipped items of a gate whose quorum an answer met.

A batch of answers (a writer's batch of item results, or one reduce step) spawns
in a few statements, whatever the number of answers: one read of the ids the
partitions hold already, the inserts in chunks, and one count per partition.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from sqlalchemy import and_, func, literal, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from watcher.models import AVAILABLE, COMPLETE, SKIPPED, WAITING
from watcher.records import ItemWrite, NewItem
from watcher.rules.completions import quorum_keep, settles_at
from watcher.rules.spawn import SpawnConflictError
from watcher.store.base import StoreBase
from watcher.store.codecs import colliding_ids
from watcher.waits import REPLACED_VERSION, token_hash

Spawn = tuple[str, str | None, Sequence[NewItem]]
"""What one answer spawned: its partition id, the spawning item's id (``None``: a
reduce), and the new items, gates resolved."""


class SpawnsStore(StoreBase):
    """Inserting what answers spawned, the waits of answers that park their items,
    and the skips of a quorum met, inside the transaction that writes the answers."""

    async def quorum_settle(self, partition_id: str, gate: int, k: int) -> int:
        """Count the items of ``partition_id`` complete at or past ``gate`` (up to
        ``k``); when ``k`` are, settle the gate's other open items (available, in
        flight or waiting) as ``skipped``, in the same transaction. Returns the count.
        Settling twice changes nothing: skipped items are never open again.

        Raises the database's error when the read or the write fails.
        """
        async with self._write() as conn:
            return await self._quorum_in(conn, partition_id, gate, k)

    async def _quorums_in(self, conn: AsyncConnection,
                          quorums: set[tuple[str, int, int]]) -> None:
        """:meth:`quorum_settle` for each (partition, gate, k) of ``quorums``, in
        ``conn``'s transaction."""
        for partition_id, gate, k in sorted(quorums):
            await self._quorum_in(conn, partition_id, gate, k)

    async def _quorum_in(self, conn: AsyncConnection, partition_id: str, gate: int,
                         k: int) -> int:
        """:meth:`quorum_settle` in ``conn``'s transaction: the count
        (:meth:`_quorum_count_in`, under the partition's lock), and the skip only once
        the quorum is met."""
        complete = await self._quorum_count_in(conn, partition_id, gate, k)
        if complete >= k:
            i = self.tables.items
            await conn.execute(
                update(i).where(i.c.partition_id == partition_id, i.c.gate == gate,
                                i.c.status.in_((AVAILABLE, WAITING)))
                .values(status=SKIPPED, version=i.c.version + 1,
                        updated_at=self.statements.now))
        return complete

    async def _quorum_count_in(self, conn: AsyncConnection, partition_id: str, gate: int,
                               k: int) -> int:
        """How many items of ``partition_id`` are complete at or past ``gate`` (up to
        ``k``), in ``conn``'s transaction, after locking the partition's row
        (:attr:`~watcher.store.sql.waits.WaitStatements.partition_lock`): every write
        that counts toward a quorum (a batch of answers, a completion by token, a
        processor's look at its gate) takes that lock before it counts, so they count
        one after another, each seeing the others' items, and no more than ``k`` pass.
        The count reads at most ``k`` index entries past the items created at later
        gates.

        An open item at a later gate counts only once an answer has moved it (its
        version above the 1 it was inserted with): one still at version 1 was created
        there (by ``add_items`` or a spawn) and never passed this gate."""
        await conn.execute(self.statements.waits.partition_lock, {"lock_pid": partition_id})
        i = self.tables.items
        past = (select(literal(1)).where(
            i.c.partition_id == partition_id,
            or_(and_(i.c.status == COMPLETE, i.c.gate >= gate),
                and_(i.c.status.in_((AVAILABLE, WAITING)), i.c.gate > gate,
                     i.c.version > 1)))
            .limit(k).subquery())
        return int((await conn.execute(select(func.count()).select_from(past))).scalar_one())

    async def _quorum_keep_in(self, conn: AsyncConnection, writes: Sequence[ItemWrite]
                              ) -> list[bool]:
        """Which of ``writes`` to write (:func:`~watcher.rules.completions.quorum_keep`),
        counted in ``conn``'s transaction under each quorum partition's lock, taken in
        the order of partition ids (:meth:`_quorum_count_in`)."""
        gates = sorted({(write.partition_id, *write.quorum) for write in writes
                        if write.quorum is not None and settles_at(write, write.quorum[0])})
        room = {(partition_id, gate): k - await self._quorum_count_in(conn, partition_id,
                                                                      gate, k)
                for partition_id, gate, k in gates}
        return quorum_keep(writes, room)

    async def waits_never_begun(self, partition_id: str,
                                tokens: Sequence[tuple[str, str]]) -> None:
        """Keep the keys of ``tokens`` ((item id, token) of ``partition_id``'s calls that
        were given up, as a quorum's skip gives up the calls in flight) in ``waits``:
        no answer of those calls will ever be written, so the wait that each token was
        made for never begins, and a completion with it is told the wait is over (the
        item's status) rather than "not found" for ever.

        Raises the database's error when the read or the insert fails.
        """
        await self._keep_over_keys([
            {"w_token": token_hash(token), "w_pid": partition_id, "w_iid": item_id,
             "w_version": REPLACED_VERSION, "w_timeout": 0.0, "w_policy": "",
             "w_traceparent": None} for item_id, token in tokens])

    async def _fenced_waits(self, writes: Sequence[ItemWrite], applied: Sequence[bool]
                            ) -> None:
        """Keep in ``waits`` the key of each parking write of ``writes`` that was not
        applied (:meth:`~watcher.store.sql.waits.WaitStatements.fenced_params`): the
        token its call carried then answers "already completed", with the item's status,
        and not "not found" for ever. Rare (a write fenced off by a quorum's skip, a
        cancel, a lost lease), so one short transaction of its own; a key stored
        already (the same write fenced twice) is not stored again.

        Raises the database's error when the read or the insert fails.
        """
        if all(applied):  # the hot path's usual case: one C-level pass, nothing built
            return
        await self._keep_over_keys(self.statements.waits.fenced_params(writes, applied))

    async def _keep_over_keys(self, rows: list[dict[str, Any]]) -> None:
        """Insert ``rows`` (:attr:`~watcher.store.sql.waits.WaitStatements.insert`'s
        parameters) whose keys ``waits`` does not hold yet, in one short transaction.

        Raises the database's error when the read or the insert fails.
        """
        if not rows:
            return
        w = self.tables.waits
        async with self._write() as conn:
            stored = set((await conn.execute(select(w.c.token).where(
                w.c.token.in_([row["w_token"] for row in rows])))).scalars())
            rows = [row for row in rows if row["w_token"] not in stored]
            if rows:
                await conn.execute(self.statements.waits.insert, rows)

    async def _replaced_waits_in(self, conn: AsyncConnection,
                                 writes: Sequence[ItemWrite]) -> None:
        """Keep in ``waits`` the key each parking write of ``writes`` (applied ones)
        replaces, in ``conn``'s transaction: one insert for the batch
        (:attr:`~watcher.store.sql.waits.WaitStatements.insert`), its time the
        clock's; nothing when none replaces a wait.

        Raises:
            sqlalchemy.exc.IntegrityError: a key is stored already (never, for 256
                random bits).
        """
        rows = self.statements.waits.replaced_params(writes)
        if rows:
            await conn.execute(self.statements.waits.insert, rows)

    async def _spawn_at_once(self, writes: Sequence[ItemWrite], owner: str
                             ) -> list[bool] | None:
        """Write ``writes`` (a batch that spawns, without a quorum), insert what the applied
        ones spawn and count it, in one statement where the driver can
        (:meth:`~watcher.store.drivers.base.Driver.items_apply_spawning`); returns, per
        write, whether it was applied. ``None``, nothing written, when it cannot, and
        when the statement finds an id stored already or two answers of the batch spawn
        the same id: the transaction that reads the stored ids first then names the
        answer at fault (:meth:`_spawn_in`), or writes the batch if the clash is gone.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed or refused a write.
        """
        if not self.driver.chains_writes:  # no statement feeds another: nothing to try
            return None
        spawns = [(write.partition_id, write.item_id, write.spawn) for write in writes
                  if write.spawn]
        try:
            _refuse_repeats(spawns)
        except SpawnConflictError:
            return None  # unless one of the two is fenced off: the transaction tells
        rows = [(place, (write.partition_id, child, write.item_id))
                for place, write in enumerate(writes, 1) for child in write.spawn]
        try:
            return await self.round_trips.call(
                "items_apply", self.driver.items_apply_spawning(writes, owner, rows))
        except IntegrityError:
            return None

    async def _spawn_in(self, conn: AsyncConnection, spawns: Sequence[Spawn], *,
                        reduce_gate: int | None = None) -> None:
        """Insert every new item of ``spawns`` and count them on their partitions (whose
        versions are left alone: they are the leases' guard), in ``conn``'s transaction.
        ``reduce_gate`` is the gate of the reduce whose answer spawned them (``None``:
        items' answers did); a rewind to that gate or before removes them.

        Raises:
            SpawnConflictError: an id is stored already, spawned twice in the batch, or
                two compare as equal on this database; it names the first answer at
                fault (the caller's transaction is to be rolled back).
        """
        spawns = [spawn for spawn in spawns if spawn[2]]
        if not spawns:
            return
        _refuse_repeats(spawns)
        by_partition: dict[str, list[str]] = defaultdict(list)
        for partition_id, _, children in spawns:
            by_partition[partition_id] += [child.id for child in children]
        for partition_id, ids in by_partition.items():
            stored = set(await self._stored_ids(conn, partition_id, ids))
            if stored:
                _refuse_stored(spawns, partition_id, stored)
        try:
            await self._rows_insert(conn, [(partition_id, child, parent)
                                           for partition_id, parent, children in spawns
                                           for child in children],
                                    spawned_by_reduce=reduce_gate)
        except IntegrityError:
            # Two ids the database compares as equal (MariaDB and MySQL ignore trailing
            # spaces, SQL Server too), or a client added one meanwhile.
            partition_id, parent, children = spawns[0]
            raise SpawnConflictError(partition_id, parent, colliding_ids(
                [child for spawn in spawns for child in spawn[2]])) from None
        p = self.tables.partitions
        counts = Counter({partition_id: 0 for partition_id in by_partition})
        for partition_id, _, children in spawns:
            counts[partition_id] += len(children)
        for partition_id, count in counts.items():
            await conn.execute(update(p).where(p.c.id == partition_id)
                               .values(spawned=p.c.spawned + count))


def _refuse_repeats(spawns: Sequence[Spawn]) -> None:
    """Raises SpawnConflictError for the first answer that spawns an id an earlier answer
    of the batch spawned into the same partition (each answer's own ids are distinct)."""
    seen: set[tuple[str, str]] = set()
    for partition_id, parent, children in spawns:
        keys = {(partition_id, child.id) for child in children}
        repeated = sorted(item_id for _, item_id in keys & seen)
        if repeated:
            raise SpawnConflictError(partition_id, parent, repeated)
        seen |= keys


def _refuse_stored(spawns: Sequence[Spawn], partition_id: str, stored: set[str]) -> None:
    """Raises SpawnConflictError naming the first answer into ``partition_id`` that
    spawns one of the ``stored`` ids."""
    for spawn_partition, parent, children in spawns:
        if spawn_partition == partition_id:
            clashing = sorted(child.id for child in children if child.id in stored)
            if clashing:
                raise SpawnConflictError(partition_id, parent, clashing)
