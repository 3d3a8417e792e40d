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
# The largest event number: the outbox's seq is a 32-bit integer on every database.
MAX_SEQ = 2**31 - 1


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


def check_seqs(seqs: object) -> list[int]:
    """Events' numbers (``seq``) to send again: a list of whole numbers from 1 to
    :data:`MAX_SEQ` (none is fine: nothing is done).

    Raises:
        InvalidInputError: it is not a list of such numbers.
    """
    if isinstance(seqs, str | bytes | dict) or not isinstance(seqs, Sequence | set | frozenset):
        raise InvalidInputError(f"notification numbers must be a list of whole numbers, "
                                f"got {type(seqs).__name__}")
    for seq in seqs:
        if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq <= MAX_SEQ:
            raise InvalidInputError(f"notification numbers must be whole numbers from 1 to "
                                    f"{MAX_SEQ}, got {seq!r:.40}")
    return list(seqs)


class NotificationsClient:
    """The notifications' outbox (a part of :class:`processor.AsyncClient`)."""

    store: Store

    async def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError  # AsyncClient's

    async def notifications(self, *, state: str | None = None,
                            partition_id: str | None = None, after: int | None = None,
                            limit: int = 100,
                            newest_first: bool = False) -> list[OutboxEvent]:
        """Events in the order they were written (``newest_first``: the latest first), a
        page of ``limit`` (up to 1,000) after the sequence number ``after``: all, those
        in ``state`` (pending, delivered, dead), or those of ``partition_id``.
        Delivered events are kept for a week.

        Raises:
            InvalidInputError: an unknown state, or a limit or ``after`` out of range.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= MAX_PAGE:
            raise InvalidInputError(f"limit must be a whole number from 1 to {MAX_PAGE}, "
                                    f"got {limit!r}")
        if after is not None and (isinstance(after, bool) or not isinstance(after, int)
                                  or not 0 <= after <= MAX_SEQ):
            raise InvalidInputError(f"after must be a whole number from 0 to {MAX_SEQ}, "
                                    f"got {after!r:.40}")
        return await self._call(self.store.notifications_list(
            state=check_state(state), partition_id=partition_id, after=after, limit=limit,
            newest_first=newest_first))

    async def notification_counts(self, *, delivered: bool = False) -> dict[str, int]:
        """How many events are pending, due now, and dead; with ``delivered``, how many
        delivered ones are kept too (a week)."""
        return await self._call(self.store.notifications_counts(delivered=delivered))

    async def redeliver_notifications(self, seqs: Sequence[int]) -> int:
        """Send the dead events ``seqs`` again: they are pending, due now, with their
        attempts counted from zero. Returns how many were dead (the rest are left).

        Raises:
            InvalidInputError: ``seqs`` is not a list of whole numbers from 1 to
                :data:`MAX_SEQ` (nothing is changed).
        """
        return await self._call(self.store.notifications_redeliver(check_seqs(seqs)))


class SyncNotificationsClient:
    """The notifications' outbox (a part of :class:`processor.Client`): see
    :class:`NotificationsClient`."""

    _async: Any

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError  # Client's

    def notifications(self, *, state: str | None = None, partition_id: str | None = None,
                      after: int | None = None, limit: int = 100,
                      newest_first: bool = False) -> list[OutboxEvent]:
        """See :meth:`NotificationsClient.notifications`."""
        return self._run(self._async.notifications(state=state, partition_id=partition_id,
                                                   after=after, limit=limit,
                                                   newest_first=newest_first))

    def notification_counts(self, *, delivered: bool = False) -> dict[str, int]:
        """See :meth:`NotificationsClient.notification_counts`."""
        return self._run(self._async.notification_counts(delivered=delivered))

    def redeliver_notifications(self, seqs: Sequence[int]) -> int:
        """See :meth:`NotificationsClient.redeliver_notifications`."""
        return self._run(self._async.redeliver_notifications(seqs))
