"""Schedules: adding, reading, pausing and deleting them, the ticker's read of due
schedules, and the tick's transaction, which creates the tick's partition and moves the
schedule on together, guarded by the schedule's version.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from watcher.errors import ScheduleExistsError, ScheduleNotFoundError
from watcher.models import AVAILABLE, ItemFailurePolicy
from watcher.records import NewItem, PartitionSettings
from watcher.schedules.records import DueSchedule, NewSchedule, ScheduleInfo
from watcher.schedules.timing import CatchUp, Timing, anchor_of, next_tick, tick_partition_id
from watcher.store.codecs import client_items, encode_reduce_gates, settings_of
from watcher.store.partitions import PartitionsStore


class TickOutcome(StrEnum):
    """What a tick's transaction did."""

    CREATED = "created"  # the tick's partition was created
    EXISTED = "existed"  # its partition existed already: nothing created (idempotent)
    PASSED = "passed"  # the schedule moved on past the tick without creating it
    OVERLAP = "overlap"  # --no-overlap: the last partition is still open; tick skipped
    LOST = "lost"  # another processor moved the schedule first (or it was paused, deleted)


def encode_items(items: Sequence[NewItem]) -> bytes:
    """The ``items`` column: a JSON list of ``{"id", "data" (base64), "gate"}``."""
    return json.dumps([{"id": item.id, "data": base64.b64encode(item.data).decode("ascii"),
                        "gate": item.gate} for item in client_items(items)],
                      separators=(",", ":")).encode()


def decode_items(raw: bytes) -> list[NewItem]:
    """The items :func:`encode_items` stored."""
    return [NewItem(one["id"], base64.b64decode(one["data"]), one["gate"])
            for one in json.loads(bytes(raw))]


def _timing(row: Any) -> Timing:
    return Timing(cron=row.cron, timezone=row.timezone, every=row.every)


def _settings(row: Any) -> PartitionSettings:
    base = settings_of(row.reduce_gates, row.on_item_failure)
    return PartitionSettings(base.reduce_gates, base.continue_on_failure,
                             priority=row.priority, key=row.flow_key,
                             notify=row.notify, pipeline=row.pipeline,
                             pipeline_version=row.pipeline_version)


def _info(row: Any) -> ScheduleInfo:
    return ScheduleInfo(
        name=row.name, timing=_timing(row), catch_up=CatchUp(row.catch_up),
        no_overlap=bool(row.no_overlap), settings=_settings(row), item_count=row.item_count,
        created_at=row.created_at, next_at=row.next_at, last_tick=row.last_tick,
        last_partition=row.last_partition, paused_at=row.paused_at, version=row.version)


class SchedulesStore(PartitionsStore):
    """The ``schedules`` table, and the partitions its ticks create."""

    def _schedule_columns(self) -> list[Any]:
        s = self.tables.schedules
        return [column for column in s.c if column.name != "items"]

    async def schedule_add(self, schedule: NewSchedule) -> ScheduleInfo:
        """Store a new schedule; its first tick is the first after now (database clock).

        Raises:
            ScheduleExistsError: a schedule with this name exists (nothing is written).
        """
        s = self.tables.schedules
        settings = schedule.settings
        policy = (ItemFailurePolicy.CONTINUE if settings.continue_on_failure
                  else ItemFailurePolicy.FAIL)
        try:
            async with self._write() as conn:
                if (await conn.execute(select(s.c.name).where(s.c.name == schedule.name))
                        ).first() is not None:
                    raise ScheduleExistsError(schedule.name)
                now = (await conn.execute(select(self.statements.now))).scalar_one()
                await conn.execute(insert(s).values(
                    name=schedule.name, version=1, cron=schedule.timing.cron,
                    timezone=schedule.timing.timezone, every=schedule.timing.every,
                    catch_up=schedule.catch_up.value, no_overlap=int(schedule.no_overlap),
                    items=encode_items(schedule.items), item_count=len(schedule.items),
                    reduce_gates=encode_reduce_gates(settings.reduce_gates),
                    on_item_failure=policy.value, priority=settings.priority,
                    flow_key=settings.key, notify=settings.notify,
                    pipeline=settings.pipeline, pipeline_version=settings.pipeline_version,
                    created_at=now, counted_from=now,
                    next_at=next_tick(schedule.timing, anchor_of(now), now),
                    updated_at=now))
        except IntegrityError:
            raise ScheduleExistsError(schedule.name) from None
        info = await self.schedule_get(schedule.name)
        assert info is not None
        return info

    async def schedule_get(self, name: str) -> ScheduleInfo | None:
        """Read one schedule, or ``None``."""
        s = self.tables.schedules
        async with self._read() as conn:
            row = (await conn.execute(select(*self._schedule_columns())
                                      .where(s.c.name == name))).first()
        return None if row is None else _info(row)

    async def schedule_items(self, name: str) -> list[NewItem]:
        """The items each tick's partition of schedule ``name`` gets.

        Raises:
            ScheduleNotFoundError: no schedule has this name.
        """
        s = self.tables.schedules
        async with self._read() as conn:
            raw = (await conn.execute(select(s.c["items"]).where(s.c.name == name))).scalar()
        if raw is None:
            raise ScheduleNotFoundError(name)
        return decode_items(raw)

    async def schedules_list(self, *, after: str | None = None,
                             limit: int = 1000) -> list[ScheduleInfo]:
        """Read schedules by name, a page of ``limit`` after the name ``after``."""
        s = self.tables.schedules
        query = select(*self._schedule_columns())
        if after is not None:
            query = query.where(s.c.name > after)
        async with self._read() as conn:
            rows = (await conn.execute(query.order_by(s.c.name).limit(limit))).all()
        return [_info(row) for row in rows]

    async def schedule_pause(self, name: str, paused: bool) -> bool:
        """Pause schedule ``name`` (no ticks until resumed), or resume it: it counts ticks
        from now again, so the ticks of the pause are not caught up. Returns ``False``
        when it was so already.

        Raises:
            ScheduleNotFoundError: no schedule has this name.
        """
        s = self.tables.schedules
        async with self._write() as conn:
            row = (await conn.execute(
                select(s.c.cron, s.c.timezone, s.c.every, s.c.created_at, s.c.paused_at,
                       self.statements.now.label("now")).where(s.c.name == name))).first()
            if row is None:
                raise ScheduleNotFoundError(name)
            if (row.paused_at is not None) == paused:
                return False
            values: dict[str, Any] = {"paused_at": row.now if paused else None}
            if not paused:
                values.update(counted_from=row.now, next_at=next_tick(
                    _timing(row), anchor_of(row.created_at), row.now))
            await conn.execute(update(s).where(s.c.name == name).values(
                version=s.c.version + 1, updated_at=row.now, **values))
        return True

    async def schedule_delete(self, name: str) -> None:
        """Delete schedule ``name``; the partitions its ticks created stay.

        Raises:
            ScheduleNotFoundError: no schedule has this name.
        """
        s = self.tables.schedules
        async with self._write() as conn:
            gone = await conn.execute(delete(s).where(s.c.name == name))
        if gone.rowcount != 1:
            raise ScheduleNotFoundError(name)

    async def schedules_due(self, limit: int) -> tuple[datetime | None, list[DueSchedule]]:
        """The running schedules whose next tick has passed by the store's clock (at most
        ``limit``, most overdue first) and that clock's time (``None`` when none is due).

        One read of the index on ``next_at``.
        """
        s = self.tables.schedules
        query = (select(s.c.name, s.c.version, s.c.cron, s.c.timezone, s.c.every,
                        s.c.catch_up, s.c.no_overlap, s.c.created_at, s.c.counted_from,
                        s.c.last_tick, s.c.last_partition, s.c.flow_key,
                        self.statements.now.label("now"))
                 .where(s.c.next_at <= self.statements.now, s.c.paused_at.is_(None))
                 .order_by(s.c.next_at).limit(limit))
        async with self._read() as conn:
            rows = (await conn.execute(query)).all()
        if not rows:
            return None, []
        return rows[0].now, [DueSchedule(
            name=row.name, version=row.version, timing=_timing(row),
            catch_up=CatchUp(row.catch_up), no_overlap=bool(row.no_overlap),
            anchor=anchor_of(row.created_at),
            after=max(row.counted_from, row.last_tick or row.counted_from),
            last_partition=row.last_partition, key=row.flow_key) for row in rows]

    async def schedule_tick(self, due: DueSchedule, tick: datetime | None,
                            next_at: datetime, *, create: bool) -> TickOutcome:
        """Move schedule ``due`` on to ``tick`` (its last tick; ``None`` keeps it) and
        ``next_at``, guarded by the version it was read at, and with ``create`` make the
        tick's partition ``NAME/<tick>`` in the same transaction: of processors trying at
        once exactly one moves it, and a partition that exists already is left as it is.

        With ``no_overlap``, the partition is not made while the schedule's last
        partition is still open (:attr:`TickOutcome.OVERLAP`).
        """
        s, p = self.tables.schedules, self.tables.partitions
        if create and due.key:
            await self.key_prepare(due.key)
        async with self._write() as conn:
            values: dict[str, Any] = {"next_at": next_at}
            if tick is not None:
                values["last_tick"] = tick
            moved = await conn.execute(
                update(s).where(s.c.name == due.name, s.c.version == due.version,
                                s.c.paused_at.is_(None))
                .values(version=s.c.version + 1, updated_at=self.statements.now, **values))
            if moved.rowcount != 1:
                return TickOutcome.LOST
            if not create or tick is None:
                return TickOutcome.PASSED
            if due.no_overlap and due.last_partition is not None and (await conn.execute(
                    select(p.c.id).where(p.c.id == due.last_partition,
                                         p.c.status == AVAILABLE))).first() is not None:
                return TickOutcome.OVERLAP
            partition_id = tick_partition_id(due.name, tick)
            if (await conn.execute(select(p.c.id).where(p.c.id == partition_id))
                    ).first() is not None:
                return TickOutcome.EXISTED
            await self._tick_partition(conn, due.name, partition_id)
            await conn.execute(update(s).where(s.c.name == due.name)
                               .values(last_partition=partition_id))
        return TickOutcome.CREATED

    async def _tick_partition(self, conn: AsyncConnection, name: str,
                              partition_id: str) -> None:
        """Create a tick's partition from its schedule's items and settings, in ``conn``'s
        transaction."""
        s = self.tables.schedules
        row = (await conn.execute(select(s).where(s.c.name == name))).one()
        items = decode_items(row._mapping["items"])
        first_gate = min((item.gate or 0 for item in items), default=0)
        await self._partition_insert(conn, partition_id, first_gate, _settings(row))
        await self._items_insert(conn, partition_id, items)
        await self._notify(conn, partition_id)
