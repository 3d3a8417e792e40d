"""Per-key in-flight limits that hold across the whole fleet.

A key's limit is shared out as *grants*: rows of ``flow_grants``, one per
processor and key, each a number of slots held until a time by the database
clock. A processor dispatches a key's items only within its grant, and a grant
changes only in a transaction that holds the key's row locked and counts the
other processors' live grants, so their sum never exceeds the limit: not at
start-up (a processor has no slot before its first grant), not through steals
or failover (a grant belongs to the processor, not to a partition), and not
when a processor dies (its grant lapses only at its until).

:func:`decide_grant` is the pure rule; :class:`KeyPool` is one key's local
account (a limit of :class:`watcher.flow.limits.FlowSlots`).
"""

from __future__ import annotations

import asyncio

from watcher.flow.waiters import Waiters
from watcher.rules.grants import GrantDecision

# A pool with no limit lets any number through (the processor's own slots bound it).
UNLIMITED = 1 << 30



class KeyPool:
    """One key's local account: its limit (``None``: unlimited), the slots granted
    and the share it may use, the slots in use, and the demand it could not meet.

    Partitions take without waiting, as from a :class:`~watcher.flow.slots.SlotPool`;
    one that finds nothing asks to be woken when slots free up or a grant grows.
    """

    def __init__(self, key: str, wanted_grant: asyncio.Event) -> None:
        self.key = key
        self.known = False  # the limit has been read (until then, nothing is let through)
        self.limit: int | None = None
        self.granted = 0
        self.target = 0
        self.in_use = 0
        self.unmet = 0  # slots asked for and refused since the last grant
        self.peak = 0  # the most slots in use at once since the last grant
        self.expires_at = 0.0  # monotonic time the grant lapses at
        # While a grant is being written, no more than the calls in flight it was
        # asked with: the new grant covers those, and a call started meanwhile might
        # not be covered by it.
        self.frozen_at: int | None = None
        self._waiting = Waiters()
        self.wanted_grant = wanted_grant  # set when unmet demand needs a grant now

    @property
    def refill_at(self) -> int:
        """Free slots worth waking a partition for: a quarter of the limit (at least
        one), as a processor's pool does with its own; no bound without a limit."""
        return UNLIMITED if self.limit is None else max(1, self.limit // 4)

    def free(self, now: float) -> int:
        """Slots this processor may still take for the key."""
        if not self.known:
            return 0
        if self.limit is None:
            return UNLIMITED
        if now >= self.expires_at:
            return 0  # a lapsed grant counts for nothing (renewals failed)
        allowed = min(self.granted, self.target)
        if self.frozen_at is not None:
            allowed = min(allowed, self.frozen_at)
        return max(0, allowed - self.in_use)

    def take(self, wanted: int, now: float) -> int:
        """Take up to ``wanted`` slots; what it could not give is noted as demand."""
        taken = max(0, min(wanted, self.free(now)))
        self.in_use += taken
        if self.in_use > self.peak:
            self.peak = self.in_use
        if taken < wanted and (self.limit is not None or not self.known):
            self.unmet += wanted - taken
            self.wanted_grant.set()
        return taken

    def give_back(self, count: int) -> None:
        """Calls ended (or were never made): their slots are free again; the partition
        that has waited longest is woken (it wakes the next when it gives back)."""
        self.in_use -= count
        self._wake(everyone=False)

    untake = give_back  # slots taken and not used (another limit refused the calls)

    def pass_turn(self, now: float) -> None:
        """A woken partition has taken what it could: if :attr:`refill_at` slots are
        still free, the next partition waiting on this key gets its turn (as
        :meth:`watcher.flow.slots.SlotPool.pass_turn` does for the processor's slots).
        Without it, slots freed by one batch's results went to one partition, and
        what it left free stayed idle until the next results came back."""
        if self._waiting and self.free(now) >= self.refill_at:
            self._wake(everyone=False)

    def wanted(self, limit: int) -> int:
        """Slots to ask the fleet for under ``limit``: those in use and the demand not
        met, or the most in use at once since the last grant if that is more.

        The peak keeps a busy key's grant steady: asked for with only the calls in
        flight at that instant (a batch's results being written, the next read not
        yet made), the grant would shrink under a steady load, and the calls
        refused next would each wait for a grant to be written again. A key idle
        for a whole renewal interval asks for nothing and gives its slots back.
        """
        return min(limit, max(self.peak, self.in_use + self.unmet))

    def freeze(self) -> int:
        """A grant is about to be written with the calls in flight now: hold them there
        until it is (:meth:`granted_now` thaws). Returns that count."""
        self.frozen_at = self.in_use
        return self.in_use

    def unlimited(self) -> None:
        """The key has no limit (none set, and no default): let everything through."""
        self.known, self.limit = True, None
        self.granted = self.target = 0
        self.frozen_at = None
        self.unmet = 0
        self._wake()

    def granted_now(self, limit: int, decision: GrantDecision, expires_at: float) -> None:
        """A grant under ``limit`` was written: the slots held and the share to keep,
        until ``expires_at`` (monotonic)."""
        self.known, self.limit = True, limit
        self.granted, self.target = decision.slots, decision.target
        self.expires_at = expires_at
        self.frozen_at = None
        self.unmet = 0
        self.peak = self.in_use
        self._wake()

    @property
    def idle(self) -> bool:
        """Nothing in flight, nothing asked for and nothing held: the pool may go."""
        return self.in_use == 0 and self.unmet == 0 and self.granted == 0

    def notify_when_free(self, event: asyncio.Event) -> None:
        """Wake ``event``'s partition when slots free up or a grant grows. A partition
        that starts waiting is demand (it waits without asking to take, when the
        processor's own slots are busy): the key asks for a grant at once, as a take
        refused would, or a key with nothing in flight here would ask for nothing."""
        if event in self._waiting:
            return
        self._waiting.add(event)
        if self.limit is not None or not self.known:
            self.unmet += self.refill_at if self.limit is not None else 1
            self.wanted_grant.set()

    def leave(self, event: asyncio.Event) -> None:
        self._waiting.remove(event)

    def _wake(self, *, everyone: bool = True) -> None:
        self._waiting.wake(everyone=everyone)
