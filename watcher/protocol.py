"""What a processor receives and returns: the engine's contract with user code.

A *processor* is any object with ``async def process(item: WorkItem) -> Result``
(or a bare coroutine function of that shape). It may raise
:class:`RetryableError` or :class:`NonRetryableError`; any other exception is
treated as retryable.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One item handed to a processor.

    ``attempt`` is 1-based: 1 on the first call for this step, 2 after one error, ...
    ``version`` is the item row version the engine read; a result is written only
    against that version. ``idempotency_key`` is stable for one logical step of
    one item, so a repeated call after a failover carries the same key.
    """

    partition_id: str
    id: str
    gate: int
    attempt: int
    data: bytes
    version: int
    idempotency_key: str


@dataclass(frozen=True, slots=True)
class Result:
    """A processor's answer for one item.

    - ``done``: the item is complete.
    - ``gate``: the item's next gate; ``None`` keeps the current gate.
    - ``data``: the item's new bytes; ``None`` keeps the stored bytes.

    ``Result()`` (not done, same gate) asks for the item to run again: a loop.
    """

    gate: int | None = None
    done: bool = False
    data: bytes | None = None


class ProcessorError(Exception):
    """Base of the errors a processor raises to report a failed attempt."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class RetryableError(ProcessorError):
    """The attempt failed but may succeed later.

    ``retry_after`` (seconds), when set, is the minimum delay before the next attempt.
    """

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class NonRetryableError(ProcessorError):
    """The attempt failed and retrying cannot help: the item fails at once."""


@runtime_checkable
class Processor(Protocol):
    """Anything that can process one item."""

    async def process(self, item: WorkItem) -> Result: ...


ProcessFunction = Callable[[WorkItem], Awaitable[Result]]
