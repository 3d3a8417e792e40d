"""What operators see of flow control, read once for the CLI (``processor keys``) and the
console's Flow page: the keys, handlers and fleet with a limit, a pause or a block, and
(when asked) the live in-flight grants of each key, by processor.

:func:`read_flow` does the reads; the rest are pure functions over its
:class:`FlowListing`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from processor.client.async_client import AsyncClient
from watcher.models import FlowScope
from watcher.reports import FlowControlInfo

# The rows one listing reads at most.
DEFAULT_FLOW_LIMIT = 1000


@dataclass(frozen=True)
class Grant:
    """Slots of a key's fleet-wide limit one processor holds, and how many it wants."""

    owner: str
    slots: int
    wanted: int


@dataclass(frozen=True)
class FlowRow:
    """One key, handler or the fleet, with its controls and (for a key) its live grants."""

    control: FlowControlInfo
    grants: tuple[Grant, ...] = ()

    @property
    def granted(self) -> int:
        """Slots granted across the fleet: the most calls of the key that may run now."""
        return sum(grant.slots for grant in self.grants)


@dataclass(frozen=True)
class FlowListing:
    """A read of the flow controls: the rows, whether everything is paused (and since
    when), the database's time of the read, and whether the page was full."""

    rows: list[FlowRow]
    now: datetime
    fleet_paused_at: datetime | None = None
    more: bool = False
    with_grants: bool = False


async def read_flow(client: AsyncClient, *, grants: bool = False,
                    limit: int = DEFAULT_FLOW_LIMIT) -> FlowListing:
    """The flow controls set (keys, handlers; the fleet's pause apart), up to ``limit``
    rows; with ``grants``, every key that has live grants too, each with its grants
    (one read per key, so keep ``limit`` to what a person reads).

    Raises:
        InvalidInputError: ``limit`` is not from 1 to 10,000.
        DatabaseError: the database failed.
    """
    controls = await client.flow_controls(limit=limit + 1)
    live = await client.key_grants() if grants else {}
    # Keys under the processors' default limit have no control of their own, but hold
    # grants: they are listed too.
    shown = {(row.scope, row.name) for row in controls}
    controls += [FlowControlInfo(FlowScope.KEY.value, key, None, None, None, None)
                 for key in live if (FlowScope.KEY.value, key) not in shown]
    rows: list[FlowRow] = []
    fleet: datetime | None = None
    for control in sorted(controls, key=lambda row: (row.scope, row.name)):
        if control.scope == FlowScope.FLEET.value:
            fleet = control.paused_at
            continue
        held: tuple[Grant, ...] = ()
        if control.scope == FlowScope.KEY.value:
            held = tuple(Grant(owner, slots, wanted)
                         for owner, slots, wanted in live.get(control.name, ()))
        rows.append(FlowRow(control, held))
    return FlowListing(rows[:limit], await client.now(), fleet, len(rows) > limit, grants)


def aware(moment: datetime | None) -> datetime | None:
    """A stored time (naive UTC) as an aware UTC time; ``None`` stays ``None``."""
    if moment is None:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def blocked_for(row: FlowControlInfo, now: datetime) -> float:
    """Seconds left of a handler's (or key's) Retry-After block at ``now``; 0 when none."""
    until, at = aware(row.blocked_until), aware(now)
    if until is None or at is None:
        return 0.0
    return max(0.0, (until - at).total_seconds())


# How long after a handler's last Retry-After hold ended `status` still mentions it.
RECENT_HOLD_SECONDS = 600.0


def handler_hold_lines(controls: list[FlowControlInfo], now: datetime) -> list[str]:
    """One line per handler under a Retry-After hold at ``now``, or whose last hold ended
    less than :data:`RECENT_HOLD_SECONDS` ago (holds are short: an item that keeps
    answering Retry-After shows as one hold after another). Control characters in a
    handler's name are shown as ``?``. Never raises."""
    lines = []
    at = aware(now)
    for control in controls:
        until = aware(control.blocked_until)
        if control.scope != FlowScope.HANDLER.value or until is None or at is None:
            continue
        name = "".join(ch if ch.isprintable() else "?" for ch in control.name)
        left = (until - at).total_seconds()
        if left > 0:
            lines.append(f"handler {name}: held by a Retry-After, {left:.1f} s left "
                         "(no processor calls it meanwhile)")
        elif -left < RECENT_HOLD_SECONDS:
            lines.append(f"handler {name}: last held by a Retry-After {-left:.0f} s ago")
    return lines


def flow_json(listing: FlowListing) -> dict[str, Any]:
    """A listing as ``processor keys --json`` prints it."""
    def when(moment: datetime | None) -> str | None:
        shown = aware(moment)
        return None if shown is None else shown.isoformat()

    rows = []
    for row in listing.rows:
        control = row.control
        entry: dict[str, Any] = {
            "scope": control.scope, "name": control.name,
            "max_inflight": control.max_inflight, "rate_limit": control.rate_limit,
            "paused": control.paused_at is not None, "paused_at": when(control.paused_at),
            "blocked_until": (when(control.blocked_until)
                              if blocked_for(control, listing.now) else None)}
        if listing.with_grants and control.scope == FlowScope.KEY.value:
            entry["grants"] = [{"owner": grant.owner, "slots": grant.slots,
                                "wanted": grant.wanted} for grant in row.grants]
        rows.append(entry)
    return {"fleet_paused": listing.fleet_paused_at is not None,
            "fleet_paused_at": when(listing.fleet_paused_at), "controls": rows,
            "more": listing.more}
