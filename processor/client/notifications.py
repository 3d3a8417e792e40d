"""The notifications' outbox as a client reads it: the events (pending, delivered, dead),
their counts, and sending dead ones again.

:class:`NotificationsClient` is a part of :class:`processor.AsyncClient`, and
:class:`SyncNotificationsClient` of :class:`processor.Client`.
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from watcher.errors import InvalidInputError
from watcher.outbox import DeliveryState
from watcher.records import OutboxEvent

if TYPE_CHECKING:
    from watcher.store import Store

T = TypeVar("T")
STATES = tuple(state.value for state in DeliveryState)
MAX_PAGE = 1000


def check_state(state: object) -> str | None:
    """A delivery state to filter by (``None``: all).

    Raises:
        InvalidInputError: it is not pending, delivered or dead.
    """
    if state is None:
        return None
    if isinstance(state, str) and state in STATES:
        return state
    raise InvalidInputError(f"state must be one of {', '.join(STATES)}, got {state!r}")


class NotificationsClient:
    """The notifications' outbox (a part of :class:`processor.AsyncClient`)."""

    store: Store

    async def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError  # AsyncClient's

    async def notifications(self, *, state: str | None = None,
                            partition_id: str | None = None, after: int | None = None,
                            limit: int = 100) -> list[OutboxEvent]:
        """Events in the order they were written, a page of ``limit`` (up to 1,000) after
        the sequence number ``after``: all, those in ``state`` (pending, delivered,
        dead), or those of ``partition_id``. Delivered events are kept for a week.

        Raises:
            InvalidInputError: an unknown state, or a limit out of range.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= MAX_PAGE:
            raise InvalidInputError(f"limit must be a whole number from 1 to {MAX_PAGE}, "
                                    f"got {limit!r}")
        return await self._call(self.store.notifications_list(
            state=check_state(state), partition_id=partition_id, after=after, limit=limit))

    async def notification_counts(self) -> dict[str, int]:
        """How many events are pending, due now, and dead."""
        return await self._call(self.store.notifications_counts())

    async def redeliver_notifications(self, seqs: Sequence[int]) -> int:
        """Send the dead events ``seqs`` again: they are pending, due now, with their
        attempts counted from zero. Returns how many were dead (the rest are left).

        Raises:
            InvalidInputError: a sequence number is not a whole number.
        """
        if any(isinstance(seq, bool) or not isinstance(seq, int) for seq in seqs):
            raise InvalidInputError("notification numbers must be whole numbers")
        return await self._call(self.store.notifications_redeliver(list(seqs)))


class SyncNotificationsClient:
    """The notifications' outbox (a part of :class:`processor.Client`): see
    :class:`NotificationsClient`."""

    _async: Any

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError  # Client's

    def notifications(self, *, state: str | None = None, partition_id: str | None = None,
                      after: int | None = None, limit: int = 100) -> list[OutboxEvent]:
        """See :meth:`NotificationsClient.notifications`."""
        return self._run(self._async.notifications(state=state, partition_id=partition_id,
                                                   after=after, limit=limit))

    def notification_counts(self) -> dict[str, int]:
        """See :meth:`NotificationsClient.notification_counts`."""
        return self._run(self._async.notification_counts())

    def redeliver_notifications(self, seqs: Sequence[int]) -> int:
        """See :meth:`NotificationsClient.redeliver_notifications`."""
        return self._run(self._async.redeliver_notifications(seqs))
