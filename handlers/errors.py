"""Exceptions a handler function raises to say what happens to its item.

The tree is rooted in :class:`HandlerError`. Each class carries the HTTP status
the SDK answers with, so the processor classifies the attempt correctly:

- :class:`Retry` -> 503, retryable; ``retry_after`` becomes a ``Retry-After`` header.
- :class:`Fail` -> 422 with ``no_retry: true``: the item fails at once.
- :class:`ItemDataError` (a :class:`Fail` and a ``ValueError``) -> 400 with
  ``no_retry: true``: the item's bytes are not what the handler can read.

Any other exception escaping a handler function is a bug in the handler: the SDK
answers 500 (retryable, so a fixed and redeployed handler can still process the
item) and logs the traceback once.
"""

from __future__ import annotations

import math


class HandlerError(Exception):
    """Base of the exceptions that tell the SDK how an attempt ended.

    ``status`` is the HTTP status of the answer; ``no_retry`` says whether the
    processor must fail the item instead of retrying it.
    """

    status: int = 500
    no_retry: bool = False
    default_message: str = "the handler reported an error"

    def __init__(self, message: str | None = None) -> None:
        text = self.default_message if message is None else str(message)
        super().__init__(text)
        self.message = text


class Retry(HandlerError):
    """The item cannot be processed now but may be later: answered as 503.

    ``retry_after`` (seconds), when given, is the least delay before the next
    attempt; it is sent as a ``Retry-After`` header rounded up to whole seconds
    (the header's unit), and exactly as ``retry_after`` in the error object.

    Raises:
        ValueError: ``retry_after`` is negative, infinite or not a number.
    """

    status = 503
    no_retry = False
    default_message = "the handler asked to retry the item later"

    def __init__(self, message: str | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        if retry_after is not None:
            if (isinstance(retry_after, bool) or not isinstance(retry_after, int | float)
                    or not math.isfinite(retry_after) or retry_after < 0):
                raise ValueError(
                    f"Retry(retry_after=...) must be a number of seconds >= 0, got {retry_after!r}")
            retry_after = float(retry_after)
        self.retry_after = retry_after


class Fail(HandlerError):
    """The item can never succeed at this step: answered as 422 with ``no_retry``.

    The processor marks the item failed without retrying it.
    """

    status = 422
    no_retry = True
    default_message = "the handler refused the item"


class ItemDataError(Fail, ValueError):
    """The item's bytes cannot be decoded as asked (``Item.json()``, ``Item.text()``).

    Answered as 400 with ``no_retry``: the same bytes will fail the same way on
    every attempt. Also a ``ValueError``, so ``except ValueError`` catches it.
    """

    status = 400
    default_message = "the item's data cannot be decoded"
