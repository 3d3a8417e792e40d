"""Retries that spend no attempt, and the bound that keeps one item from taking them for ever.

Two kinds of failed call are not the item's failure, so they spend none of its attempts:

- the handler's service gave no answer (:class:`~watcher.protocol.HandlerUnavailableError`:
  connection refused or reset, a name that does not resolve, a connect timeout, a proxy's
  502, 503 or 504): an *outage*, held by :class:`~watcher.flow.handler_hold.HandlerHold`
  (no call to the handler starts until a probe says it answers again);
- the handler asked for fewer calls (:class:`~watcher.protocol.ThrottledError`: a 429, or
  a 503 with ``Retry-After``): every processor holds its calls to the handler that long.

Either way the item is an *unpaid retry*: it goes back to available as it was, with the
same attempt count and the same idempotency key, and runs again when the hold ends.

**The bound.** One item may take ``max_unpaid_retries`` unpaid retries in a row at one
step (they are counted per item by the processor that holds the partition's lease; the
count starts again when the item makes progress, or when another processor takes the
lease). Past the bound, each further such failure is the item's own: it is charged as an
ordinary failed attempt (backoff, and the item fails after ``max_retries`` of them, with
an error that names the bound), and it holds no other item's call. So a poison item that
takes the service down each time it is called costs the service at most
``max_unpaid_retries + max_retries + 1`` calls, and an outage or a rolling restart, which
meets each item in flight once or twice, costs no attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import Enum

from watcher.protocol import HandlerUnavailableError, RetryableError, ThrottledError
from watcher.records import DEFAULT_PIPELINE, ReadyItem
from watcher.rules.decisions import idempotency_step

log = logging.getLogger(__name__)

# The failures a retry may spend no attempt on.
UNPAID_KINDS = (HandlerUnavailableError, ThrottledError)


class UnpaidAction(Enum):
    """What one outage-class or throttled failure does to its item."""

    HOLD = "hold"  # the service is down: hold the calls to it, the item runs again, unpaid
    THROTTLE = "throttle"  # the handler asked for fewer calls: hold them that long, unpaid
    CHARGE = "charge"  # past the bound: an ordinary failed attempt, and no hold


def decide_unpaid(error: RetryableError, unpaid_so_far: int, bound: int) -> UnpaidAction:
    """What ``error`` (one of :data:`UNPAID_KINDS`) does to an item that has taken
    ``unpaid_so_far`` unpaid retries in a row at its step, under ``bound``
    (``max_unpaid_retries``)."""
    if unpaid_so_far >= bound:
        return UnpaidAction.CHARGE
    return UnpaidAction.THROTTLE if isinstance(error, ThrottledError) else UnpaidAction.HOLD


def charged_error(error: RetryableError, unpaid: int, bound: int) -> RetryableError:
    """``error`` as the ordinary retryable failure it is charged as, past the bound: its
    message says why it counts (``unpaid`` retries already taken, over ``bound``); a
    ``Retry-After`` stays the least wait before the item's next attempt."""
    kind = ("Retry-After answers" if isinstance(error, ThrottledError)
            else "calls that got no answer from the handler's service")
    return RetryableError(
        f"{error.message} (counted as an attempt: this item already had {unpaid} retries "
        f"without an attempt for {kind}, the most max_unpaid_retries allows ({bound}); "
        "raise --max-unpaid-retries if the handler's service really was down)",
        retry_after=error.retry_after)


def unpaid_label(error: RetryableError) -> str:
    """How the outcome hook names an unpaid retry: "throttled" or "held"."""
    return "throttled" if isinstance(error, ThrottledError) else "held"


class UnpaidRetries:
    """The unpaid retries of one partition's items, counted per item and step, and the
    holds they begin.

    ``on_throttled(seconds)`` holds the calls to the handler for a ``Retry-After``;
    ``on_unavailable(reason)`` holds them while its service is down. Without the one a
    failure asks for, that failure is an ordinary attempt. An item's step is its
    idempotency step (:func:`watcher.rules.decisions.idempotency_step`): a charged attempt
    keeps it, progress changes it, so a new step counts from 0. Holds only the items
    that have taken an unpaid retry (one entry each, for as long as the lease lasts);
    falsy while none has.
    """

    def __init__(self, partition_id: str, bound: int, *,
                 on_throttled: Callable[[float], None] | None = None,
                 on_unavailable: Callable[[str], None] | None = None,
                 pipeline: str = DEFAULT_PIPELINE) -> None:
        self.partition_id = partition_id
        self.pipeline = pipeline  # the partition's, in the log line
        self.bound = bound
        self._on_throttled = on_throttled
        self._on_unavailable = on_unavailable
        self._counts: dict[str, tuple[int, int]] = {}

    def __bool__(self) -> bool:
        return bool(self._counts)

    def count(self, item_id: str, step: int) -> int:
        """Unpaid retries ``item_id`` has taken at ``step``."""
        seen = self._counts.get(item_id)
        return seen[1] if seen is not None and seen[0] == step else 0

    def spend(self, item_id: str, step: int, error: RetryableError) -> UnpaidAction:
        """Decide ``error`` for the item (:func:`decide_unpaid`), and count it when unpaid."""
        count = self.count(item_id, step)
        decided = decide_unpaid(error, count, self.bound)
        if decided is not UnpaidAction.CHARGE:
            self._counts[item_id] = (step, count + 1)
        return decided

    def settle(self, item: ReadyItem, error: RetryableError) -> RetryableError | None:
        """``item``'s call failed with ``error`` (one of :data:`UNPAID_KINDS`): begin the
        hold it asks for and return ``None`` (the item runs again, unpaid), or return the
        error to write as an ordinary attempt: past the bound (logged at WARNING), or
        with no one to hold the calls."""
        throttled = isinstance(error, ThrottledError)
        if (self._on_throttled if throttled else self._on_unavailable) is None:
            return error
        step = idempotency_step(item)
        decided = self.spend(item.id, step, error)
        if decided is UnpaidAction.THROTTLE and self._on_throttled is not None:
            self._on_throttled(error.retry_after or 0.0)
        elif decided is UnpaidAction.HOLD and self._on_unavailable is not None:
            self._on_unavailable(error.message)
        else:
            count = self.count(item.id, step)
            log.warning("action=unpaid_retries_spent partition=%s pipeline=%s item=%s "
                        "gate=%d unpaid=%d max_unpaid_retries=%d kind=%s (counted as an "
                        "attempt)", self.partition_id, self.pipeline, item.id, item.gate,
                        count, self.bound, unpaid_label(error))
            return charged_error(error, count, self.bound)
        return None
