"""The SQL every database shares, built once per store: the hot reads, the guarded
item write, the lease fence and the batched lease rewrite. A database's driver
(:mod:`watcher.drivers`) builds on these and never changes them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Float,
    Integer,
    and_,
    bindparam,
    exists,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.sql.expression import ColumnElement, Exists, Select, Update

from watcher.clock import Clock
from watcher.drivers.sql import clock_now, time_plus
from watcher.models import AVAILABLE, FAILED
from watcher.records import (
    ItemWrite,
)
from watcher.schema import Tables


class Statements:
    """The SQL every database shares, for one table namespace and one clock.

    Built once per store and handed to its driver, which builds on it what
    its database does its own way. Every time in these statements is
    :attr:`now`, ``COALESCE(:clock_now, <database now>)``: the clock fills the
    parameter in as each statement runs, so the statements are the same under
    the database clock and a test's fixed clock.
    """

    def __init__(self, tables: Tables, clock: Clock) -> None:
        self.tables = tables
        self.clock = clock
        self.now: ColumnElement[Any] = clock_now(clock)
        self._item_writes: dict[tuple[bool, bool], Update] = {}
        self._lease_rewrites: dict[tuple[int, bool], Update] = {}

    def now_plus(self, seconds: float | ColumnElement[Any]) -> ColumnElement[Any]:
        """The clock's time plus ``seconds`` (a number, or an SQL expression)."""
        return time_plus(self.now, seconds)

    def items_ready(self, limit: int | ColumnElement[Any]) -> Select[Any]:
        """Available items at a gate whose retry time has passed, ``(id, version, gate,
        data, attempts)``, with bind parameters ``pid`` and ``gate``.

        Ordered by (retry time, id), which the index on (partition, status,
        gate, retry_at, id) returns in order: the read stops at ``limit`` rows
        and never touches completed items. ``limit`` is a number or a bind
        parameter, as the driver chooses.
        """
        i = self.tables.items
        return (
            select(i.c.id, i.c.version, i.c.gate, i.c.data, i.c.attempts)
            .where(i.c.partition_id == bindparam("pid", type_=i.c.partition_id.type),
                   i.c.status == AVAILABLE, i.c.gate == bindparam("gate", type_=Integer()),
                   i.c.retry_at <= self.now)
            .order_by(i.c.retry_at, i.c.id).limit(limit)
        )

    def lease_held(self, partition_id: str | ColumnElement[Any],
                   owner: str | ColumnElement[Any], *, version: int | None = None,
                   live: bool = True) -> tuple[ColumnElement[bool], ...]:
        """The partition guard, for a ``WHERE`` on ``partitions``: ``owner`` holds the
        open partition ``partition_id`` (at ``version``, when given) and, when ``live``,
        its lease's until is still ahead by the store's clock. Every lease-held write
        says it with this."""
        p = self.tables.partitions
        guard = [p.c.id == partition_id]
        if version is not None:
            guard.append(p.c.version == version)
        guard += [p.c.owner == owner, p.c.status == AVAILABLE]
        if live:
            guard.append(p.c.until > self.now)
        return tuple(guard)

    def lease_fence(self, partition_id: ColumnElement[Any], owner: ColumnElement[Any]
                    ) -> Exists:
        """True while ``owner`` holds a live lease on the partition ``partition_id``."""
        return exists().where(*self.lease_held(partition_id, owner))

    def item_guard(self, partition_id: ColumnElement[Any], item_id: ColumnElement[Any],
                   seen: ColumnElement[Any], owner: ColumnElement[Any]
                   ) -> tuple[ColumnElement[Any], ...]:
        """The WHERE of a result write: the item's key, the version read, and the lease fence.

        It names the primary key and the version, and on purpose not the
        status: with ``status = 'available'`` in it, a planner without
        statistics (a freshly filled table) may pick the ready-items index,
        whose (partition_id, status) prefix matches as many columns as the
        key, and then visit every available item of the partition per write.
        The version implies the status (every item write bumps it).
        """
        i = self.tables.items
        return (i.c.partition_id == partition_id, i.c.id == item_id, i.c.version == seen,
                self.lease_fence(partition_id, owner))

    def item_write(self, *, new_data: bool, delayed: bool) -> Update:
        """One guarded, fenced result write (built once per shape); its parameters
        come from :meth:`item_write_params`."""
        key = (new_data, delayed)
        found = self._item_writes.get(key)
        if found is None:
            i = self.tables.items
            guard = self.item_guard(bindparam("pid"), bindparam("iid"), bindparam("seen"),
                                    bindparam("owner"))
            values: dict[str, Any] = {
                "version": i.c.version + 1, "status": bindparam("new_status"),
                "gate": func.coalesce(bindparam("new_gate", type_=Integer()), i.c.gate),
                "attempts": bindparam("new_attempts"),
                "last_error": bindparam("new_error"), "updated_at": self.now,
                "retry_at": (self.now_plus(bindparam("delay", type_=Float())) if delayed
                             else self.now),
            }
            if new_data:
                values["data"] = bindparam("new_data")
            found = self._item_writes[key] = update(i).where(*guard).values(**values)
        return found

    @staticmethod
    def item_write_params(write: ItemWrite, owner: str) -> dict[str, Any]:
        """The parameters of :meth:`item_write` for ``write`` by ``owner``."""
        params: dict[str, Any] = {
            "pid": write.partition_id, "iid": write.item_id, "seen": write.seen_version,
            "owner": owner, "new_status": write.status, "new_gate": write.gate,
            "new_attempts": write.attempts, "new_error": write.last_error,
        }
        if write.data is not None:
            params["new_data"] = write.data
        if write.retry_delay:
            params["delay"] = write.retry_delay
        return params

    def lease_rewrite(self, rows: int, *, release: bool) -> Update:
        """One guarded renewal (or, with ``release``, release) of ``rows`` leases
        (built once per shape); its parameters come from :meth:`lease_rewrite_params`.

        Each row's guard is its id (``pid<n>``) and the version read
        (``seen<n>``); every row must be ``holder``'s and ``available``. A renewal's
        ``until`` is the clock's time plus ``duration``; a release's, the time itself.
        """
        key = (rows, release)
        found = self._lease_rewrites.get(key)
        if found is None:
            p = self.tables.partitions
            values: dict[str, Any] = {"version": p.c.version + 1, "updated_at": self.now}
            if release:
                values.update(owner="", until=self.now)
            else:
                values["until"] = self.now_plus(bindparam("duration", type_=Float()))
            guards = [and_(p.c.id == bindparam(f"pid{n}"), p.c.version == bindparam(f"seen{n}"))
                      for n in range(rows)]
            found = self._lease_rewrites[key] = (
                update(p).where(or_(*guards), p.c.owner == bindparam("holder"),
                                p.c.status == AVAILABLE)
                .values(**values))
        return found

    @staticmethod
    def lease_rewrite_shape(leases: int) -> int:
        """The rows of the :meth:`lease_rewrite` that carries ``leases`` leases: the
        next power of two, so a few statement shapes serve every count."""
        return 1 << max(leases - 1, 0).bit_length()

    @staticmethod
    def lease_rewrite_params(leases: Sequence[tuple[str, int]], rows: int, owner: str,
                             duration: float | None) -> dict[str, Any]:
        """The parameters of a :meth:`lease_rewrite` of ``rows`` rows for ``leases``
        (partition id, version read), the last repeated to fill the rows."""
        params: dict[str, Any] = {"holder": owner}
        if duration is not None:
            params["duration"] = duration
        for n in range(rows):
            pid, seen = leases[min(n, len(leases) - 1)]
            params[f"pid{n}"] = pid
            params[f"seen{n}"] = seen
        return params

    @functools.cached_property
    def gate_summary(self) -> Select[Any]:
        """Pending count, earliest retry, failed count and next gate of a gate, and
        the clock's time; bind parameters ``pid`` and ``gate``."""
        i = self.tables.items
        partition = i.c.partition_id == bindparam("pid", type_=i.c.partition_id.type)
        here = and_(partition, i.c.gate == bindparam("gate", type_=Integer()))
        available = i.c.status == AVAILABLE
        return select(
            select(func.count()).where(here, available).scalar_subquery(),
            select(func.min(i.c.retry_at)).where(here, available).scalar_subquery(),
            select(func.count()).where(here, i.c.status == FAILED).scalar_subquery(),
            select(func.min(i.c.gate)).where(
                partition, available, i.c.gate > bindparam("gate", type_=Integer())
            ).scalar_subquery(),
            self.now,
        )
