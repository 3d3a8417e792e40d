"""Flow controls: keys' fair-queuing clocks, limits and pauses of keys, handlers and
the fleet, and the in-flight grants that hold a key's limit across processors.

One row of ``flow_controls`` per key, per rate-limited handler and for the fleet
(scope and name, see :class:`watcher.models.FlowScope`); a row is made the first
time something needs it, in its own short transaction, so the statements that
follow only ever update.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import case, delete, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from watcher.errors import KeyNotFoundError
from watcher.models import FlowScope
from watcher.reports import FlowControlInfo
from watcher.rules.buckets import claim, refill
from watcher.rules.fairness import FAIR_SPACING, started_at
from watcher.rules.grants import GrantDecision, OtherGrant, decide_grant
from watcher.store.base import StoreBase
from watcher.store.codecs import IN_CHUNK, chunks
from watcher.store.drivers.sql import time_plus
from watcher.store.sql.shared import Statements

UNSET: Any = object()


async def key_clock_advance(conn: AsyncConnection, statements: Statements, key: str
                            ) -> datetime:
    """Move key ``key``'s fair-queuing clock on by one partition, in ``conn``'s
    transaction (its row must exist: :meth:`FlowStore._flow_row`), and return the
    virtual start it handed out (:mod:`watcher.rules.fairness`).

    The UPDATE locks the key's row until the transaction ends, so concurrent creates
    of one key take consecutive starts; it reads the clock as the database last
    committed it, whatever the isolation level.
    """
    c = statements.tables.flow_controls
    now = statements.now
    ahead = case((c.c.next_start > now, c.c.next_start), else_=now)
    where = (c.c.scope == FlowScope.KEY.value, c.c.name == key)
    await conn.execute(update(c).where(*where).values(
        next_start=time_plus(ahead, FAIR_SPACING.total_seconds()),
        version=c.c.version + 1, updated_at=now))
    moved = (await conn.execute(select(c.c.next_start).where(*where))).scalar_one()
    return started_at(moved)


class FlowStore(StoreBase):
    """The flow-control rows: made on first use, read by processors and operators."""

    async def _flow_row(self, scope: FlowScope, name: str, *, define: bool = True) -> None:
        """Make the row of ``scope``/``name`` unless it exists (its own transaction; a
        concurrent maker winning is fine).

        Raises:
            KeyNotFoundError: a key's row does not exist and ``define`` is false.
        """
        c = self.tables.flow_controls
        async with self._read() as conn:
            found = (await conn.execute(select(c.c.version).where(
                c.c.scope == scope.value, c.c.name == name))).first()
        if found is not None:
            return
        if not define and scope is FlowScope.KEY:
            raise KeyNotFoundError(name)
        try:
            async with self._write() as conn:
                await conn.execute(insert(c).values(scope=scope.value, name=name, version=1,
                                                    updated_at=self.statements.now))
        except IntegrityError:
            pass

    async def key_prepare(self, key: str) -> None:
        """Make key ``key``'s row, so a create can move its clock (idempotent)."""
        await self._flow_row(FlowScope.KEY, key)

    async def flow_limits_set(self, scope: FlowScope, name: str, *,
                              max_inflight: int | None = UNSET,
                              rate_limit: float | None = UNSET, define: bool = False) -> None:
        """Set (a number) or clear (``None``: back to the processors' defaults) the
        in-flight or rate limit of ``scope``/``name``; a limit left out is kept.

        Raises:
            KeyNotFoundError: an unknown key, and not ``define``.
        """
        values: dict[str, Any] = {}
        if max_inflight is not UNSET:
            values["max_inflight"] = max_inflight
        if rate_limit is not UNSET:
            values["rate_limit"] = rate_limit
        await self._flow_row(scope, name, define=define)
        if not values:
            return
        c = self.tables.flow_controls
        async with self._write() as conn:
            await conn.execute(update(c).where(c.c.scope == scope.value, c.c.name == name)
                               .values(**values, version=c.c.version + 1,
                                       updated_at=self.statements.now))

    async def flow_pause(self, scope: FlowScope, name: str, paused: bool, *,
                         define: bool = False) -> bool:
        """Pause (``paused``) or resume ``scope``/``name`` (a key, or the fleet with name
        ``''``); returns whether that changed it. Durable, by the database clock;
        holders see a pause at their next read (:meth:`Statements.paused`), and the
        lease scan takes the partitions again within a lease cycle of a resume.

        Raises:
            KeyNotFoundError: an unknown key, and not ``define``.
        """
        await self._flow_row(scope, name, define=define)
        c = self.tables.flow_controls
        now = self.statements.now
        async with self._write() as conn:
            touched = await conn.execute(
                update(c).where(c.c.scope == scope.value, c.c.name == name,
                                c.c.paused_at.is_(None) if paused else c.c.paused_at.is_not(None))
                .values(paused_at=now if paused else None, version=c.c.version + 1,
                        updated_at=now))
            return bool(touched.rowcount == 1)

    async def flow_controls_list(self, scope: FlowScope | None = None, *, limit: int = 1000,
                                 after: tuple[str, str] | None = None,
                                 set_only: bool = False) -> list[FlowControlInfo]:
        """The flow-control rows (of ``scope``; with ``set_only``, only those with a limit,
        a pause or a block set), by scope and name, a page at a time (``after`` is the
        last row's scope and name)."""
        c = self.tables.flow_controls
        query = select(c.c.scope, c.c.name, c.c.max_inflight, c.c.rate_limit, c.c.paused_at,
                       c.c.blocked_until)
        if set_only:
            query = query.where(c.c.max_inflight.is_not(None) | c.c.rate_limit.is_not(None)
                                | c.c.paused_at.is_not(None) | c.c.blocked_until.is_not(None))
        if scope is not None:
            query = query.where(c.c.scope == scope.value)
        if after is not None:
            query = query.where((c.c.scope > after[0])
                                | ((c.c.scope == after[0]) & (c.c.name > after[1])))
        query = query.order_by(c.c.scope, c.c.name).limit(limit)
        async with self._read() as conn:
            rows = (await conn.execute(query)).all()
        return [FlowControlInfo(row.scope, row.name, row.max_inflight, row.rate_limit,
                                row.paused_at, row.blocked_until) for row in rows]

    async def key_limits(self, keys: Sequence[str]) -> dict[str, int]:
        """The in-flight limits operators set for ``keys`` (keys with none are left out),
        in one read."""
        return {key: int(limit) for key, limit in
                (await self._key_settings(keys, "max_inflight")).items()}

    async def _key_settings(self, keys: Sequence[str], column: str) -> dict[str, Any]:
        """``column`` of the flow controls of ``keys``, where it is set (a read per
        chunk of keys)."""
        c = self.tables.flow_controls
        found: dict[str, Any] = {}
        async with self._read() as conn:
            for chunk in chunks(list(keys), IN_CHUNK):
                rows = await conn.execute(
                    select(c.c.name, c.c[column]).where(
                        c.c.scope == FlowScope.KEY.value, c.c.name.in_(chunk),
                        c.c[column].is_not(None)))
                found.update({name: value for name, value in rows})
        return found

    async def flow_grant(self, key: str, owner: str, *, limit: int, wanted: int, in_use: int,
                         duration: float) -> GrantDecision:
        """Decide and write ``owner``'s grant of key ``key`` under ``limit``
        (:func:`~watcher.flow.key_pools.decide_grant`), held for ``duration`` seconds by the
        database clock, in one transaction that holds the key's row locked, so grants
        of one key are decided one at a time and their sum stays within the limit.

        Another processor's grant counts for a further ``duration`` after its until:
        its holder stops starting calls at the until, but calls it started before
        may still be running (its renewals were late, or it was killed), so its
        slots are not handed out until those have surely ended. Grants past that are
        removed on the way; a grant of nothing is removed rather than kept.
        """
        await self._flow_row(FlowScope.KEY, key)
        c, g = self.tables.flow_controls, self.tables.flow_grants
        now = self.statements.now
        this_key = (g.c.scope == FlowScope.KEY.value, g.c.name == key)
        counted = g.c.until > time_plus(now, -duration)  # see above: a grace of a duration
        async with self._write() as conn:
            await conn.execute(update(c).where(c.c.scope == FlowScope.KEY.value,
                                               c.c.name == key)
                               .values(version=c.c.version + 1))  # the key's lock
            await conn.execute(delete(g).where(*this_key, ~counted))
            others = [OtherGrant(slots, want) for slots, want in await conn.execute(
                select(g.c.slots, g.c.wanted).where(*this_key, g.c.owner != owner, counted))]
            decision = decide_grant(limit, wanted, in_use, others)
            mine = (*this_key, g.c.owner == owner)
            if decision.slots == 0 and wanted == 0:
                await conn.execute(delete(g).where(*mine))
                return decision
            values = {"slots": decision.slots, "wanted": wanted,
                      "until": time_plus(now, duration)}
            changed = await conn.execute(update(g).where(*mine).values(**values))
            if changed.rowcount == 0:
                await conn.execute(insert(g).values(scope=FlowScope.KEY.value, name=key,
                                                    owner=owner, **values))
        return decision

    async def flow_grants_release(self, owner: str) -> int:
        """Drop every grant ``owner`` holds (it stops), so others may take the slots at
        once. Returns how many it held."""
        g = self.tables.flow_grants
        async with self._write() as conn:
            return int((await conn.execute(delete(g).where(g.c.owner == owner))).rowcount)

    async def flow_grants_live(self, limit: int = 10_000) -> dict[str, list[tuple[str, int, int]]]:
        """Every key's live grants, ``key -> [(owner, slots, wanted)]``, in one read of at
        most ``limit`` grants, by key and owner."""
        g = self.tables.flow_grants
        grants: dict[str, list[tuple[str, int, int]]] = {}
        async with self._read() as conn:
            rows = await conn.execute(
                select(g.c.name, g.c.owner, g.c.slots, g.c.wanted)
                .where(g.c.scope == FlowScope.KEY.value, g.c.until > self.statements.now)
                .order_by(g.c.name, g.c.owner).limit(limit))
            for name, owner, slots, wanted in rows:
                grants.setdefault(name, []).append((owner, slots, wanted))
        return grants

    async def flow_grants_list(self, key: str) -> list[tuple[str, int, int]]:
        """The live grants of key ``key``: (owner, slots, wanted), by owner."""
        g = self.tables.flow_grants
        async with self._read() as conn:
            rows = await conn.execute(
                select(g.c.owner, g.c.slots, g.c.wanted)
                .where(g.c.scope == FlowScope.KEY.value, g.c.name == key,
                       g.c.until > self.statements.now).order_by(g.c.owner))
            return [(owner, slots, wanted) for owner, slots, wanted in rows]

    async def key_rates(self, keys: Sequence[str]) -> dict[str, float]:
        """The rate limits operators set for ``keys`` (keys with none are left out)."""
        return {key: float(rate) for key, rate in
                (await self._key_settings(keys, "rate_limit")).items()}

    async def flow_tokens_claim(self, scope: FlowScope, name: str, *, rate: float,
                                want: int, returned: int = 0) -> int:
        """Take up to ``want`` tokens (whole calls) from the bucket of ``scope``/``name``
        at ``rate`` calls per second, refilled by the database clock
        (:func:`watcher.flow.rates.refill`), after putting back the ``returned``
        tokens an earlier claim took and did not use (never over the bucket's burst),
        in one transaction that holds its row locked. Returns the tokens taken
        (maybe 0)."""
        await self._flow_row(scope, name)
        c = self.tables.flow_controls
        now = self.statements.now
        where = (c.c.scope == scope.value, c.c.name == name)
        async with self._write() as conn:
            await conn.execute(update(c).where(*where).values(version=c.c.version + 1))
            row = (await conn.execute(
                select(c.c.tokens, c.c.refilled_at, now.label("now")).where(*where))).one()
            elapsed = (0.0 if row.refilled_at is None
                       else (row.now - row.refilled_at).total_seconds())
            available = refill(row.tokens, elapsed, rate, returned=returned)
            taken = claim(available, want)
            await conn.execute(update(c).where(*where).values(
                tokens=available - taken, refilled_at=row.now))
        return taken

    async def flow_block(self, scope: FlowScope, name: str, seconds: float) -> None:
        """Hold every call of ``scope``/``name`` for ``seconds`` from now by the database
        clock (a handler's ``Retry-After``); a hold already reaching further stays."""
        await self._flow_row(scope, name)
        c = self.tables.flow_controls
        until = time_plus(self.statements.now, seconds)
        async with self._write() as conn:
            await conn.execute(update(c).where(
                c.c.scope == scope.value, c.c.name == name,
                (c.c.blocked_until.is_(None)) | (c.c.blocked_until < until))
                .values(blocked_until=until, version=c.c.version + 1,
                        updated_at=self.statements.now))

    async def flow_blocked_for(self, scope: FlowScope, name: str) -> float:
        """Seconds left of the hold on ``scope``/``name`` by the database clock (0: none)."""
        c = self.tables.flow_controls
        async with self._read() as conn:
            row = (await conn.execute(
                select(c.c.blocked_until, self.statements.now.label("now"))
                .where(c.c.scope == scope.value, c.c.name == name))).first()
        if row is None or row.blocked_until is None:
            return 0.0
        return max(0.0, (row.blocked_until - row.now).total_seconds())
