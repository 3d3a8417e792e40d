"""What the delivery loop does after an attempt: pure decisions, no I/O.

Retries back off exponentially with full jitter (the tenacity ``wait_random_exponential``
schedule): attempt ``n`` waits a random time up to ``min(cap, base * 2**(n-1))``. An
event is given up (``dead``) once it has had ``max_attempts`` attempts or is older than
``max_age`` seconds, whichever comes first, with its last error kept.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

from watcher.errors import ConfigError
from watcher.rules.checks import check_seconds, check_whole_number

DEFAULT_TIMEOUT = 10.0
DEFAULT_BACKOFF = 5.0
DEFAULT_BACKOFF_CAP = 3600.0
DEFAULT_MAX_ATTEMPTS = 15
DEFAULT_MAX_AGE = 3 * 24 * 3600.0
DEFAULT_INTERVAL = 1.0
DEFAULT_CONCURRENCY = 8
DEFAULT_BATCH = 32
DEFAULT_KEEP_DELIVERED = 7 * 24 * 3600.0
# Of a receiver's answer, what is read and kept as the error (bytes).
ANSWER_EXCERPT = 256


@dataclass(frozen=True)
class NotifyConfig:
    """How the delivery loop sends. ``secret`` signs the events (``None``: the loop
    sends nothing, and events wait); ``allow_private`` lets it send to internal
    addresses. ``timeout`` bounds one attempt; ``interval`` is how often it looks for
    due events; at most ``concurrency`` attempts run at once, from claims of
    ``batch`` events; delivered events are deleted after ``keep_delivered`` seconds.

    Raises:
        ConfigError: a value is out of range; the message names it.
    """

    # Never in a repr (nor, so, in a log line or a traceback's locals).
    secret: bytes | None = field(default=None, repr=False)
    allow_private: bool = False
    timeout: float = DEFAULT_TIMEOUT
    backoff: float = DEFAULT_BACKOFF
    backoff_cap: float = DEFAULT_BACKOFF_CAP
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    max_age: float = DEFAULT_MAX_AGE
    interval: float = DEFAULT_INTERVAL
    concurrency: int = DEFAULT_CONCURRENCY
    batch: int = DEFAULT_BATCH
    keep_delivered: float = DEFAULT_KEEP_DELIVERED

    def __post_init__(self) -> None:
        check_seconds("notify timeout (--notify-timeout)", self.timeout)
        check_seconds("notify backoff (--notify-backoff)", self.backoff)
        check_seconds("notify backoff cap", self.backoff_cap)
        check_seconds("notify max age (--notify-max-age)", self.max_age)
        check_seconds("notify poll interval", self.interval)
        check_seconds("notify retention of delivered events", self.keep_delivered)
        check_whole_number("notify attempts (--notify-attempts)", self.max_attempts,
                           maximum=1000)
        check_whole_number("notify concurrency", self.concurrency, maximum=1000)
        check_whole_number("notify batch", self.batch, maximum=1000)
        if self.secret is not None and len(self.secret) < 16:
            raise ConfigError("the notify secret (PROCESSOR_NOTIFY_SECRET) must be at least "
                              "16 bytes; generate one with `openssl rand -hex 32`")

    @property
    def lease(self) -> float:
        """How long a claim holds an event: an attempt's timeout with room to settle it."""
        return self.timeout * 2 + 5.0


def secret_from_environment() -> bytes | None:
    """The signing secret, from ``PROCESSOR_NOTIFY_SECRET`` (never an option: a command
    line is visible to every user of the machine); ``None`` unset."""
    value = os.environ.get("PROCESSOR_NOTIFY_SECRET", "")
    return value.encode() if value else None


def backoff_delay(attempts: int, base: float, cap: float,
                  draw: float | None = None) -> float:
    """Seconds before the next attempt after ``attempts`` attempts: a uniform draw up
    to ``min(cap, base * 2**(attempts - 1))`` (``draw`` in [0, 1) fixes it in tests)."""
    ceiling = min(cap, base * 2.0 ** min(max(attempts - 1, 0), 60))
    return ceiling * (random.random() if draw is None else draw)


def gives_up(attempts: int, age: float, config: NotifyConfig) -> bool:
    """Whether an event that failed its ``attempts``-th attempt, ``age`` seconds after
    its partition ended, is dead: out of attempts, or too old to try again."""
    return attempts >= config.max_attempts or age >= config.max_age
