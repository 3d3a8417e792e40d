"""Handler errors on the processor side of the contract: reading an error answer,
classifying a failed call (retry or not, and when), and the engine's errors that name
the item or the call. Pure: no I/O.
"""

from __future__ import annotations

import email.utils
import re
from datetime import UTC
from typing import Any

from processor.wire.values import (
    ERROR_EXCERPT_CHARS,
    EXCERPT_SCAN_BYTES,
    MAX_ERROR_MESSAGE_CHARS,
    MAX_RETRY_AFTER,
    Failure,
    HandlerError,
    MalformedResponseError,
    Mask,
    decode_json,
    dump_value,
    json_type,
    show_value,
    unchanged,
)
from watcher.protocol import (
    HandlerUnavailableError,
    NonRetryableError,
    ProcessorError,
    RetryableError,
    ThrottledError,
    WorkItem,
)
from watcher.text import shorten

_DELTA_SECONDS = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,6})?")

def parse_handler_error(value: Any, mask: Mask = unchanged) -> HandlerError:
    """The handler's ``"error"`` value: ``{"message": str, "no_retry": bool}`` or a string.

    The message is masked, then cut to :data:`MAX_ERROR_MESSAGE_CHARS`; a
    message that is not a string is shown as JSON.

    Raises:
        MalformedResponseError: ``value`` is neither an object nor a string.
    """
    reported = _handler_error(value, mask)
    if reported is None:
        raise MalformedResponseError(
            f"'error' must be an object or a string, got {show_value(value)}")
    return reported


def parse_error_body(body: bytes, mask: Mask = unchanged) -> HandlerError:
    """The handler's error from the body of a non-2xx answer. Never raises.

    A body without the error object (a proxy's HTML page, plain text) is kept as a
    short excerpt in the message. ``mask`` hides secrets in the handler's text
    *before* it is shortened, so a cut never leaves part of a secret behind.
    """
    if not body or body.isspace():
        return HandlerError("")
    try:
        document = decode_json(body)
    except MalformedResponseError:
        return HandlerError(_excerpt(body, mask))
    if isinstance(document, dict) and document.get("error") is not None:
        reported = _handler_error(document["error"], mask)
        if reported is not None:
            return reported
    return HandlerError(_excerpt(body, mask))


def classify_error(status: int, error: HandlerError, *, retry_after: str | None = None,
                   now: float) -> Failure:
    """Decide what an error answer means for the item. Never raises.

    ``no_retry`` (any status), a 3xx and a 4xx other than 408 and 429 are final;
    everything else is retryable. ``retry_after`` (the header) counts on 429 and
    503 only; ``now`` (Unix seconds) resolves an HTTP-date in it.
    """
    detail = f": {error.message}" if error.message else " with no error message"
    if 200 <= status < 300:
        reason = f"the handler reported an error (HTTP {status}){detail}"
    else:
        reason = f"the handler answered HTTP {status}{detail}"
    if error.no_retry:
        return Failure(False, f"{reason} (no_retry set: not retried)")
    if 300 <= status < 400:
        return Failure(False, f"{reason}; redirects are not followed: set the handler URL "
                              "to the final address")
    if 400 <= status < 500 and status not in (408, 429):
        return Failure(False, reason)
    delay = None
    if status in (429, 503) and retry_after:
        delay = parse_retry_after(retry_after, now=now)
    return Failure(True, reason, delay, throttled=delay is not None)


def parse_retry_after(value: str, *, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` value: delta-seconds or an HTTP-date.

    A date in the past gives 0; anything over :data:`MAX_RETRY_AFTER` gives that.
    Returns ``None`` for a value that is neither. Never raises.
    """
    value = value.strip()
    if _DELTA_SECONDS.fullmatch(value):
        seconds = float(value)
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:  # "-0000": UTC by RFC 5322
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - now
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)



def malformed(status: int, problem: str, expected: str) -> Failure:
    """The retryable failure of an answer that breaks the contract, in the one wording."""
    return Failure(True, f"malformed answer (HTTP {status}): {problem}; expected {expected}")




# --------------------------------------------------------------------------- failures


def item_context(partition_id: str, item_id: str, gate: int, attempt: int) -> str:
    """How a message names an item: partition, item, gate and attempt. Item errors
    stored by earlier versions start with it (see
    :func:`processor.views.error_after_context`); new ones do not (:func:`item_error`)."""
    return f"partition {partition_id!r} item {item_id!r} gate {gate} (attempt {attempt})"


def item_error(item: WorkItem, failure: Failure, mask: Mask = unchanged) -> ProcessorError:
    """``failure`` as the engine's error for ``item``: the one place failures become errors.

    The message is the reason alone (what kind of failure, then the handler's own
    message), with secrets masked: the item's partition, id, gate and attempt are
    stored beside it (its row, its error history) and logged as fields
    (:mod:`watcher.dispatch.failures`), so the text names none of them. Never raises.
    """
    message = mask(failure.reason)
    if failure.unanswered:
        return HandlerUnavailableError(message)
    if failure.throttled and failure.retry_after is not None:
        return ThrottledError(message, retry_after=failure.retry_after)
    if failure.retryable:
        return RetryableError(message, retry_after=failure.retry_after)
    return NonRetryableError(message)


def unexpected_failure(error: BaseException, doing: str) -> Failure:
    """The retryable failure of a bug met while ``doing`` (such as "calling the handler")."""
    return Failure(True, f"unexpected {type(error).__name__} while {doing}: "
                         f"{shorten(str(error), MAX_ERROR_MESSAGE_CHARS)}")



def _handler_error(value: Any, mask: Mask) -> HandlerError | None:
    if isinstance(value, str):
        return HandlerError(shorten(mask(value), MAX_ERROR_MESSAGE_CHARS))
    if not isinstance(value, dict):
        return None
    message = value.get("message")
    if message is None:
        message = ""
    elif not isinstance(message, str):
        message = dump_value(message) or json_type(message)
    return HandlerError(shorten(mask(message), MAX_ERROR_MESSAGE_CHARS),
                        value.get("no_retry") is True)




def _excerpt(body: bytes, mask: Mask) -> str:
    # Mask a generous prefix before cutting it short: a secret straddling the
    # cut would otherwise survive in part.
    text = mask(body[:EXCERPT_SCAN_BYTES].decode("utf-8", "replace"))
    return shorten(" ".join(text.split()), ERROR_EXCERPT_CHARS)


