"""The statements that write a partition's timeline (:mod:`watcher.rules.timeline`) in
its own row of ``partition_timelines``, apart from the partition row the hot path
rewrites: a write of one timeline, the insert of a missing row, and a batch that
writes each timeline only where it is still the writer's copy.

The timeline row's one index is its key, which none of these changes: on PostgreSQL
each write can be a HOT update (revision 0013 leaves room in each page for one).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, case, func, insert, select, update
from sqlalchemy.sql.expression import BindParameter, Insert, Select, Update

from watcher.store.sql.schema import Tables


class TimelineStatements:
    """The timeline writes for one store's tables, each built once per shape."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables
        self._swaps: dict[int, Update] = {}
        self._afters: dict[Update, Select[Any]] = {}
        t = tables.timelines
        self.set_one: Update = (
            update(t).where(t.c.partition_id == bindparam("tl_pid", type_=t.c.partition_id.type))
            .values(timeline=bindparam("tl_text", type_=t.c.timeline.type)))
        """Replace the timeline of the partition ``:tl_pid`` with ``:tl_text``; matches no
        row where the partition has no timeline row (then :attr:`add_one`)."""
        self.add_one: Insert = insert(t).values(
            partition_id=bindparam("tl_pid", type_=t.c.partition_id.type),
            timeline=bindparam("tl_text", type_=t.c.timeline.type))
        """Insert the timeline row of the partition ``:tl_pid`` holding ``:tl_text``."""

    def after(self, move: Update) -> Select[Any]:
        """``move`` (a holder's guarded write of one partition row, built once) and then,
        where it matched, the partition's timeline set to ``:tl_text``, as one
        statement: ``move`` in a ``WITH`` whose ids the timeline's ``UPDATE`` follows
        (built once per ``move``). It returns one row: how many partition rows the
        move wrote, and how many timeline rows (0 where the partition has none yet).

        For the databases whose statements chain writes (PostgreSQL).
        """
        found = self._afters.get(move)
        if found is None:
            t, p = self.tables.timelines, self.tables.partitions
            moved = move.returning(p.c.id).cte("moved")
            written = (update(t).where(t.c.partition_id.in_(select(moved.c.id)))
                       .values(timeline=bindparam("tl_text", type_=t.c.timeline.type))
                       .returning(t.c.partition_id).cte("written"))
            counts: list[Any] = [select(func.count()).select_from(cte).scalar_subquery()
                                 for cte in (moved, written)]
            found = self._afters[move] = select(*counts)
        return found

    def swap(self, rows: int) -> Update:
        """Up to ``rows`` timelines in one statement (built once per shape): the timeline
        of partition ``pid<n>`` becomes ``tl<n>`` only where it is still ``was<n>``
        (``NULL`` matches ``NULL``: none yet), the writer's copy. It returns the ids
        it wrote. A ``pid<n>`` of ``NULL`` pads the shape (it matches no row).

        For the databases that return rows from an ``UPDATE`` (PostgreSQL, SQLite).
        """
        found = self._swaps.get(rows)
        if found is None:
            t = self.tables.timelines
            ids: list[BindParameter[Any]] = [bindparam(f"pid{n}", type_=t.c.partition_id.type)
                                             for n in range(rows)]
            # Simple CASEs, one WHEN per row: flat, whatever the shape (SQLite limits
            # an expression's depth, not its width).
            new = case(*((ids[n], bindparam(f"tl{n}", type_=t.c.timeline.type))
                         for n in range(rows)), value=t.c.partition_id, else_=t.c.timeline)
            was = case(*((ids[n], bindparam(f"was{n}", type_=t.c.timeline.type))
                         for n in range(rows)), value=t.c.partition_id)
            found = self._swaps[rows] = (
                update(t).where(t.c.partition_id.in_(ids), t.c.timeline.is_not_distinct_from(was))
                .values(timeline=new).returning(t.c.partition_id))
        return found
