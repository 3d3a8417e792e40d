"""The SQL every database shares, built once per store: the hot reads, the guarded
item write, the lease fence and the batched lease rewrite. A database's driver
(:mod:`watcher.store.drivers`) builds on these and never changes them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Float,
    Integer,
    Text,
    Unicode,
    and_,
    bindparam,
    case,
    cast,
    exists,
    func,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.sql.expression import ColumnElement, Exists, Select, Update

from watcher.models import AVAILABLE, FAILED, WAITING, FlowScope
from watcher.records import (
    ItemWrite,
)
from watcher.rules.error_history import PENDING_TIME
from watcher.store.db.clock import Clock
from watcher.store.drivers.sql import clock_now, time_plus
from watcher.store.sql.schema import Tables
from watcher.store.sql.sources import ResultSource, WaitSource
from watcher.store.sql.waits import WaitStatements, wait_params


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
        self._item_writes: dict[tuple[bool, bool, bool], Update] = {}
        self._lease_rewrites: dict[tuple[int, bool], Update] = {}
        self._lease_takes: dict[int, Update] = {}
        self._transitions: dict[tuple[bool, str | None, bool], Update] = {}

    def now_plus(self, seconds: float | ColumnElement[Any]) -> ColumnElement[Any]:
        """The clock's time plus ``seconds`` (a number, or an SQL expression)."""
        return time_plus(self.now, seconds)

    def history_stamped(self, history: ColumnElement[Any]) -> ColumnElement[Any]:
        """The error history to store: ``history`` (JSON text) with its new entry's
        time, :data:`~watcher.rules.error_history.PENDING_TIME`, replaced by the clock's
        time as text, or the stored history when ``history`` is NULL.

        Stamping it here, in the write, takes the time from the database clock (the
        same one ``updated_at`` gets) at no cost of a statement or a time read.
        """
        def constant(text: str) -> ColumnElement[Any]:
            # Written into the statement (a DBA reads it there); it holds no quote mark.
            return literal_column(f"'{text}'", Text())

        stamp = constant('{"at":"') + cast(self.now, Unicode(40)) + constant('",')
        # A CASE, not COALESCE(REPLACE(...)): most writes carry no history, and a CASE
        # skips building the stamp for them (a COALESCE's arguments are all evaluated).
        return case((history.is_(None), self.tables.items.c.error_history),
                    else_=func.replace(history, constant(PENDING_TIME), stamp))

    def items_ready(self, limit: int | ColumnElement[Any]) -> Select[Any]:
        """Available items at a gate whose retry time has passed, ``(id, version, gate,
        data, attempts, error_history, wait_key)``, with bind parameters ``pid`` and
        ``gate``. The last wait's key is NULL for an item that never parked; a parking
        answer keeps it in ``waits`` as it writes its own.
        The error history is NULL for an item that never failed, so it costs almost
        nothing to read, and a failed attempt's write appends to it
        (:func:`watcher.rules.error_history.appended`) with no read of its own.

        Ordered by (retry time, id), which the index on (partition, status,
        gate, retry_at, id) returns in order: the read stops at ``limit`` rows
        and never touches completed items. ``limit`` is a number or a bind
        parameter, as the driver chooses.
        """
        i = self.tables.items
        return (
            select(i.c.id, i.c.version, i.c.gate, i.c.data, i.c.attempts, i.c.error_history,
                   i.c.wait_key)
            .where(i.c.partition_id == bindparam("pid", type_=i.c.partition_id.type),
                   i.c.status == AVAILABLE, i.c.gate == bindparam("gate", type_=Integer()),
                   i.c.retry_at <= self.now, ~self.paused())
            .order_by(i.c.retry_at, i.c.id).limit(limit)
        )

    def paused(self, partition_id: ColumnElement[Any] | None = None) -> Exists:
        """Whether partition ``partition_id`` (by default ``:pid``) is paused: itself,
        its key, or the whole fleet (primary-key look-ups). The ready read returns
        nothing then, so a paused partition starts no new call at its holder's next
        read, and the gate summary and reduce read say so."""
        p = self.tables.partitions
        if partition_id is None:
            partition_id = bindparam("pid", type_=p.c.id.type)
        return exists().where(p.c.id == partition_id,
                              or_(p.c.paused_at.is_not(None), self.flow_paused(p.c.flow_key)))

    def flow_paused(self, key: ColumnElement[Any]) -> Exists:
        """Whether the fleet, or the concurrency key in ``key`` (a ``partitions.flow_key``
        column), is paused (a flow control row)."""
        c = self.tables.flow_controls
        return exists().where(
            c.c.paused_at.is_not(None),
            or_(and_(c.c.scope == FlowScope.FLEET.value, c.c.name == ""),
                and_(c.c.scope == FlowScope.KEY.value, c.c.name == key)))

    def lease_held(self, partition_id: str | ColumnElement[Any],
                   owner: str | ColumnElement[Any], *,
                   version: int | ColumnElement[Any] | None = None,
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

    def partition_transition(self, *, gate: bool, status: str | None,
                             error: bool = False) -> Update:
        """A holder's move of its partition (built once per shape): to the gate
        ``:new_gate`` (with ``gate``), and/or to ``status``; a status other than
        ``available`` also ends the lease. Parameters: ``pid``, ``seen`` (the version
        held), ``holder`` (the owner), and with ``error`` its ``last_error`` ``:error``
        (why it failed). The timeline is written apart, in its own row
        (:mod:`watcher.store.sql.timelines`).

        No live-until check: every other processor that takes the partition bumps
        its version first, so the version alone fences a stale holder out; a
        transition landing a moment after the until, with nobody else holding the
        partition, is still the holder's and is kept.
        """
        key = (gate, status, error)
        found = self._transitions.get(key)
        if found is None:
            p = self.tables.partitions
            # A gate move changes no indexed column (a HOT update on PostgreSQL);
            # updated_at, indexed with status, moves with the status alone.
            values: dict[str, Any] = {"version": p.c.version + 1}
            if gate:
                values["gate"] = bindparam("new_gate", type_=Integer())
            if error:
                values["last_error"] = bindparam("error", type_=p.c.last_error.type)
            if status is not None:
                values.update(status=status, updated_at=self.now)
                if status != AVAILABLE:
                    values.update(owner="", until=self.now)
            # "holder", not "owner": a close sets the owner column, whose value takes that name.
            guard = self.lease_held(bindparam("pid"), bindparam("holder"),
                                    version=bindparam("seen", type_=Integer()), live=False)
            found = self._transitions[key] = update(p).where(*guard).values(**values)
        return found

    def lease_fence(self, partition_id: ColumnElement[Any], owner: ColumnElement[Any]
                    ) -> Exists:
        """True while ``owner`` holds a live lease on the partition ``partition_id``."""
        return exists().where(*self.lease_held(partition_id, owner))

    def item_guard(self, partition_id: ColumnElement[Any], item_id: ColumnElement[Any],
                   seen: ColumnElement[Any], owner: ColumnElement[Any], *, fenced: bool = True
                   ) -> tuple[ColumnElement[Any], ...]:
        """The WHERE of a result write: the item's key, the version read, and the lease
        fence (left out with ``fenced`` false, for a writer that checked the lease
        once in a transaction no other writer can enter: SQLite's).

        It names the primary key and the version, and on purpose not the
        status: with ``status = 'available'`` in it, a planner without
        statistics (a freshly filled table) may pick the ready-items index,
        whose (partition_id, status) prefix matches as many columns as the
        key, and then visit every available item of the partition per write.
        The version implies the status (every item write bumps it).
        """
        i = self.tables.items
        key = (i.c.partition_id == partition_id, i.c.id == item_id, i.c.version == seen)
        return (*key, self.lease_fence(partition_id, owner)) if fenced else key

    def result_write(self, source: ResultSource, *, fenced: bool = True) -> Update:
        """The guarded, fenced UPDATE that stores one item's result, its values read
        from ``source``: what every result write sets, written once for every
        database and shape (one write, or a batch's rows in one statement).

        It bumps the version, sets the status, attempts and error, keeps the gate,
        the data and the error history where the source's are NULL (a history's new
        entry is stamped: :meth:`history_stamped`), stamps ``updated_at``, and makes
        the item ready again after the source's delay (now, without one). Without
        ``fenced`` it leaves out the lease fence (see :meth:`item_guard`).
        """
        i = self.tables.items
        now = self.now
        values: dict[str, Any] = {
            "version": i.c.version + 1, "status": source.status,
            "gate": func.coalesce(source.gate, i.c.gate), "attempts": source.attempts,
            "last_error": source.error, "updated_at": now,
            "retry_at": (now if source.delay is None
                         else case((source.delay > 0, self.now_plus(source.delay)), else_=now)),
        }
        if source.data is not None:
            values["data"] = func.coalesce(source.data, i.c.data)
        if source.history is not None:
            values["error_history"] = self.history_stamped(source.history)
        if source.wait is not None:
            values.update(self.wait_values(source.wait))
        guard = self.item_guard(source.partition_id, source.item_id, source.seen, source.owner,
                                fenced=fenced)
        return update(i).where(*guard).values(**values)

    def wait_values(self, wait: WaitSource) -> dict[str, Any]:
        """The item columns a parking write sets from ``wait``: the new wait's key,
        timeout, policy and traceparent; where the key is NULL (a row of a batch that
        does not park), the item's last wait as it was."""
        i = self.tables.items
        kept = wait.key.is_(None)
        return {"wait_key": func.coalesce(wait.key, i.c.wait_key),
                "wait_timeout": case((kept, i.c.wait_timeout), else_=wait.timeout),
                "wait_policy": case((kept, i.c.wait_policy), else_=wait.policy),
                "wait_traceparent": case((kept, i.c.wait_traceparent), else_=wait.traceparent)}

    def item_write(self, *, new_data: bool, delayed: bool, parking: bool = False) -> Update:
        """One guarded, fenced result write from bound parameters (built once per shape:
        with new data or without, with a delay or without, parking or not); its
        parameters come from :meth:`item_write_params`."""
        key = (new_data, delayed, parking)
        found = self._item_writes.get(key)
        if found is None:
            found = self._item_writes[key] = self.result_write(
                ResultSource.parameters(self.tables.items.c.data.type, new_data=new_data,
                                        delayed=delayed, parking=parking))
        return found

    @staticmethod
    def item_write_params(write: ItemWrite, owner: str) -> dict[str, Any]:
        """The parameters of :meth:`item_write` for ``write`` by ``owner``."""
        params: dict[str, Any] = {
            "pid": write.partition_id, "iid": write.item_id, "seen": write.seen_version,
            "owner": owner, "new_status": write.status, "new_gate": write.gate,
            "new_attempts": write.attempts, "new_error": write.last_error,
            "new_history": write.error_history,
        }
        if write.data is not None:
            params["new_data"] = write.data
        if write.retry_delay:
            params["delay"] = write.retry_delay
        if write.wait is not None:
            params.update(wait_params(write))
        return params

    @functools.cached_property
    def waits(self) -> WaitStatements:
        """The statements of waits (:mod:`watcher.store.sql.waits`), built once."""
        return WaitStatements(self.tables, self.now)

    def lease_rewrite(self, rows: int, *, release: bool) -> Update:
        """One guarded renewal (or, with ``release``, release) of ``rows`` leases
        (built once per shape); its parameters come from :meth:`lease_rewrite_params`.

        Each row's guard is its id (``pid<n>``) and the version read
        (``seen<n>``); every row must be ``holder``'s and ``available``. A renewal's
        ``until`` is the clock's time plus ``duration``; a release's, the time itself.
        The timelines a renewal carries are written apart, in their own rows
        (:mod:`watcher.store.sql.timelines`).
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

    def lease_take(self, rows: int) -> Update:
        """One guarded take of ``rows`` leases (built once per shape) for the owner
        ``holder``, until the clock's time plus ``duration``; parameters from
        :meth:`lease_rewrite_params`.

        Each row's guard is its id (``pid<n>``) and the version read
        (``seen<n>``), and every row must still be ``available``: whoever held
        it, if nobody renewed or moved it since it was read, it is taken.
        """
        found = self._lease_takes.get(rows)
        if found is None:
            p = self.tables.partitions
            guards = [and_(p.c.id == bindparam(f"pid{n}"), p.c.version == bindparam(f"seen{n}"))
                      for n in range(rows)]
            found = self._lease_takes[rows] = (
                update(p).where(or_(*guards), p.c.status == AVAILABLE)
                .values(version=p.c.version + 1, owner=bindparam("holder"),
                        until=self.now_plus(bindparam("duration", type_=Float())),
                        updated_at=self.now))
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
        """Pending count, earliest retry, failed count and next gate of a gate, the
        clock's time, 1 when the partition is paused (else 0), and the count and
        earliest deadline of the items waiting at the gate; bind parameters ``pid``
        and ``gate``."""
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
            case((self.paused(), 1), else_=0),
            select(func.count()).where(here, i.c.status == WAITING).scalar_subquery(),
            select(func.min(i.c.retry_at)).where(here, i.c.status == WAITING).scalar_subquery(),
        )
