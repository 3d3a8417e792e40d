"""A token bucket per client address: how ``processor api`` bounds the completion routes.

A completion token is 256 random bits, so guessing one is hopeless; the bound is there
so that one client cannot turn the token-free routes into a guessing load. A refused
lookup (404: no wait has the token) spends a token of its client's bucket; a client
whose bucket is empty is answered 429 with ``Retry-After`` for every request under
``/v1/completions/`` until it refills. Completions, heartbeats and answers about a known
token spend nothing, so a burst of real callbacks (a provider's webhooks, all through
one proxy) is never throttled. Pure apart from the clock it is given; no I/O.

A lookup that misses is looked up again for a while before its 404 (the wait may not
be written yet), so its token is spent at the first miss, not at the 404
(:class:`GuessCharge`): guesses sent at once cannot all pass an untouched bucket. One
whose wait turns up after all gets its token back.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

from watcher.errors import ConfigError

# Refused lookups a client address may make on the completion routes per minute, by
# default (the bucket holds as many: a burst of them is allowed, then one every 60/rate s).
DEFAULT_COMPLETIONS_PER_MINUTE: Final = 300
# Buckets kept at most; the least recently used goes first (a full bucket is the
# same as none, so forgetting one never lets a client send more than it could).
MAX_CLIENTS: Final = 10_000


class ClientRate:
    """Per-address token buckets: ``per_minute`` refused lookups a minute, as a burst or
    spread; ``0`` turns the bound off.

    Raises:
        ConfigError: ``per_minute`` is not a whole number from 0 up.
    """

    def __init__(self, per_minute: int = DEFAULT_COMPLETIONS_PER_MINUTE, *,
                 clock: Callable[[], float] = time.monotonic,
                 max_clients: int = MAX_CLIENTS) -> None:
        if type(per_minute) is not int or per_minute < 0:
            raise ConfigError("--completion-rate must be a whole number of requests a "
                              f"minute from 0 (0: no bound), got {per_minute!r}")
        self.per_minute = per_minute
        self.clock = clock
        self.max_clients = max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def exhausted(self, client: str) -> float:
        """How long ``client`` must wait before its next request (``0.0``: it may go on
        now), spending nothing."""
        if self.per_minute == 0:
            return 0.0
        capacity = float(self.per_minute)
        tokens, at = self._buckets.get(client, (capacity, self.clock()))
        tokens = min(capacity, tokens + (self.clock() - at) * capacity / 60.0)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / (capacity / 60.0)

    def take(self, client: str) -> float:
        """Spend one token of ``client``'s bucket (a refused lookup): ``0.0`` when it had
        one, else the seconds until it has (what ``Retry-After`` says)."""
        if self.per_minute == 0:
            return 0.0
        now = self.clock()
        capacity = float(self.per_minute)
        per_second = capacity / 60.0
        tokens, at = self._buckets.pop(client, (capacity, now))
        tokens = min(capacity, tokens + (now - at) * per_second)
        if tokens >= 1.0:
            self._remember(client, tokens - 1.0, now)
            return 0.0
        self._remember(client, tokens, now)
        return (1.0 - tokens) / per_second

    def give_back(self, client: str) -> None:
        """Return one token spent by :meth:`take` to ``client``'s bucket (the lookup
        found its wait after all), up to its capacity."""
        if self.per_minute == 0:
            return
        now = self.clock()
        capacity = float(self.per_minute)
        tokens, at = self._buckets.pop(client, (capacity, now))
        tokens = min(capacity, tokens + (now - at) * capacity / 60.0 + 1.0)
        self._remember(client, tokens, now)

    def _remember(self, client: str, tokens: float, now: float) -> None:
        self._buckets[client] = (tokens, now)
        while len(self._buckets) > self.max_clients:
            self._buckets.popitem(last=False)


class GuessCharge:
    """One request's charge to its client's bucket: spent at most once, by the first
    sign that the request is a refused lookup (its token's first miss, or a 404), and
    given back when the request ends otherwise."""

    def __init__(self, rate: ClientRate, client: str) -> None:
        self.rate, self.client = rate, client
        self.spent = False

    def spend(self) -> float:
        """Spend the request's token, once: ``0.0`` when it is spent (now or before),
        else the seconds until the bucket has one (what ``Retry-After`` says)."""
        if self.spent:
            return 0.0
        wait = self.rate.take(self.client)
        self.spent = wait == 0.0
        return wait

    def settle(self, refused: bool) -> None:
        """The request ended: a ``refused`` lookup (404) keeps its token spent (spending
        it now if it was not yet); any other end gives a spent one back."""
        if refused:
            self.spend()
        elif self.spent:
            self.spent = False
            self.rate.give_back(self.client)


def retry_after(seconds: float) -> str:
    """``seconds`` as a ``Retry-After`` value: whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))
