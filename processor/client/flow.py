"""The client's flow controls: per-key limits, and pauses of a key or of everything.

:class:`FlowClient` is a part of :class:`processor.AsyncClient` (a partition's own
pause is beside its other verbs there). Every control is a row in the database,
so it holds across the fleet and through restarts; processors see a pause at
their next read, and a limit at their next lease cycle.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

from processor.client.checks import check_limit
from watcher.errors import ConfigError, InvalidInputError
from watcher.models import FlowScope
from watcher.reports import FlowControlInfo
from watcher.rules.checks import check_rate
from watcher.store import Store

T = TypeVar("T")

# The most calls in flight a key's limit may allow: far beyond any fleet's slots.
MAX_INFLIGHT_LIMIT = 1_000_000
MAX_CONTROLS_PAGE = 10_000


def checked_key_name(key: object) -> str:
    """A key as the flow controls name it.

    Raises:
        InvalidInputError: not a non-empty string.
    """
    from processor.client.checks import checked_key

    if key is None or key == "":
        raise InvalidInputError("key must name a concurrency key (a tenant or customer id), "
                                f"got {key!r}")
    return checked_key(key)


def checked_inflight_limit(limit: object) -> int | None:
    """A key's in-flight limit: a whole number from 1, or ``None`` (no limit of its own).

    Raises:
        InvalidInputError: another value; the message says what would do.
    """
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise InvalidInputError(
            f"max_inflight must be a whole number of calls, got {limit!r}; pass None to "
            "lift the key's own limit")
    if not 1 <= limit <= MAX_INFLIGHT_LIMIT:
        raise InvalidInputError(
            f"max_inflight must be at least 1 and at most {MAX_INFLIGHT_LIMIT:,}, got "
            f"{limit}; to stop a key's calls, pause it (pause_key), and pass None to lift "
            "its own limit")
    return limit


def checked_rate(rate: object) -> float | None:
    """A rate limit in calls per second that processors can hold, or ``None``.

    Raises:
        InvalidInputError: not a number, or outside what a fleet can enforce.
    """
    if rate is None:
        return None
    try:
        return check_rate("calls_per_second", rate)
    except ConfigError as error:
        raise InvalidInputError(str(error)) from None


class FlowClient:
    """Flow controls across the fleet (a part of :class:`processor.AsyncClient`)."""

    store: Store

    async def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError  # AsyncClient's

    async def set_key_limit(self, key: str, max_inflight: int | None, *,
                            define: bool = False) -> None:
        """Set the most calls in flight for ``key``'s items across the whole fleet
        (``None``: lift it, back to the processors' ``--max-inflight-per-key``).

        Processors apply it at their next lease cycle. The limit is shared out as
        grants, so it holds through start-up, steals and failover; lowering it
        lets the calls in flight finish.

        Raises:
            InvalidInputError: ``max_inflight`` is not a whole number from 1 (or None).
            KeyNotFoundError: no partition has had ``key`` (a typo?); ``define=True``
                sets it up before its first partition.
        """
        name = checked_key_name(key)
        limit = checked_inflight_limit(max_inflight)
        await self._call(self.store.flow_limits_set(FlowScope.KEY, name, max_inflight=limit,
                                                    define=define))

    async def set_key_rate(self, key: str, calls_per_second: float | None, *,
                           define: bool = False) -> None:
        """Set the most calls per second to the handler for ``key``'s items across the
        whole fleet (``None``: lift it, back to the processors' ``--rate-limit-per-key``).

        Raises:
            InvalidInputError: not a rate from 0.01 to 10,000 calls per second (or None).
            KeyNotFoundError: no partition has had ``key``; ``define=True`` sets it up.
        """
        name = checked_key_name(key)
        rate = checked_rate(calls_per_second)
        await self._call(self.store.flow_limits_set(FlowScope.KEY, name, rate_limit=rate,
                                                    define=define))

    async def pause_key(self, key: str) -> bool:
        """Pause every partition of ``key``, durably, until :meth:`resume_key`: no new
        calls from each holder's next read; calls in flight finish and are written.
        Returns ``False`` when it was paused already.

        Raises:
            KeyNotFoundError: no partition has had ``key``.
        """
        return await self._call(self.store.flow_pause(FlowScope.KEY, checked_key_name(key),
                                                      True))

    async def resume_key(self, key: str) -> bool:
        """Lift ``key``'s pause. Returns ``False`` when it was not paused.

        Raises:
            KeyNotFoundError: no partition has had ``key``.
        """
        return await self._call(self.store.flow_pause(FlowScope.KEY, checked_key_name(key),
                                                      False))

    async def pause_all(self) -> bool:
        """Pause everything, durably, until :meth:`resume_all` (a key's or a partition's
        own pause stays as it is). Returns ``False`` when it was paused already."""
        return await self._call(self.store.flow_pause(FlowScope.FLEET, "", True))

    async def resume_all(self) -> bool:
        """Lift the pause of everything. Returns ``False`` when it was not paused."""
        return await self._call(self.store.flow_pause(FlowScope.FLEET, "", False))

    async def flow_controls(self, scope: str | None = None, *, limit: int = 1000,
                            after: tuple[str, str] | None = None) -> list[FlowControlInfo]:
        """The keys, handlers and fleet controls that have a limit, a pause or a block
        set, by scope and name, a page of ``limit`` at a time (``after``: the last
        one's scope and name).

        Raises:
            InvalidInputError: an unknown scope, or ``limit`` not from 1 to 10,000.
        """
        scopes = {one.value: one for one in FlowScope}
        if scope is not None and scope not in scopes:
            raise InvalidInputError(f"scope must be one of {', '.join(sorted(scopes))}, got "
                                    f"{scope!r}")
        check_limit("limit", limit, MAX_CONTROLS_PAGE)
        return await self._call(self.store.flow_controls_list(
            None if scope is None else scopes[scope], limit=limit, after=after, set_only=True))

    async def key_grants(self, limit: int = MAX_CONTROLS_PAGE
                         ) -> dict[str, list[tuple[str, int, int]]]:
        """Each key's live in-flight grants, ``key -> [(processor, slots, wanted)]``: how
        its limit is shared out across the fleet now (at most ``limit`` grants).

        Raises:
            InvalidInputError: ``limit`` is not from 1 to 10,000.
        """
        check_limit("limit", limit, MAX_CONTROLS_PAGE)
        return await self._call(self.store.flow_grants_live(limit))
