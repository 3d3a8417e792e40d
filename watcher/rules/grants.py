"""The pure rule of per-key grants: how many of a key's slots one processor may hold
beside the other processors' live grants (:func:`decide_grant`).

The loop that keeps grants in the database is :mod:`watcher.flow.key_limiter`; one
key's local account is :class:`watcher.flow.key_pools.KeyPool`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class OtherGrant:
    """Another processor's live grant of a key: slots held, and slots it could use."""

    slots: int
    wanted: int


@dataclass(frozen=True, slots=True)
class GrantDecision:
    """What a processor holds of a key: ``slots`` reserved in the database (never
    below the calls it has in flight), and ``target``, how many it may have in
    flight (less than ``slots`` while it gives slots back to a processor waiting for
    its share)."""

    slots: int
    target: int


def decide_grant(limit: int, wanted: int, in_use: int,
                 others: Sequence[OtherGrant]) -> GrantDecision:
    """A processor's grant of a key with ``limit``, wanting ``wanted`` slots with
    ``in_use`` in flight, beside the ``others``' live grants.

    It takes what the others leave free, up to what it wants; while another
    processor wants more than it holds, it keeps no more than an even share of the
    limit among those that want some (rounded down, at least one) and gives the rest back as its
    calls end. It never reserves fewer slots than it has in flight: those calls run
    on, and the others' grants were decided counting them.
    """
    held = sum(other.slots for other in others)
    free = max(0, limit - held)
    slots = max(in_use, min(wanted, free))
    target = slots
    if any(other.wanted > other.slots for other in others):
        wanting = 1 + sum(1 for other in others if other.wanted > 0)
        # Rounded down, so the shares leave room for every processor that wants one (a
        # share rounded up would let two of three keep all of a limit of 4).
        share = max(1, limit // wanting)
        target = min(slots, share)
        slots = max(in_use, target)
    return GrantDecision(slots=slots, target=target)
