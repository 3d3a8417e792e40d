"""Handler outages: one WARNING when calls to the handler stop getting answers, one when
they get answers again, never a line per call.

Every HTTP call to the handler (an item, a batch, a reduce page) ends in one of two
ways, as :func:`answered_by_handler` tells them apart:

- **unanswered**: no answer came (connection refused or reset, a name that does not
  resolve, TLS, a timeout), or a 5xx answer that is not in the handler's words
  (no error object of the contract: a proxy's 502/503/504 page, a server's bare
  ``500 Internal Server Error``);
- **answered**: anything in the handler's words: a 2xx, a 3xx or 4xx, or an error
  answer with the contract's error object, whatever its status (the handler's own
  500 for a bug, its 503 for ``Retry``). The handler is up, and deciding.

:class:`OutageTracker` is the rule, a small state machine fed those outcomes
with the times the caller read from its clock (no I/O, no clock of its own):

- An outage **starts** at an unanswered call when at least :data:`MIN_FAILED_CALLS`
  calls in a row went unanswered, and no call was answered for at least
  :data:`MIN_OUTAGE_SECONDS`, counted from the start of the first of them. Both
  must hold: a burst of calls refused in the same instant (one restart, a
  concurrency of 50) is not an outage yet, and one call in three refused (one
  replica of three down) never goes 2 s without an answer.
- It **ends** at the first answered call. The end says how long it lasted (from the
  start of the first unanswered call) and how many calls went unanswered.

The HTTP processors feed it through :class:`~processor.http.endpoint.HandlerEndpoint`,
which logs the two lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from processor.wire.values import MalformedResponseError, Reply, decode_json
from watcher.rules.checks import check_seconds, check_whole_number

MIN_FAILED_CALLS: Final = 3
MIN_OUTAGE_SECONDS: Final = 2.0


def answered_by_handler(reply: Reply) -> bool:
    """Whether ``reply`` is in the handler's words (see the module's docstring): any
    status below 500, or a 5xx whose body is a JSON object with an ``error`` member.
    Never raises."""
    if reply.status < 500:
        return True
    if not reply.body:
        return False
    try:
        document = decode_json(reply.body)
    except MalformedResponseError:
        return False
    return isinstance(document, dict) and document.get("error") is not None


@dataclass(frozen=True, slots=True)
class OutageStarted:
    """An outage began: ``url`` (redacted) is the one whose call started it, ``reason`` why
    that call got no answer; ``failed_calls`` went unanswered over ``seconds``."""

    url: str
    reason: str
    failed_calls: int
    seconds: float


@dataclass(frozen=True, slots=True)
class OutageEnded:
    """An outage ended: it lasted ``seconds``, and ``failed_calls`` went unanswered."""

    url: str
    failed_calls: int
    seconds: float


class OutageTracker:
    """The outage rule of the module's docstring, as a state machine.

    Feed it every call's outcome: :meth:`unanswered` and :meth:`answered`, each with
    the call's start and end times (seconds on one monotonic clock). Each returns the
    event to log, if the call made one. Not thread-safe: one event loop feeds it.

    Raises:
        ConfigError: (on construction) ``min_failed_calls`` is not a whole number of
            at least 1, or ``min_seconds`` is negative or not a number.
    """

    def __init__(self, *, min_failed_calls: int = MIN_FAILED_CALLS,
                 min_seconds: float = MIN_OUTAGE_SECONDS) -> None:
        check_whole_number("min_failed_calls", min_failed_calls, minimum=1)
        check_seconds("min_seconds", min_seconds, allow_zero=True)
        self.min_failed_calls = min_failed_calls
        self.min_seconds = min_seconds
        self._failed_calls = 0  # unanswered in a row (during an outage: since it began)
        self._since: float | None = None  # the start of the first of them
        self._url: str | None = None  # the URL of the outage, once it started

    @property
    def down(self) -> bool:
        """Whether an outage has started and not ended."""
        return self._url is not None

    @property
    def failed_calls(self) -> int:
        """Calls unanswered in a row so far."""
        return self._failed_calls

    def unanswered(self, url: str, reason: str, *, started: float, ended: float
                   ) -> OutageStarted | None:
        """A call to ``url`` that began at ``started`` got no answer by ``ended``
        (``reason`` says why). Returns the outage it starts, if it starts one."""
        self._failed_calls += 1
        self._since = started if self._since is None else min(self._since, started)
        if self._url is not None:
            return None  # already down: counted, not logged
        seconds = max(0.0, ended - self._since)
        if self._failed_calls < self.min_failed_calls or seconds < self.min_seconds:
            return None
        self._url = url
        return OutageStarted(url, reason, self._failed_calls, seconds)

    def answered(self, *, ended: float) -> OutageEnded | None:
        """A call was answered at ``ended``. Returns the outage it ends, if one was on."""
        url, since, failed = self._url, self._since, self._failed_calls
        self._failed_calls, self._since, self._url = 0, None, None
        if url is None or since is None:
            return None
        return OutageEnded(url, failed, max(0.0, ended - since))
