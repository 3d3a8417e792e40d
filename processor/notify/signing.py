"""The signature of an event: HMAC-SHA256 over ``<timestamp>.<body>`` with the shared
secret, sent as ``Statefeed-Signature: t=<unix seconds>,v1=<hex digest>``, the way
Stripe signs its webhooks. A receiver recomputes it over the raw body, compares in
constant time, and refuses a timestamp too far from its own clock (a replay)."""

from __future__ import annotations

import hashlib
import hmac

HEADER = "Statefeed-Signature"
EVENT_ID_HEADER = "Statefeed-Event-Id"
ATTEMPT_HEADER = "Statefeed-Attempt"
SCHEME = "v1"
# How far a receiver may let the signed time be from its own clock (seconds).
DEFAULT_TOLERANCE = 300


def signature(secret: bytes, timestamp: int, body: bytes) -> str:
    """The hex HMAC-SHA256 of ``<timestamp>.<body>`` under ``secret``."""
    return hmac.new(secret, str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """The ``Statefeed-Signature`` header's value for ``body`` sent at ``timestamp``."""
    return f"t={timestamp},{SCHEME}={signature(secret, timestamp, body)}"


def verify(secret: bytes, header: str, body: bytes, now: float,
           tolerance: float = DEFAULT_TOLERANCE) -> bool:
    """Whether ``header`` signs ``body`` with ``secret`` at a time within ``tolerance``
    seconds of ``now``. Any malformed header is simply not verified (``False``)."""
    fields: dict[str, list[str]] = {}
    for part in header.split(","):
        name, sep, value = part.strip().partition("=")
        if sep:
            fields.setdefault(name, []).append(value)
    try:
        timestamp = int(fields["t"][0])
    except (KeyError, ValueError):
        return False
    if abs(now - timestamp) > tolerance:
        return False
    expected = signature(secret, timestamp, body)
    return any(hmac.compare_digest(expected, given) for given in fields.get(SCHEME, []))
