"""The statements of waits, built once per store: the ``waits`` rows of the keys a new
wait replaces, the read of a wait by its token's key (in an item's row, else in
``waits``), a completion's guarded item write, and the wake-up of a partition whose
lease was let go while its items wait.

An item's current wait lives in its own row (``items.wait_key`` and the columns
beside it, revision 0021), written by the parking answer's own ``UPDATE``. The
``waits`` table holds the other keys: an operator's token of a current wait (a row at
the item's version while it waits), and the key of a wait that a new one replaced
(version 0: never current), or the key of a parking answer that was fenced off (its
wait never began), so that a late completion is told the wait is over."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Float,
    Integer,
    and_,
    bindparam,
    case,
    exists,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.sql.expression import ColumnElement, Insert, Select, Update

from watcher.models import AVAILABLE, WAITING
from watcher.records import ItemWrite
from watcher.store.sql.schema import Tables
from watcher.waits import REPLACED_VERSION


def wait_params(write: ItemWrite) -> dict[str, Any]:
    """The wait parameters of a parking write's item ``UPDATE`` (``w_key``,
    ``w_timeout``, ``w_policy``, ``w_traceparent``; all NULL when ``write`` does not
    park, as a batch's other rows have them)."""
    wait = write.wait
    if wait is None:
        return {"w_key": None, "w_timeout": None, "w_policy": None, "w_traceparent": None}
    return {"w_key": wait.token_hash, "w_timeout": wait.timeout, "w_policy": wait.on_timeout,
            "w_traceparent": wait.traceparent}


class WaitStatements:
    """The waits' statements of one set of ``tables``, whose clock's time is ``now``
    (:attr:`watcher.store.sql.shared.Statements.now`)."""

    def __init__(self, tables: Tables, now: ColumnElement[Any]) -> None:
        self.tables = tables
        self.now = now

    @functools.cached_property
    def insert(self) -> Insert:
        """A ``waits`` row from bound parameters (:meth:`replaced_params`), sent with
        the rows of a whole batch at once; the row's ``created_at`` is the clock's
        time, read by the statement itself."""
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
    def replaced_params(writes: Sequence[ItemWrite], applied: Sequence[bool] | None = None
                        ) -> list[dict[str, Any]]:
        """The parameters of :attr:`insert` for the key each parking write of ``writes``
        replaces (the item's last wait's, when it had one), for the writes that were
        applied (per write, in ``applied``; every one when it is ``None``): rows at
        :data:`REPLACED_VERSION`, so the replaced token is told its wait is over."""
        return [{"w_token": write.wait.replaces, "w_pid": write.partition_id,
                 "w_iid": write.item_id, "w_version": REPLACED_VERSION, "w_timeout": 0.0,
                 "w_policy": "", "w_traceparent": None}
                for k, write in enumerate(writes)
                if write.wait is not None and write.wait.replaces is not None
                and (applied is None or applied[k])]

    @staticmethod
    def fenced_params(writes: Sequence[ItemWrite], applied: Sequence[bool]
                      ) -> list[dict[str, Any]]:
        """The parameters of :attr:`insert` for the key of each parking write of
        ``writes`` that was not applied (per write, in ``applied``): its wait never
        began, and never will, so the token its call carried is kept at
        :data:`REPLACED_VERSION` and told the wait is over (the item's status now)
        instead of "not found" for ever."""
        return [{"w_token": write.wait.token_hash, "w_pid": write.partition_id,
                 "w_iid": write.item_id, "w_version": REPLACED_VERSION, "w_timeout": 0.0,
                 "w_policy": "", "w_traceparent": None}
                for write, ok in zip(writes, applied, strict=True)
                if write.wait is not None and not ok]

    @functools.cached_property
    def partition_lock(self) -> Select[Any]:
        """Lock the row of partition ``:lock_pid`` until the transaction ends (``FOR
        UPDATE``; ``UPDLOCK`` on SQL Server; SQLite's write transaction holds the whole
        database already): the writes that count toward a gate's quorum take it first,
        so that they count one after another and exactly ``k`` items pass."""
        p = self.tables.partitions
        return (select(p.c.id).where(p.c.id == bindparam("lock_pid"))
                .with_for_update()
                .with_hint(p, "WITH (UPDLOCK, ROWLOCK)", "mssql"))

    @functools.cached_property
    def _item_waits(self) -> Select[Any]:
        """Items as waits, with their state and their partition's (see
        :attr:`item_by_key`)."""
        i, p = self.tables.items, self.tables.partitions
        return (
            select(i.c.wait_key.label("token"), i.c.partition_id, i.c.id.label("item_id"),
                   i.c.version, i.c.wait_timeout.label("timeout"),
                   i.c.wait_policy.label("on_timeout"),
                   i.c.wait_traceparent.label("traceparent"), i.c.status,
                   i.c.version.label("item_version"), i.c.wait_key.label("item_wait_key"),
                   i.c.gate, i.c.attempts, i.c.error_history,
                   p.c.status.label("partition_status"), p.c.gate.label("partition_gate"),
                   p.c.quorum)
            .select_from(i.outerjoin(p, p.c.id == i.c.partition_id)))

    @functools.cached_property
    def item_by_key(self) -> Select[Any]:
        """The item whose last wait's key is ``:digest`` (through ``ix_items_wait``),
        as a wait: ``token``, ``partition_id``, ``item_id``, ``version`` (the item's,
        so a waiting item's wait is current), ``timeout``, ``on_timeout``,
        ``traceparent``, then the item's state (``status``, ``item_version``,
        ``item_wait_key``, ``gate``, ``attempts``, ``error_history``) and its
        partition's (``partition_status``, ``partition_gate``, ``quorum``): one read,
        each found by its key."""
        i = self.tables.items
        return self._item_waits.where(
            i.c.wait_key == bindparam("digest", type_=i.c.wait_key.type))

    @functools.cached_property
    def item_by_id(self) -> Select[Any]:
        """The item ``:iid`` of partition ``:pid`` as a wait, named as
        :attr:`item_by_key` names it."""
        i = self.tables.items
        return self._item_waits.where(
            i.c.partition_id == bindparam("pid", type_=i.c.partition_id.type),
            i.c.id == bindparam("iid", type_=i.c.id.type))

    @functools.cached_property
    def by_token(self) -> dict[bool, Select[Any]]:
        """The ``waits`` row whose token key (``True``: whose operator token's key, a
        column only rows written before revision 0021 fill) is ``:digest``, with its
        item's state and its partition's, named as :meth:`item_by_key` names them
        (the item's NULL when it is gone): one read, each found by its key."""
        i, p, w = self.tables.items, self.tables.partitions, self.tables.waits
        read = (
            select(w.c.token, w.c.partition_id, w.c.item_id, w.c.version, w.c.timeout,
                   w.c.on_timeout,
                   func.coalesce(w.c.traceparent, i.c.wait_traceparent).label("traceparent"),
                   i.c.status,
                   i.c.version.label("item_version"), i.c.wait_key.label("item_wait_key"),
                   i.c.gate,
                   i.c.attempts, i.c.error_history, p.c.status.label("partition_status"),
                   p.c.gate.label("partition_gate"), p.c.quorum)
            .select_from(w.outerjoin(i, and_(i.c.partition_id == w.c.partition_id,
                                             i.c.id == w.c.item_id))
                         .outerjoin(p, p.c.id == w.c.partition_id)))
        digest = bindparam("digest", type_=w.c.token.type)
        return {False: read.where(w.c.token == digest),
                True: read.where(w.c.operator_token == digest)}

    def item_keys_removed(self, *where: ColumnElement[bool]) -> Insert:
        """The last waits' keys of the items matching ``where`` (about to be deleted),
        kept in ``removed_waits`` with the clock's time, so a late completion is told
        the wait is over (409), not that it is unknown."""
        i = self.tables.items
        return insert(self.tables.removed_waits).from_select(
            ["token", "removed_at"],
            select(i.c.wait_key, self.now).where(*where, i.c.wait_key.is_not(None)))

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
