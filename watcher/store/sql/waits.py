"""The statements of waits, built once per store: a parking write's ``waits`` rows, the
read of a wait by its token's hash, a completion's guarded item write, and the wake-up
of a partition whose lease was let go while its items wait."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Float, Integer, and_, bindparam, case, exists, insert, select, update
from sqlalchemy.sql.expression import ColumnElement, Insert, Select, Update

from watcher.models import AVAILABLE, WAITING
from watcher.records import ItemWrite
from watcher.store.sql.schema import Tables


class WaitStatements:
    """The waits' statements of one set of ``tables``, whose clock's time is ``now``
    (:attr:`watcher.store.sql.shared.Statements.now`)."""

    def __init__(self, tables: Tables, now: ColumnElement[Any]) -> None:
        self.tables = tables
        self.now = now

    @functools.cached_property
    def insert(self) -> Insert:
        """The ``waits`` row of a parking write that was applied, from bound parameters
        (:meth:`params`), sent with the rows of a whole batch at once; the row's
        ``created_at`` is the clock's time, read by the statement itself."""
        w = self.tables.waits
        return insert(w).values(
            token=bindparam("w_token", type_=w.c.token.type),
            partition_id=bindparam("w_pid", type_=w.c.partition_id.type),
            item_id=bindparam("w_iid", type_=w.c.item_id.type),
            version=bindparam("w_version", type_=Integer()),
            timeout=bindparam("w_timeout", type_=Float()),
            on_timeout=bindparam("w_policy", type_=w.c.on_timeout.type),
            traceparent=bindparam("w_traceparent", type_=w.c.traceparent.type),
            created_at=self.now)

    @staticmethod
    def params(writes: Sequence[ItemWrite], applied: Sequence[bool] | None = None
               ) -> list[dict[str, Any]]:
        """The parameters of :attr:`insert` for each parking write of ``writes`` that
        was applied (per write, in ``applied``; every one when it is ``None``): the
        item's version while it waits is the one read plus one."""
        return [{"w_token": write.wait.token_hash, "w_pid": write.partition_id,
                 "w_iid": write.item_id, "w_version": write.seen_version + 1,
                 "w_timeout": write.wait.timeout, "w_policy": write.wait.on_timeout,
                 "w_traceparent": write.wait.traceparent}
                for k, write in enumerate(writes)
                if write.wait is not None and (applied is None or applied[k])]

    @functools.cached_property
    def by_token(self) -> dict[bool, Select[Any]]:
        """The ``waits`` row whose token hash (``True``: whose operator token's hash) is
        ``:digest``, with its item's state (``status``, ``item_version``, ``gate``,
        ``attempts``, ``error_history``; NULL when the item is gone) and its
        partition's (``partition_status``, ``partition_gate``, ``quorum``): one read,
        each found by its key."""
        i, p, w = self.tables.items, self.tables.partitions, self.tables.waits
        read = (
            select(*w.c, i.c.status, i.c.version.label("item_version"), i.c.gate,
                   i.c.attempts, i.c.error_history, p.c.status.label("partition_status"),
                   p.c.gate.label("partition_gate"), p.c.quorum)
            .select_from(w.outerjoin(i, and_(i.c.partition_id == w.c.partition_id,
                                             i.c.id == w.c.item_id))
                         .outerjoin(p, p.c.id == w.c.partition_id)))
        digest = bindparam("digest", type_=w.c.token.type)
        return {False: read.where(w.c.token == digest),
                True: read.where(w.c.operator_token == digest)}

    def still_waiting(self) -> tuple[Any, ...]:
        """The extra guard of a completion's write: still waiting, partition open."""
        i, p = self.tables.items, self.tables.partitions
        return (i.c.status == WAITING,
                exists().where(p.c.id == i.c.partition_id, p.c.status == AVAILABLE))

    def wake_to(self, until: Any) -> Update:
        """The wake-up of the partition ``:wake_pid``: its version bumped (which fences
        off a park decided before it), and its ``until`` brought to ``until`` (an SQL
        expression) when its lease was let go while its items wait and that is later."""
        p = self.tables.partitions
        return update(p).where(p.c.id == bindparam("wake_pid", type_=p.c.id.type)).values(
            version=p.c.version + 1,
            until=case((and_(p.c.owner == "", p.c.until > until), until), else_=p.c.until))

    @functools.cached_property
    def wake(self) -> Update:
        """:meth:`wake_to` now (the clock's), built once."""
        return self.wake_to(self.now)
