"""Waits as plain values: an answer that parks its item until someone outside completes
it, the completion token that names one wait, and what a timeout writes.

A handler answers ``Result(wait=Wait(timeout=...))``: its item becomes ``waiting`` at
its gate, holds no call and no slot, and the gate does not pass until the item is
completed (``POST /v1/completions/{token}``), times out, or its partition is cancelled.
The token is made per call (at least 128 random bits) and only its key (a SHA-256) is
stored, in the item's row (revision 0021), and only when the answer parks.

A token starts with the time it was made (milliseconds since 1970, 12 hex digits),
and its stored key with the same 12 digits, followed by 22 characters (132 bits) of
the token's SHA-256 in URL-safe base64: 34 characters, which a parking write adds to
its item's row and to the key's index. So keys arrive in their index
(``ix_items_wait``) in time order: each parking write appends to the index's last
pages instead of dirtying one page per row at random. Tokens made before this form
(43 characters, no prefix) are stored and found under their whole SHA-256 in hex.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import math
import os
import re
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

log = logging.getLogger(__name__)

# The longest wait an answer (or a heartbeat) may ask for: 30 days.
MAX_WAIT_SECONDS: Final = 30 * 24 * 3600.0
# 32 random bytes, URL-safe base64 without padding: 43 characters, 256 bits.
TOKEN_BYTES: Final = 32
# The time prefix of a token and of its key: milliseconds since 1970, in hex.
TIME_DIGITS: Final = 12
_RANDOM_LENGTH: Final = 43
# The digest characters of a key (URL-safe base64 of the token's SHA-256: 132 bits).
KEY_DIGEST_CHARACTERS: Final = 22
TOKEN_LENGTH: Final = TIME_DIGITS + _RANDOM_LENGTH
_TIME_PREFIX: Final = re.compile(r"[0-9a-f]{12}")
# The version of a ``waits`` row whose key a new wait replaced: no item has it.
REPLACED_VERSION: Final = 0
# What a token looks like; anything else is refused before a database read.
_TOKEN_SHAPE: Final = re.compile(r"[A-Za-z0-9_-]{22,128}")


class TimeoutPolicy(StrEnum):
    """What a wait's deadline does to its item."""

    RETRY = "retry"  # an error that spends an attempt: called again with a new token
    FAIL = "fail"  # the item fails at once


TIMEOUT_POLICIES: Final = tuple(policy.value for policy in TimeoutPolicy)


@dataclass(frozen=True, slots=True)
class Wait:
    """An answer's ``wait``: park the item for up to ``timeout`` seconds (by the
    database clock). ``on_timeout`` (``"retry"`` or ``"fail"``) overrides the
    processor's ``--wait-timeout-policy`` for this wait; ``None`` keeps it."""

    timeout: float
    on_timeout: str | None = None


@dataclass(frozen=True, slots=True)
class WaitWrite:
    """What a parking write stores in its item's row (revision 0021): the token's key,
    the timeout, the timeout policy (``""``: the sweeping processor's default), and
    the W3C ``traceparent`` of the span that parked the
    item (``None``: tracing off), which the completion's span links to."""

    token_hash: str
    timeout: float
    on_timeout: str = ""
    traceparent: str | None = None
    # The key of the item's last wait, which this one replaces in the item's row
    # (``None``: the item never parked): kept in ``waits``, so its token is told the
    # wait is over.
    replaces: str | None = None


def timeout_problem(timeout: object, what: str = "'wait.timeout'") -> str | None:
    """Why ``timeout`` is not a usable wait timeout (seconds, more than 0, at most
    :data:`MAX_WAIT_SECONDS`), or ``None``."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(
            timeout) or not 0 < timeout <= MAX_WAIT_SECONDS:
        return (f"{what} must be a number of seconds above 0 and at most "
                f"{int(MAX_WAIT_SECONDS)} (30 days), got {timeout!r}")
    return None


def wait_problem(wait: object) -> str | None:
    """Why ``wait`` is not a valid :class:`Wait`, or ``None`` when it is."""
    if not isinstance(wait, Wait):
        return f"the result's wait must be a Wait, got {type(wait).__name__}"
    problem = timeout_problem(wait.timeout)
    if problem is None and wait.on_timeout is not None and wait.on_timeout not in (
            TIMEOUT_POLICIES):
        problem = (f"'wait.on_timeout' must be one of {', '.join(TIMEOUT_POLICIES)}, "
                   f"got {wait.on_timeout!r}")
    return problem


def new_completion_token() -> str:
    """A fresh completion token (55 URL-safe characters): the time it was made
    (:data:`TIME_DIGITS` hex digits of milliseconds), then 256 random bits."""
    random = base64.urlsafe_b64encode(os.urandom(TOKEN_BYTES))[:_RANDOM_LENGTH].decode()
    return f"{time.time_ns() // 1_000_000:012x}{random}"


def token_hash(token: str) -> str:
    """The key an item stores for ``token`` and finds it by: its time prefix and the
    first :data:`KEY_DIGEST_CHARACTERS` characters (132 bits) of its SHA-256 in
    URL-safe base64, 34 characters in all; for a token without the prefix (made by an
    earlier version), its whole SHA-256 in hex (64 characters)."""
    digest = hashlib.sha256(token.encode("utf-8", "surrogatepass"))
    prefix = token[:TIME_DIGITS]
    if len(token) == TOKEN_LENGTH and _TIME_PREFIX.fullmatch(prefix):
        return prefix + base64.urlsafe_b64encode(digest.digest())[:KEY_DIGEST_CHARACTERS].decode()
    return digest.hexdigest()


def token_well_formed(token: str) -> bool:
    """Whether ``token`` has a completion token's shape (URL-safe base64, 22 to 128
    characters); one that does not is unknown without a database read."""
    return bool(_TOKEN_SHAPE.fullmatch(token))


def seconds_text(seconds: float) -> str:
    """``seconds`` as a message shows it: ``30``, ``0.5``."""
    return f"{seconds:g}" if seconds != int(seconds) else str(int(seconds))


def timeout_message(timeout: float) -> str:
    """The error a wait's deadline records on its item."""
    return f"timed out waiting after {seconds_text(timeout)} s"


def wait_write(wait: Wait, token: str, traceparent: str | None = None,
               replaces: str | None = None) -> WaitWrite:
    """The wait a parking answer made with the call's ``token`` stores (with the
    ``traceparent`` of the span that received it, if any), in place of the item's last
    wait, whose key was ``replaces``."""
    return WaitWrite(token_hash(token), float(wait.timeout), wait.on_timeout or "",
                     traceparent, replaces)


def fails_on_timeout(stored: str, default: str) -> bool:
    """Whether a wait stored with the policy ``stored`` (``""``: none) fails its item at
    the deadline, ``default`` being the sweeping processor's policy."""
    return (stored or default) == TimeoutPolicy.FAIL


def item_parked(partition_id: str, item_id: str, gate: int, timeout: float, *,
                pipeline: str) -> None:
    """The one INFO line of an item (of a partition of ``pipeline``) that parked (never
    its token)."""
    if log.isEnabledFor(logging.INFO):
        log.info("action=item_parked partition=%s pipeline=%s item=%s gate=%d timeout=%s",
                 partition_id, pipeline, item_id, gate, seconds_text(timeout))
