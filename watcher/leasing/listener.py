"""The listener: wakes the holders of partitions that clients write, at once, where the
store relays notifications (PostgreSQL ``LISTEN``); polling stays the fallback.

A connection that fails is opened again after doubling waits, logged once per outage.
One that relayed notifications worked: when it drops, it is opened again at once and
the backoff starts over.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential

from watcher.outages import OutageLatch
from watcher.store import Store

log = logging.getLogger(__name__)

# First wait before opening the listener's connection again after it failed.
LISTEN_BACKOFF_FIRST = 1.0
# Longest wait between two tries of the listener's connection.
LISTEN_BACKOFF_MAX = 10.0


class NotificationListener:
    """Relays the store's notifications to ``on_notification`` (a partition id each)
    until ``stopping()`` says so; ``owner`` and ``poll_interval`` name the watcher in
    its log lines."""

    def __init__(self, store: Store, on_notification: Callable[[str], None], *,
                 owner: str, poll_interval: float, stopping: Callable[[], bool]) -> None:
        self.store = store
        self.on_notification = on_notification
        self.owner = owner
        self.poll_interval = poll_interval
        self._stopping = stopping
        self._outage = OutageLatch()

    async def run(self) -> None:
        """Listen until stopping (or cancelled), opening the connection again as the
        module says. Never raises but for cancellation."""
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(Exception),
            wait=wait_exponential(multiplier=LISTEN_BACKOFF_FIRST, max=LISTEN_BACKOFF_MAX),
            before_sleep=self._failed)
        while not self._stopping():
            async for attempt in retrying:
                with attempt:
                    await self._relay()

    async def _relay(self) -> None:
        """Pass notifications on until the connection drops.

        Returns when a connection that relayed notifications drops. Raises the
        connection's error when it fails before relaying any, and
        :class:`ConnectionError` when the stream ends without one.
        """
        relayed = False
        try:
            async for partition_id in self.store.notifications():
                if not relayed:
                    relayed = True
                    if self._outage.recover():
                        log.info("action=listen_recovered owner=%s", self.owner)
                self.on_notification(partition_id)
        except Exception as error:
            if not relayed:
                raise
            log.debug("action=listen_dropped owner=%s error=%s", self.owner,
                      type(error).__name__)
            return
        if not relayed:
            raise ConnectionError("the notification stream ended")

    def _failed(self, state: RetryCallState) -> None:
        """Log the first failure of the listener's connection in an outage."""
        if not self._outage.fail():
            return
        error = state.outcome.exception() if state.outcome is not None else None
        log.warning("action=listen_failed owner=%s error=%s; polling every %s s meanwhile",
                    self.owner, type(error).__name__, self.poll_interval)
