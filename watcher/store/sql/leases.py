"""The statements of a lease cycle, built once per shape, so a driver's direct path (its
own connections, :mod:`watcher.store.drivers`) can send them as it sends the hot statements:
the free partitions, an owner's partitions, the partitions clients stopped, the lease
counts every owner's fair share comes from, and (where the database can) the take.

Each is one statement with bind parameters; a limit stays a literal (SQL Server
renders it as ``TOP n``), so there is one statement per limit asked for, and a
watcher asks for few: its candidate count and its steal batch.
"""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any

from sqlalchemy import (
    Float,
    and_,
    bindparam,
    false,
    func,
    literal,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.sql.expression import (
    BindParameter,
    ColumnElement,
    CompoundSelect,
    Select,
    Update,
)

from watcher.models import AVAILABLE, CANCELLED, DELETING
from watcher.pipelines import ServedRoute
from watcher.store.drivers.sql import lock_unless_busy, not_for_index
from watcher.store.sql.shared import Statements

# A lease cycle counts free partitions up to this many: the count gives each owner's
# fair share while few are free; past it, every processor takes what its slots can
# start (:func:`watcher.rules.balance.plan_balance`), and the count reads no further.
FREE_COUNT_CAP = 1_000

# Seconds within which two places in the lease queue may be one clock tick: a new
# partition is placed after any open one there (:attr:`LeaseStatements.queue_place`).
TIE_WINDOW = 0.001
# How far after such a partition a new one is placed.
TIE_STEP = timedelta(microseconds=1)

# The routes a lease read is limited to (watcher.pipelines); None: every partition.
Served = tuple[ServedRoute, ...] | None

# The columns a lease read returns, in order (:func:`watcher.store.codecs.to_lease_row`),
# then the clock's time; ``timeline`` from the partition's timeline row.
LEASE_COLUMNS = ("id", "version", "gate", "owner", "reduce_gates", "on_item_failure",
                 "trace_context", "priority", "flow_key", "rank_at", "timeline", "quorum",
                 "notify", "pipeline", "pipeline_version")


class LeaseStatements:
    """The lease cycle's statements for one store (its tables and clock)."""

    def __init__(self, statements: Statements) -> None:
        self.statements = statements
        self._free: dict[tuple[int, Served], Select[Any]] = {}
        self._of_owner: dict[tuple[int, Served], Select[Any]] = {}
        self._takes: dict[int, Update] = {}
        self._rewrites: dict[tuple[int, bool], Update] = {}
        self._counts: dict[int, CompoundSelect] = {}

    def _columns(self) -> Select[Any]:
        # The clock's time last: the store keeps it (a time to record a close with).
        # The timeline from its own row (revision 0013), one key lookup per row read.
        tables = self.statements.tables
        p, t = tables.partitions, tables.timelines
        return (select(*(t.c.timeline if name == "timeline" else p.c[name]
                         for name in LEASE_COLUMNS), self.statements.now)
                .select_from(p.outerjoin(t, t.c.partition_id == p.c.id)))

    def served(self, routes: Served) -> ColumnElement[bool]:
        """The partitions at a place ``routes`` serve (:mod:`watcher.pipelines`), as
        a condition with its values bound (one statement per set of routes, built once:
        no IN lists, which the direct paths' statements do not take)."""
        p = self.statements.tables.partitions
        tables = []
        for route in routes or ():
            parts = [p.c.pipeline == route.pipeline]
            if route.version is not None:
                pinned = p.c.pipeline_version == route.version
                parts.append(or_(pinned, p.c.pipeline_version.is_(None))
                             if route.null_version else pinned)
            if route.gates is not None:
                parts.append(or_(*(p.c.gate == gate for gate in sorted(route.gates))))
            tables.append(and_(*parts))
        return or_(*tables) if tables else false()

    def free(self, limit: int, routes: Served = None) -> Select[Any]:
        """Up to ``limit`` available partitions, unleased or expired and not paused,
        first in the lease queue first (``rank_at``, then id); with ``routes``, only
        those at a place they serve (:meth:`served`). No parameters."""
        found = self._free.get((limit, routes))
        if found is None:
            p = self.statements.tables.partitions
            now = self.statements.now
            query = (
                self._columns()
                # Read in the queue's order (status, rank_at, id) and stop at the
                # limit; a range on (status, until) would sort every free partition.
                .where(p.c.status == AVAILABLE, not_for_index(p.c.until) <= now,
                       p.c.paused_at.is_(None), ~self.statements.flow_paused(p.c.flow_key)))
            if routes is not None:
                # Tested on the rows the walk of ix_partitions_rank passes: the queue's
                # order still comes from the index, and no sort is added.
                query = query.where(self.served(routes))
            found = self._free[(limit, routes)] = query.order_by(p.c.rank_at, p.c.id).limit(limit)
        return found

    @functools.cached_property
    def queue_place(self) -> Select[Any]:
        """One row: the clock's time plus ``:back`` seconds (a new unkeyed partition's
        place in the lease queue, ``:back`` its priority's head start, negative), and
        the latest place an open partition holds from there to a millisecond later
        (NULL when none does): the clock's resolution (SQLite's is a millisecond), so a
        partition created in the same tick as another goes after it, not by id.
        One range of ``ix_partitions_rank``."""
        p = self.statements.tables.partitions
        place = self.statements.now_plus(bindparam("back", type_=Float()))
        tick = self.statements.now_plus(bindparam("back", type_=Float()) + TIE_WINDOW)
        latest = (select(func.max(p.c.rank_at))
                  .where(p.c.status == AVAILABLE, p.c.rank_at >= place, p.c.rank_at < tick)
                  .scalar_subquery())
        return select(latest.label("latest"))

    def of_owner(self, limit: int, routes: Served = None) -> Select[Any]:
        """Up to ``limit`` partitions the owner ``:holder`` holds with a live lease,
        the latest renewed first; with ``routes``, only those at a place they serve."""
        found = self._of_owner.get((limit, routes))
        if found is None:
            p = self.statements.tables.partitions
            query = (self._columns()
                     .where(p.c.status == AVAILABLE, p.c.owner == bindparam("holder"),
                            p.c.until > self.statements.now))
            if routes is not None:
                query = query.where(self.served(routes))
            found = self._of_owner[(limit, routes)] = (
                query.order_by(p.c.until.desc(), p.c.id).limit(limit))
        return found

    @functools.cached_property
    def pin_version(self) -> Update:
        """Pin ``:pipeline_version`` on partition ``:pid`` that ``:holder`` holds, unless
        one is pinned already. The version stays: the holder's guarded writes go on."""
        p = self.statements.tables.partitions
        return (update(p).where(p.c.id == bindparam("pid"), p.c.owner == bindparam("holder"),
                                p.c.pipeline_version.is_(None))
                .values(pipeline_version=bindparam("pinned")))

    @functools.cached_property
    def stopped(self) -> Select[Any]:
        """The ids of partitions clients cancelled or began deleting while ``:holder``
        held them, since ``:back`` seconds before now (``:back`` is negative)."""
        p = self.statements.tables.partitions
        return select(p.c.id).where(
            # Two comparisons: an IN list would be an expanding parameter, which the
            # direct paths' statements, compiled once, do not take.
            or_(p.c.status == CANCELLED, p.c.status == DELETING),
            p.c.owner == bindparam("holder"),
            p.c.until >= self.statements.now_plus(bindparam("back", type_=Float())))

    def counts(self, free_cap: int) -> CompoundSelect:
        """Rows ``(holder, count)``: each owner's live leases, then ``("", n)`` with ``n``
        the partitions free to lease (unleased or expired, not scheduled for later),
        counted up to ``free_cap``. No parameters.

        Bounded: the first part reads only the rows under a live lease (and those
        scheduled for later, which share the index range), the second at most
        ``free_cap`` index entries, however many partitions wait.
        """
        found = self._counts.get(free_cap)
        if found is None:
            p = self.statements.tables.partitions
            now = self.statements.now
            leased = (select(p.c.owner.label("holder"), func.count().label("held"))
                      .where(p.c.status == AVAILABLE, p.c.until > now, p.c.owner != "")
                      .group_by(p.c.owner))
            free = (select(p.c.id).where(p.c.status == AVAILABLE, p.c.until <= now)
                    .limit(free_cap).subquery("free"))
            found = self._counts[free_cap] = union_all(
                leased, select(literal("").label("holder"), func.count().label("held"))
                .select_from(free))
        return found

    def take(self, rows: int) -> Update:
        """A take of ``rows`` leases in one statement (built once per shape): the guarded
        take of :meth:`watcher.store.sql.shared.Statements.lease_take` (parameters from
        :meth:`~watcher.store.sql.shared.Statements.lease_rewrite_params`), limited to the
        rows no other session holds locked, which it locks (``FOR UPDATE SKIP
        LOCKED``: a frozen session holding one row does not hold up the rest), and
        returning the ids it took.

        For databases that update a table while reading it in a subquery and return
        rows from an ``UPDATE`` (PostgreSQL, and SQLite, where the lock clause does
        not apply: a write holds the whole database).
        """
        found = self._takes.get(rows)
        if found is None:
            p = self.statements.tables.partitions
            locked = p.alias("locked")
            ids: list[BindParameter[Any]] = [bindparam(f"pid{n}") for n in range(rows)]
            # Locked once, in a CTE (see rewrite).
            free = lock_unless_busy(select(locked.c.id).where(locked.c.id.in_(ids)),
                                    locked).cte("free")
            found = self._takes[rows] = (self.statements.lease_take(rows)
                                         .where(p.c.id.in_(select(free.c.id)))
                                         .returning(p.c.id))
        return found

    def rewrite(self, rows: int, *, release: bool) -> Update:
        """A renewal (or, with ``release``, a release) of ``rows`` leases in one statement
        (built once per shape; parameters from
        :meth:`~watcher.store.sql.shared.Statements.lease_rewrite_params`), for the
        databases :meth:`take` is for.

        It rewrites the rows ``holder`` holds open as
        :meth:`~watcher.store.sql.shared.Statements.lease_rewrite` does, at whatever version
        they are (a client's write may have moved it on; the holder adopts the gate
        returned), limited to the rows no other session holds locked. It returns each
        row rewritten: id, version, gate, and the clock's time. The timelines the
        renewal carries are written apart
        (:meth:`watcher.store.sql.timelines.TimelineStatements.swap`): the partition row
        stays small, and a renewal without items done writes none.
        """
        key = (rows, release)
        found = self._rewrites.get(key)
        if found is None:
            statements = self.statements
            p = statements.tables.partitions
            holder = bindparam("holder", type_=p.c.owner.type)
            locked = p.alias("locked")
            # IN lists, not chains of ORs: SQLite limits an expression's depth.
            ids: list[BindParameter[Any]] = [bindparam(f"pid{n}") for n in range(rows)]
            # The rows to rewrite, locked once (a CTE: a subquery that locks rows is
            # run again for each row of the UPDATE on PostgreSQL).
            free = lock_unless_busy(select(locked.c.id).where(
                locked.c.id.in_(ids), locked.c.owner == holder, locked.c.status == AVAILABLE),
                locked).cte("free")
            values: dict[str, Any] = {"version": p.c.version + 1, "updated_at": statements.now}
            if release:
                values.update(owner="", until=statements.now)
            else:
                values["until"] = statements.now_plus(bindparam("duration", type_=Float()))
            found = self._rewrites[key] = (
                update(p).where(p.c.id.in_(ids), p.c.id.in_(select(free.c.id)),
                                p.c.owner == holder, p.c.status == AVAILABLE)
                .values(**values)
                .returning(p.c.id, p.c.version, p.c.gate, statements.now))
        return found
