"""One typed stand-in for the store, for unit tests of the engine's bookkeeping.

:class:`FakeStore` *is* a :class:`~watcher.store.Store` (so the lease keeper,
the result writer and the watcher take it without casts), but it has no
database: the few methods the unit tests drive answer as the test scripted them
and record what they were asked, and every other method fails at once with
:class:`UnscriptedCall`, naming itself. What the real store does with the same
calls is the conformance suite's (``tests/conformance/``), on every database.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from watcher.records import ItemWrite, LeaseRenewal, LeaseRow
from watcher.rules.timeline import Progress
from watcher.store import Store
from watcher.store.drivers.base import Driver


class UnscriptedCall(AssertionError):
    """The code under test called a store method the fake was not given an answer for."""


class PortableDriver(Driver):
    """The portable driver's error classification, with no engine behind it."""

    def __init__(self, *, notifies: bool = False) -> None:  # no engine, no statements
        self.notifies = notifies  # the class's answer, per instance here


# One step of a notification script: a partition id to yield, an error to raise, or
# None to stay connected (quietly) until cancelled.
NotificationStep = str | BaseException | None


@dataclass
class Asked:
    """What the fake was asked, call by call."""

    stopped: list[tuple[str, float]] = field(default_factory=list)
    renewals: list[dict[str, int]] = field(default_factory=list)
    # The progress each renewal carried into the timelines, by partition.
    renewal_progress: list[dict[str, Progress]] = field(default_factory=list)
    takes: list[list[LeaseRow]] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)
    apply_calls: int = 0
    pings: int = 0
    grant_releases: list[str] = field(default_factory=list)
    hand_overs: list[dict[str, Progress]] = field(default_factory=list)
    # Each write of this processor's row: what it serves (None: everything); then unregisters.
    registrations: list[Any] = field(default_factory=list)
    unregistrations: list[str] = field(default_factory=list)


class FakeStore(Store):
    """A store that answers from a script.

    - ``stopped``: what :meth:`leases_stopped` answers (the partitions a client stopped);
    - ``renewal``: what :meth:`leases_renew` answers;
    - ``take_delay``: how long :meth:`leases_take` takes before it takes every row asked;
    - ``failures``: errors :meth:`items_apply` raises, one per call, before it applies
      writes (every write applied); with ``forever`` it and :meth:`ping` always raise
      ``outage`` (a callable making the error);
    - ``notification_scripts``: each :meth:`notifications` call plays the next
      script (:data:`NotificationStep`); ``notifies`` turns notifications on;
    - ``hand_over_failures``: errors :meth:`timelines_hand_over` raises, one per call,
      before it hands over anything.

    ``asked`` records the calls; ``written`` the item ids applied, in order.
    """

    def __init__(self, *, stopped: Sequence[str] = (), renewal: LeaseRenewal | None = None,
                 take_delay: float = 0.0, failures: Sequence[BaseException] = (),
                 forever: bool = False, outage: Any = None,
                 notification_scripts: Sequence[Sequence[NotificationStep]] = (),
                 notifies: bool = False,
                 hand_over_failures: Sequence[BaseException] = ()) -> None:
        # Store.__init__ is not called: there is no engine, and nothing may reach one.
        self.driver = PortableDriver(notifies=notifies)
        self.stopped = list(stopped)
        self.renewal = renewal
        self.take_delay = take_delay
        self.failures = list(failures)
        self.hand_over_failures = list(hand_over_failures)
        self.forever = forever
        self.outage = outage
        self.notification_scripts = [list(script) for script in notification_scripts]
        self.connects: list[float] = []
        self.asked = Asked()
        self.written: list[str] = []

    def __getattr__(self, name: str) -> NoReturn:
        # Only reached for attributes the fake never set (the engine, the tables...).
        raise UnscriptedCall(f"FakeStore has no {name!r}: the test did not script it")

    def _unscripted(self, method: str) -> NoReturn:
        raise UnscriptedCall(f"FakeStore.{method} was called but not scripted")

    # -- leases ---------------------------------------------------------------

    async def leases_stopped(self, owner: str, within: float) -> list[str]:
        """The scripted ``stopped`` partitions."""
        self.asked.stopped.append((owner, within))
        return list(self.stopped)

    async def leases_renew(self, leases: dict[str, int], owner: str,
                           duration: float, progress: Any = None,
                           known: Any = None) -> LeaseRenewal:
        """The scripted ``renewal``.

        Raises:
            UnscriptedCall: no renewal was scripted.
        """
        self.asked.renewals.append(dict(leases))
        self.asked.renewal_progress.append(dict(progress or {}))
        if self.renewal is None:
            self._unscripted("leases_renew")
        return self.renewal

    async def timelines_hand_over(self, progress: Any) -> int:
        """Record ``progress``; returns how many partitions it names with items done.

        Raises:
            BaseException: the next of ``hand_over_failures``.
        """
        self.asked.hand_overs.append(dict(progress))
        if self.hand_over_failures:
            raise self.hand_over_failures.pop(0)
        return sum(1 for done in progress.values() if done.items)

    async def leases_take(self, rows: Sequence[LeaseRow], owner: str,
                          duration: float) -> list[LeaseRow]:
        """Every row asked for, after ``take_delay`` seconds."""
        self.asked.takes.append(list(rows))
        await asyncio.sleep(self.take_delay)
        return list(rows)

    # -- the processors' rows -------------------------------------------------------

    async def processors_register(self, owner: str, serves: Any, duration: float) -> None:
        """Record what ``owner`` serves."""
        self.asked.registrations.append(serves)

    async def processors_unregister(self, owner: str) -> bool:
        """Record the unregistration; answers whether one was registered."""
        self.asked.unregistrations.append(owner)
        return bool(self.asked.registrations)

    # -- flow control -------------------------------------------------------------

    async def flow_grants_release(self, owner: str) -> int:
        """No grants held (the fake has no keyed partitions): answers 0.

        Raises:
            BaseException: the outage, with ``forever``.
        """
        self.asked.grant_releases.append(owner)
        if self.forever:
            raise self.outage()
        return 0

    # -- the hot path -----------------------------------------------------------

    async def items_apply(self, writes: Sequence[ItemWrite], owner: str) -> list[bool]:
        """Every write applied, after the scripted failures (one per call).

        Raises:
            BaseException: the next scripted failure, or the outage with ``forever``.
        """
        self.asked.apply_calls += 1
        await asyncio.sleep(0)
        if self.forever:
            raise self.outage()
        if self.failures:
            raise self.failures.pop(0)
        self.asked.batches.append(len(writes))
        self.written += [write.item_id for write in writes]
        return [True] * len(writes)

    async def ping(self) -> None:
        """Answers, unless the database is down ``forever``.

        Raises:
            BaseException: the outage, with ``forever``.
        """
        self.asked.pings += 1
        if self.forever:
            raise self.outage()

    async def notifications(self) -> AsyncIterator[str]:
        """Play the next notification script (none left: stay connected, quietly).

        Raises:
            BaseException: the error a script ends with.
        """
        self.connects.append(asyncio.get_running_loop().time())
        script = self.notification_scripts.pop(0) if self.notification_scripts else [None]
        for step in script:
            if isinstance(step, BaseException):
                raise step
            if step is None:
                await asyncio.Event().wait()
                continue
            yield step

    async def close(self) -> None:
        """Nothing to close."""
