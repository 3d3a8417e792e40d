"""The delivery loop: sends the outbox's due events, at least once, in order per partition.

Each processor runs one. It claims as many due events as it has free slots
(:meth:`~watcher.store.outbox.deliveries.NotificationsStore.notifications_claim`: a lease
by the database clock, rows others hold passed by), and sends each in a task of its
own, so a slow receiver holds one slot, never the loop or the engine. An attempt
builds the event's body the first time (:mod:`processor.notify.events`), checks the
URL's host (:mod:`processor.notify.targets`), POSTs it signed
(:mod:`processor.notify.sending`) and settles the claim: ``delivered`` on a 2xx,
``pending`` again after a backoff otherwise, ``dead`` once out of attempts or age
(:mod:`processor.notify.policy`).

A processor that may not send to an event's host (it resolves to an internal address and
the processor runs without ``--notify-allow-private``) leaves the event to the others: its
claim goes back unspent, due at once, with the reason as the event's last error
(:meth:`~watcher.store.outbox.deliveries.NotificationsStore.notification_leave`), and the
processor passes it by in its claims for :data:`LEAVE_FOR`, so a processor that may send it
does. One WARNING per event. One processor's setting never kills an event another may
send; when none may, the event stays pending, its reason shown, until
``--notify-max-age``, when it is dead with that reason.

At least once: a processor killed between the receiver's 2xx and the settling write
leaves the claim to expire, and the event is sent again under the same id. Without a
secret the loop claims nothing: events wait, counted, until a processor with one runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from datetime import UTC, datetime

from sqlalchemy.exc import SQLAlchemyError

from processor.notify.events import event_body
from processor.notify.metrics import NotifyMetrics
from processor.notify.policy import NotifyConfig, backoff_delay, gives_up
from processor.notify.sending import client, post
from processor.notify.targets import refusal
from processor.observe.redact import redact_url
from watcher.outages import OutageLatch
from watcher.outbox import DeliveryState
from watcher.records import OutboxEvent
from watcher.store import Store

log = logging.getLogger(__name__)

# How often the loop refreshes its gauges and purges delivered events (seconds).
HOUSEKEEPING_EVERY = 5.0
PURGE_EVERY = 60.0
PURGE_BATCH = 500
# How long a processor passes by an event it left to the others before it looks at the
# host again (the name may resolve elsewhere by then), and the most it passes by at once.
LEAVE_FOR = 60.0
MAX_PASSING = 500
# Events whose leaving was logged, remembered up to this many (then forgotten at once).
MAX_TOLD = 10_000


class Deliverer:
    """Sends the outbox's events (see the module's docstring)."""

    def __init__(self, store: Store, owner: str, config: NotifyConfig,
                 metrics: NotifyMetrics | None = None) -> None:
        self.store = store
        self.owner = owner
        self.config = config
        self.metrics = metrics
        self._http = client(config.timeout, config.concurrency)
        self._tasks: set[asyncio.Task[str]] = set()
        self._stop = asyncio.Event()
        self._outage = OutageLatch()
        self._housekept = self._purged = float("-inf")
        self._passing: dict[int, float] = {}  # events left to others: until when (monotonic)
        self._told: set[int] = set()  # events whose leaving was logged

    async def close(self) -> None:
        """Close the HTTP client's connections."""
        await self._http.aclose()

    async def run_once(self) -> Counter[str]:
        """Claim what is due (up to the batch) and send it all; returns how many
        attempts ended each way (``delivered``, ``pending``, ``dead``, ``lost``).

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed while claiming.
        """
        claimed = await self._claim(min(self.config.batch, self.config.concurrency))
        outcomes = await asyncio.gather(*(self.deliver(event) for event in claimed))
        return Counter(outcomes)

    async def _claim(self, limit: int) -> list[OutboxEvent]:
        if self.config.secret is None or limit <= 0:
            return []
        now = time.monotonic()
        self._passing = {seq: until for seq, until in self._passing.items() if until > now}
        passing = sorted(self._passing, key=self._passing.__getitem__)[-MAX_PASSING:]
        return await self.store.notifications_claim(self.owner, limit, self.config.lease,
                                                    passing=passing)

    async def deliver(self, event: OutboxEvent) -> str:
        """Make one attempt at ``event`` (claimed by this loop) and settle it. Returns
        the state it was left in, ``refused`` when this processor may not send it and
        left it to the others (the module's docstring), or ``lost`` when the claim was
        no longer ours.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed (the claim expires and
                the event is tried again).
        """
        assert self.config.secret is not None
        body = event.body
        if body is None:
            body = event_body(event, await self.store.partition_get(event.partition_id))
        target = redact_url(event.target)
        attempt_error: str | None = None
        try:
            refused = await refusal(event.target, allow_private=self.config.allow_private)
        except LookupError as error:
            refused, attempt_error = None, str(error)
        if refused is not None:
            return await self._leave(event, body, refused, target)
        if attempt_error is None:
            sent = await post(self._http, event.target, body, secret=self.config.secret,
                              event_id=event.event_id, attempt=event.attempts,
                              timestamp=unix_seconds(event.now),
                              limit=self.config.timeout)
            if sent.delivered:
                return await self._settle(event, DeliveryState.DELIVERED, body, None, target)
            attempt_error = sent.error
        age = (event.now - event.created_at).total_seconds()
        if gives_up(event.attempts, age, self.config):
            return await self._settle(event, DeliveryState.DEAD, body, attempt_error, target)
        return await self._settle(event, DeliveryState.PENDING, body, attempt_error, target)

    async def _leave(self, event: OutboxEvent, body: bytes, refused: str, target: str) -> str:
        """This processor may not send ``event`` (``refused`` says why): leave it to one
        that may, its attempt unspent; dead only once past ``--notify-max-age``."""
        age = (event.now - event.created_at).total_seconds()
        if age >= self.config.max_age:
            return await self._settle(event, DeliveryState.DEAD, body, refused, target)
        error = (f"{refused}; this processor ({self.owner}) leaves it to one that has it, "
                 "the attempt unspent")
        self._passing[event.seq] = time.monotonic() + LEAVE_FOR
        kept = await self.store.notification_leave(event, self.owner, error=error, body=body)
        outcome = "refused" if kept else "lost"
        if self.metrics is not None:
            self.metrics.attempted(outcome)
        if kept and event.seq not in self._told:
            if len(self._told) >= MAX_TOLD:
                self._told.clear()
            self._told.add(event.seq)
            log.warning("action=notify_left event=%s partition=%r target=%s error=%s (this "
                        "processor runs without --notify-allow-private: it leaves the event "
                        "to a processor that has it; until one sends it, it stays pending, "
                        "dead after --notify-max-age; one line per event)", event.event_id,
                        event.partition_id, target, refused)
        return outcome

    async def _settle(self, event: OutboxEvent, state: DeliveryState, body: bytes,
                      error: str | None, target: str) -> str:
        delay = (backoff_delay(event.attempts, self.config.backoff, self.config.backoff_cap)
                 if state is DeliveryState.PENDING else 0.0)
        kept = await self.store.notification_settle(event, self.owner, state, retry_in=delay,
                                                    error=error, body=body)
        outcome = state.value if kept else "lost"
        if self.metrics is not None:
            self.metrics.attempted(outcome)
        if not kept:
            log.info("action=notify_claim_lost event=%s partition=%r", event.event_id,
                     event.partition_id)
        elif state is DeliveryState.DELIVERED:
            log.info("action=notify_delivered event=%s partition=%r status=%s target=%s "
                     "attempt=%d", event.event_id, event.partition_id, event.status, target,
                     event.attempts)
        elif state is DeliveryState.PENDING:
            log.warning("action=notify_retry event=%s partition=%r target=%s attempt=%d "
                        "retry_in=%.1fs error=%s", event.event_id, event.partition_id, target,
                        event.attempts, delay, error)
        else:
            log.error("action=notify_dead event=%s partition=%r target=%s attempts=%d "
                      "error=%s", event.event_id, event.partition_id, target, event.attempts,
                      error)
        return outcome

    async def _housekeeping(self) -> None:
        """Refresh the gauges, and purge delivered events now and then."""
        now = time.monotonic()
        if now - self._housekept >= HOUSEKEEPING_EVERY:
            self._housekept = now
            if self.metrics is not None:
                self.metrics.counts(await self.store.notifications_counts())
        if now - self._purged >= PURGE_EVERY:
            self._purged = now
            await self.store.notifications_purge(self.config.keep_delivered, PURGE_BATCH)

    def _started(self, event: OutboxEvent) -> None:
        task = asyncio.create_task(self._deliver_logged(event), name=f"notify {event.seq}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver_logged(self, event: OutboxEvent) -> str:
        try:
            return await self.deliver(event)
        except SQLAlchemyError as error:
            log.warning("action=notify_settle_failed event=%s error=%s; its claim expires "
                        "and it is sent again", event.event_id, type(error).__name__)
            return "lost"

    async def run(self) -> None:
        """Claim and send until :meth:`stop`, one look per interval while nothing is due.
        A database failure is logged when it begins and when it ends. On stop, the
        attempts in flight get their timeout to finish; any left are cancelled, and
        their claims expire (they are sent again)."""
        if self.config.secret is None:
            log.info("action=notify_disabled reason=no_secret: set PROCESSOR_NOTIFY_SECRET "
                     "to send partition notifications; events wait until a processor "
                     "with a secret runs")
        try:
            while not self._stop.is_set():
                free = self.config.concurrency - len(self._tasks)
                claimed: list[OutboxEvent] = []
                try:
                    claimed = await self._claim(min(free, self.config.batch))
                    await self._housekeeping()
                except SQLAlchemyError as error:
                    if self._outage.fail():
                        log.warning("action=notify_loop_failed owner=%s error=%s",
                                    self.owner, type(error).__name__)
                else:
                    if self._outage.recover():
                        log.info("action=notify_loop_recovered owner=%s", self.owner)
                for event in claimed:
                    self._started(event)
                if claimed and len(claimed) == free and self._tasks:
                    # Full: go on as soon as a slot frees.
                    await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
                    continue
                if claimed:
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.config.interval)
        finally:
            await self._finish()

    async def _finish(self) -> None:
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self.config.timeout)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.close()

    def stop(self) -> None:
        """Ask :meth:`run` to return."""
        self._stop.set()


def unix_seconds(moment: datetime) -> int:
    """A database time (naive UTC, or aware) as whole Unix seconds."""
    aware = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment
    return int(aware.timestamp())
