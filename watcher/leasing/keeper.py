"""Lease keeping: take free partitions, steal toward a fair share, renew, release.

All decisions are :func:`watcher.rules.balance.plan_balance`; this module only
does the I/O and keeps the table of leases this watcher holds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from watcher.config import WatcherConfig
from watcher.hooks import Hooks, SafeHooks
from watcher.leasing.handover import HandOverAsks
from watcher.leasing.lease import Lease, known_timelines, locked, progress_of
from watcher.leasing.lost import LostProgress
from watcher.leasing.pipeline_leases import pin_versions, served_routes, unserved
from watcher.leasing.registration import Registration
from watcher.records import LeaseRow
from watcher.rules.balance import (
    Backlog,
    backlog_room,
    goes_ahead,
    pick_free,
    plan_balance,
    with_askers,
)
from watcher.store import Store

log = logging.getLogger(__name__)

# How many more free candidates to read than we may take: watchers scanning at once spread.
CANDIDATE_SPREAD = 4


@dataclass(frozen=True, slots=True)
class LeaseCycle:
    """What one pass of the lease keeper did."""

    acquired: tuple[str, ...] = ()
    stolen: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()
    renewed: int = 0
    stopped: tuple[str, ...] = ()  # cancelled or being deleted by a client: dropped
    handing_over: tuple[str, ...] = ()  # to drain and release for processors asking


class LeaseKeeper:
    """Holds this watcher's leases and moves them toward a fair share."""

    def __init__(self, store: Store, config: WatcherConfig, hooks: Hooks | SafeHooks, *,
                 backlog: Callable[[], Backlog] | None = None) -> None:
        self.store = store
        self.config = config
        self.hooks = hooks
        # What the held partitions wait for at the slots (None: no bound but max_leases).
        self._backlog = backlog
        self.leases: dict[str, Lease] = {}
        self._renew_due = 0.0
        self._balance_due = 0.0
        # Whether the last cycle left free partitions untaken (then an end calls a cycle).
        self.free_left = True
        # Leases lost with items done their timelines lack: handed over at the next renewal.
        self.lost_progress = LostProgress(store, config.owner_id, config.max_leases)
        self.asks = HandOverAsks(store, config)
        # This processor's row in the processors table: what it serves, while it runs.
        self.registration = Registration(store, config.owner_id)

    @property
    def owner(self) -> str:  # this watcher's owner id
        return self.config.owner_id

    @property
    def room(self) -> int:
        """How many more leases this watcher may hold (``max_leases`` less those held)."""
        return self.config.max_leases - len(self.leases)

    def open_room(self) -> int:
        """How many free partitions the next cycle may take for work alone: the
        :attr:`room`, but no more than its slots' backlog leaves
        (:func:`watcher.rules.balance.backlog_room`)."""
        if self._backlog is None:
            return self.room
        return min(self.room, backlog_room(self._backlog(), self.config.lease_batch))

    async def run_once(self, *, acquire: bool = True) -> LeaseCycle:
        """Renew if due, drop what clients stopped, take free partitions (only those at a
        place :attr:`WatcherConfig.pipelines` serves), steal if due and below target.

        With a backlog (the watcher's slots), it takes free partitions only while fewer
        than two lease batches of those it holds wait for slots, and no more than fill
        that; beyond, only those that would start before them (``goes_ahead``), and it
        steals nothing. Held partitions at a place not served are handed over. This
        processor's row says what it serves (:class:`Registration`), written when due.

        Raises the database's error when it fails; the caller backs off.
        """
        now = time.monotonic()
        lost: list[str] = []
        renewed = 0
        if now >= self._renew_due:
            self._renew_due = now + self.config.renew_interval
            renewed, lost = await self.renew()
        stopped = tuple(await self.drop_stopped()) if self.leases else ()
        if not acquire:
            return LeaseCycle(lost=tuple(lost), renewed=renewed, stopped=stopped)
        await self.registration.keep(now, self.config)
        acquired: list[str] = []
        stolen: list[str] = []
        held = self.leases.values()
        handing = (await self.asks.hand_over_due(now, held)
                   + unserved(held, self.config.pipelines, self.owner))
        room = self.room
        if room <= 0:  # at its limit: take nothing, and let others steal what is fair
            self.free_left = True
            self.hooks.leases_held(len(self.leases))
            return LeaseCycle(lost=tuple(lost), renewed=renewed, stopped=stopped,
                              handing_over=handing)
        free = await self.store.leases_read_free(self.config.lease_batch * CANDIDATE_SPREAD,
                                                 served_routes(self.config))
        candidates, takeable, busy = free, min(self.config.lease_batch, room), False
        if self._backlog is not None:
            backlog = self._backlog()
            open_room = backlog_room(backlog, self.config.lease_batch)
            busy = open_room == 0
            if busy:
                # A full backlog at its slots: take only what would start before it,
                # and steal nothing (a steal is for a processor with slots to fill).
                candidates = [row for row in free if goes_ahead(row.settings, backlog)]
            else:
                takeable = min(takeable, open_room)
        balance_due = now >= self._balance_due
        if candidates or (balance_due and not busy):
            stats = with_askers(await self.store.lease_stats(), self.asks.askers)
            plan = plan_balance(self.owner, stats, len(candidates), max_take=takeable,
                                max_steal=min(self.config.steal_batch, room))
            if plan.take_free:
                acquired = await self._take_free(candidates, plan.take_free)
            elif plan.steal_from is not None and balance_due and not busy:
                # Asked first: the holder hands over; stolen only once it does not.
                if await self.asks.ask(plan.steal_from):
                    victims = await self.store.leases_of_owner(plan.steal_from, plan.steal,
                                                               served_routes(self.config))
                    stolen = await self._take(victims, stolen_from=plan.steal_from)
            if plan.steal_from is None:
                await self.asks.withdraw()
            if balance_due and not busy:
                self._balance_due = now + self.config.renew_interval
        self.free_left = len(free) > len(acquired)
        self.hooks.leases_held(len(self.leases))
        return LeaseCycle(tuple(acquired), tuple(stolen), tuple(lost), renewed, stopped,
                          handing)

    async def _take_free(self, candidates: list[LeaseRow], count: int) -> list[str]:
        """Take the first ``count`` of ``candidates`` (lease-queue order,
        :func:`watcher.rules.balance.pick_free`); the places lost to a processor that took
        the same rows a moment earlier go to the next candidates, once."""
        chosen = pick_free(candidates, count)
        acquired = await self._take(chosen, stolen_from=None)
        missing = count - len(acquired)
        if missing > 0:
            rest = [row for row in candidates[len(chosen):] if row.id not in self.leases]
            if rest:
                acquired += await self._take(pick_free(rest, missing), stolen_from=None)
        return acquired

    async def drop_stopped(self) -> list[str]:
        """Drop the leases on partitions that a client cancelled or began deleting: one
        indexed read per poll (:meth:`Store.leases_stopped`), so a holder stops within a
        poll, not at its next renewal. Returns the partitions dropped.

        Raises the database's error when the read fails.
        """
        stopped = await self.store.leases_stopped(self.owner, self.config.lease_duration)
        dropped: list[str] = []
        for partition_id in stopped:
            lease = self.leases.get(partition_id)
            if lease is not None and not lease.closed and self.stop_lease(lease):
                dropped.append(partition_id)
        return dropped

    async def _take(self, rows: list[LeaseRow], *, stolen_from: str | None) -> list[str]:
        """Take ``rows`` (pinning versions: :func:`pin_versions`); returns the partitions
        newly held. The database sets each until from its clock during the write, so a
        lease counted from before the write never outlives the database's until."""
        started, owner_read = time.monotonic(), {row.id: row.owner for row in rows}
        won = await pin_versions(self.store, await self.store.leases_take(
            rows, self.owner, self.config.lease_duration), self.config.pipelines, self.owner)
        taken: list[str] = []
        for row in won:
            held = self.leases.get(row.id)
            if held is not None and owner_read[row.id] == self.owner:
                # Our own lease, expired while its renewal was held up: its supervisor
                # still drives this Lease, which goes on (not a new one beside it).
                held.renewed(row.version, row.gate, started)
                held.timeline_known = False  # another holder may have written it meanwhile
                log.info("action=lease_reacquired partition=%s pipeline=%s owner=%s gate=%d",
                         row.id, row.settings.pipeline, self.owner, row.gate)
                continue
            if held is not None:
                # Ended meanwhile (a rewind, another holder): its supervisor's state is
                # stale; it stops, and a new Lease starts once that supervisor ends.
                self.mark_lost(held, reason="ended_by_another_writer")
            self.leases[row.id] = Lease(row.id, row.version, row.gate, renewed_at=started,
                                        settings=row.settings, timeline=row.timeline,
                                        timeline_known=row.timeline_read)
            taken.append(row.id)
            self.hooks.lease_acquired(row.id, stolen_from=stolen_from)
            log.info("action=lease_acquired partition=%s pipeline=%s owner=%s gate=%d%s", row.id,
                     row.settings.pipeline, self.owner, row.gate,
                     f" stolen_from={stolen_from}" if stolen_from else "")
        for _ in range(len(rows) - len(won)):
            self.hooks.lease_conflict("")
        if len(won) < len(rows):
            log.debug("action=lease_conflict owner=%s lost_races=%d", self.owner,
                      len(rows) - len(won))
        return taken

    async def renew(self) -> tuple[int, list[str]]:
        """Extend every open lease. Returns (renewed, lost partition ids).

        A lease whose own lock is taken (its partition is mid-write) or whose
        row another session holds locked is deferred: tried again soon, and
        given up only once it has gone unrenewed for a whole lease.

        Raises the database's error when the renewal fails.
        """
        now = time.monotonic()
        open_leases = [lease for lease in self.leases.values()
                       if not lease.lost and not lease.closed]
        free = [lease for lease in open_leases if not lease.lock.locked()]
        deferred = [lease for lease in open_leases if lease.lock.locked()]
        renewed, busy, lost = await self._renew_free(free, now)
        deferred += busy
        lost += self._give_up_overdue(deferred, now)
        if deferred:
            log.debug("action=lease_renew_deferred owner=%s count=%d", self.owner, len(deferred))
            self._renew_due = min(self._renew_due, now + self.config.poll_interval)
        await self.lost_progress.hand_over_or_keep()
        return renewed, lost

    async def _renew_free(self, leases: list[Lease], now: float
                          ) -> tuple[int, list[Lease], list[str]]:
        """Renew ``leases`` (their locks are free) in one guarded write.

        Returns how many were renewed, those whose rows another session holds
        locked (busy: to defer), and the partitions found lost.
        """
        if not leases:
            return 0, [], []
        busy: list[Lease] = []
        lost: list[str] = []
        async with locked(leases):
            progress = progress_of(leases, time.monotonic(), after=self.config.timeline_write_after)
            renewal = await self.store.leases_renew(
                {lease.partition_id: lease.version for lease in leases}, self.owner,
                self.config.lease_duration, progress, known_timelines(leases))
            for lease in leases:
                pid = lease.partition_id
                if pid in renewal.held:
                    version, gate = renewal.held[pid]
                    lease.renewed(version, gate, now)
                    if pid in renewal.timelines:
                        lease.timeline_written(renewal.timelines[pid], progress[pid])
                    elif pid in renewal.timelines_read:
                        lease.timeline_read(renewal.timelines_read[pid])
                elif pid in renewal.busy:
                    busy.append(lease)
                elif pid in renewal.stopped:
                    self.stop_lease(lease)  # a client cancelled it: not lost to anyone
                elif not lease.closed:
                    lost.append(pid)
                    self.mark_lost(lease)
        return len(renewal.held), busy, lost

    def _give_up_overdue(self, deferred: list[Lease], now: float) -> list[str]:
        """Mark lost the deferred leases unrenewed for a whole lease; returns their ids."""
        lost: list[str] = []
        for lease in deferred:
            if now - lease.renewed_at >= self.config.lease_duration and not lease.closed:
                lost.append(lease.partition_id)
                self.mark_lost(lease)
        return lost

    def mark_lost(self, lease: Lease, *, reason: str = "") -> None:
        """Record that another watcher holds ``lease`` now (or it is gone, or expired);
        what its items did since its timeline was written is handed over at the next
        renewal (:class:`LostProgress`)."""
        if not lease.mark_lost():
            return
        self._drop(lease)
        self.lost_progress.keep(lease)
        self.hooks.lease_lost(lease.partition_id)
        log.info("action=lease_lost partition=%s pipeline=%s owner=%s%s", lease.partition_id,
                 lease.settings.pipeline, self.owner, f" reason={reason}" if reason else "")

    def expired(self, lease: Lease, now: float | None = None) -> bool:
        """Whether ``lease`` is past its until: a whole lease duration since its last
        renewal began (the database set the until later than that, so this errs early).

        Such a lease is marked lost at once, even while a renewal is still under
        way (a write that hangs): another watcher may hold the partition by now,
        so nothing may be dispatched or reduced under it.
        """
        now = time.monotonic() if now is None else now
        if now - lease.renewed_at < self.config.lease_duration:
            return False
        if not lease.closed:
            self.mark_lost(lease, reason="expired")
        return True

    def stop_lease(self, lease: Lease) -> bool:
        """A client cancelled (or began deleting) ``lease``'s partition: stop driving it.

        The cancel ended the lease in the database already; here its supervisor
        is told to stop (it cancels the calls in flight, whose results would be
        fenced off anyway) and the lease is let go. Returns ``False`` when the
        lease was lost or stopped already.
        """
        if not lease.mark_lost():
            return False
        self._drop(lease)
        self.hooks.lease_released(lease.partition_id)
        log.info("action=partition_stopped partition=%s pipeline=%s owner=%s (cancelled or "
                 "being deleted by a client)", lease.partition_id, lease.settings.pipeline,
                 self.owner)
        return True

    def forget(self, lease: Lease) -> None:
        """Drop a lease whose partition closed (closing released it)."""
        lease.mark_closed()
        self._drop(lease)

    def _drop(self, lease: Lease) -> None:
        """Stop holding ``lease``, but never a newer lease on the same partition."""
        if self.leases.get(lease.partition_id) is lease:
            del self.leases[lease.partition_id]

    async def release(self, lease: Lease, *, reason: str) -> bool:
        """Let one lease go at once (a client paused its partition), so another
        processor may take it when it may run again. Returns whether it was released
        (``False``: it was lost or moved on meanwhile).
        """
        async with locked([lease]):
            if lease.lost or lease.closed:
                return False
            done = progress_of([lease], time.monotonic())
            released = await self.store.leases_release(
                {lease.partition_id: lease.version}, self.owner,
                {pid: progress for pid, progress in done.items() if progress.items},
                known_timelines([lease]))
        self.forget(lease)
        self.hooks.lease_released(lease.partition_id)
        log.info("action=lease_released partition=%s pipeline=%s owner=%s reason=%s",
                 lease.partition_id, lease.settings.pipeline, self.owner, reason)
        return released == 1

    async def release_all(self) -> int:
        """Release every lease so other watchers take over at once (and hand over what
        the items of leases lost meanwhile did), stop asking for a hand-over, and
        delete this processor's row (:mod:`watcher.leasing.registration`). Returns the
        count released."""
        await self.lost_progress.hand_over_or_keep()
        await self.asks.withdraw_or_expire()
        await self.registration.withdraw()
        live = {pid: lease for pid, lease in self.leases.items() if not lease.lost}
        if not live:
            return 0
        async with locked(live.values()):
            released = await self.store.leases_release(
                {pid: lease.version for pid, lease in live.items()}, self.owner,
                {pid: done for pid, done in progress_of(live.values(), time.monotonic()).items()
                 if done.items}, known_timelines(live.values()))
        for pid in live:
            self.hooks.lease_released(pid)
        self.leases.clear()
        log.info("action=leases_released owner=%s count=%d", self.owner, released)
        return released
