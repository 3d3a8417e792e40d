"""Token buckets: the pure arithmetic of fleet-wide rate limits (:mod:`watcher.flow.rates`).

A bucket's state lives in the database (tokens, and when they were last
refilled by the database clock); these functions say what a claim does to it.
"""

from __future__ import annotations

import math

# How often a processor with calls waiting on a rate claims tokens (seconds).
CLAIM_INTERVAL = 0.1
# The burst a bucket allows: this many seconds of its rate (at least one call).
BURST_SECONDS = 0.5
# Claimed tokens not used within this many claim intervals lapse.
TOKEN_LIFETIME = 3 * CLAIM_INTERVAL
UNLIMITED = 1 << 30


def refill(tokens: float | None, elapsed: float, rate: float, *, returned: int = 0) -> float:
    """A bucket's tokens after ``elapsed`` seconds at ``rate`` and ``returned`` unused
    tokens put back, capped at its burst.

    A new bucket (``None``) starts full, as a bucket left unused for a while is: the
    first calls of a key or a handler go at once, within the burst the limit
    allows anyway, instead of each waiting a claim interval or two for tokens.
    """
    burst = max(1.0, rate * BURST_SECONDS)
    if tokens is None:
        return burst
    return min(burst, tokens + rate * max(elapsed, 0.0) + max(returned, 0))


def claim(available: float, want: int) -> int:
    """Whole calls to take from ``available`` tokens when ``want`` are wanted."""
    return max(0, min(want, math.floor(available)))
