"""The log lines of final failures, one home for each.

- An item that failed for good (its retries spent, or an error that is not
  retried) is one WARNING: ``action=item_failed partition=... item=... gate=...
  attempts=... error=...``.
- A partition that failed is one ERROR: ``action=partition_closed
  partition=... status=failed gate=... reason=item|reduce ...`` with the error
  that failed it (an item's last error, or the reduce's).

The error texts are the stored ones (:func:`watcher.rules.decisions.describe_error`
of what the processor raised): the HTTP processor has already masked the
handler's secrets in them. A text is logged on one line, ``error=`` last, so that
everything after ``error=`` is the error.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy.exc import SQLAlchemyError

from watcher.errors import StatefeedError
from watcher.models import Status

if TYPE_CHECKING:
    from watcher.store import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ItemFailure:
    """One failed item, as a partition's failure names it."""

    item_id: str
    attempts: int
    error: str


@dataclass(frozen=True)
class GateFailure:
    """Why a partition fails at ``gate``: its quorum there cannot be met (``short``:
    ``(k, complete)``; ``failed_read`` items failed), or ``failed`` items failed
    (``example``, one of them, when it could be read)."""

    partition_id: str
    pipeline: str
    gate: int
    failed: int
    example: ItemFailure | None
    short: tuple[int, int] | None = None
    failed_read: int = 0

    @property
    def error(self) -> str:
        """The partition's ``last_error``."""
        if self.short is not None:
            return quorum_error(self.gate, *self.short, self.failed_read)
        return partition_error(self.gate, self.failed, self.example)

    def log(self) -> None:
        """Log the failure once it is written: one ERROR."""
        if self.short is not None:
            partition_failed_at_quorum(self.partition_id, self.gate, self.error,
                                       pipeline=self.pipeline)
        else:
            partition_failed_at_items(self.partition_id, self.gate, self.failed,
                                      self.example, pipeline=self.pipeline)


def partition_error(gate: int, failed_items: int, example: ItemFailure | None) -> str:
    """The ``last_error`` a partition that items failed at ``gate`` stores: the failed
    item, its attempts and its error (``example``; ``None`` when it could not be read),
    and what happens now, so a status read says why without a look at its items."""
    others = failed_items - 1
    also = f" (and {others} more failed item{'s' if others != 1 else ''})" if others > 0 else ""
    if example is None:
        head = f"{failed_items} item{'s' if failed_items != 1 else ''} failed at gate {gate}"
    else:
        head = (f"item {example.item_id!r} failed at gate {gate} after {example.attempts} "
                f"attempt{'s' if example.attempts != 1 else ''}{also}: "
                f"{one_line(example.error)}")
    return f"{head}; the partition failed and runs nothing more until a retry"


def quorum_error(gate: int, k: int, passed: int, failed_items: int) -> str:
    """The ``last_error`` of a partition whose quorum at ``gate`` cannot be met: ``passed``
    of the ``k`` items it needs passed, and nothing open is left to make up the rest
    (``failed_items`` failed; none when the gate holds fewer than ``k`` items)."""
    why = (f"{failed_items} failed" if failed_items
           else "the gate holds fewer items than the quorum needs")
    return (f"quorum unreachable at gate {gate}: {passed} of the {k} items it needs "
            f"passed, and no open item is left to make up the rest ({why}); the partition "
            "failed and runs nothing more until a retry")


def one_line(text: str | None) -> str:
    """``text`` with its line breaks made spaces (a log record is one line); ``-`` for none."""
    if not text:
        return "-"
    return " ".join(part.strip() for part in text.splitlines() if part.strip()) or "-"


def item_failed(partition_id: str, item_id: str, gate: int, attempts: int,
                error: str | None, *, pipeline: str) -> None:
    """Log that an item of a partition of ``pipeline`` failed for good at ``gate``: one
    WARNING."""
    log.warning("action=item_failed partition=%s pipeline=%s item=%s gate=%d attempts=%d "
                "error=%s", partition_id, pipeline, item_id, gate, attempts, one_line(error))


def partition_failed_at_items(partition_id: str, gate: int, failed_items: int,
                              example: ItemFailure | None, *, pipeline: str) -> None:
    """Log that a partition of ``pipeline`` failed because items at ``gate`` failed: one
    ERROR naming one of them (``example``, when it could be read) and its error."""
    if example is None:
        log.error("action=partition_closed partition=%s pipeline=%s status=failed gate=%d "
                  "reason=item failed_items=%d error=%s", partition_id, pipeline, gate,
                  failed_items, "(the failed items could not be read: see `processor items "
                  "<partition> --status failed`)")
        return
    log.error("action=partition_closed partition=%s pipeline=%s status=failed gate=%d "
              "reason=item failed_items=%d item=%s attempts=%d error=%s", partition_id,
              pipeline, gate, failed_items, example.item_id, example.attempts,
              one_line(example.error))


def partition_failed_at_quorum(partition_id: str, gate: int, error: str, *,
                               pipeline: str) -> None:
    """Log that a partition of ``pipeline`` failed because its quorum at ``gate`` cannot
    be met (:func:`quorum_error`): one ERROR."""
    log.error("action=partition_closed partition=%s pipeline=%s status=failed gate=%d "
              "reason=quorum error=%s", partition_id, pipeline, gate, error)


def partition_failed_at_reduce(partition_id: str, gate: int, attempts: int,
                               error: str, *, pipeline: str) -> None:
    """Log that a partition of ``pipeline`` failed because its reduce at ``gate`` failed:
    one ERROR."""
    log.error("action=partition_closed partition=%s pipeline=%s status=failed gate=%d "
              "reason=reduce attempts=%d error=%s", partition_id, pipeline, gate, attempts,
              one_line(error))


async def read_failed_item(store: Store, partition_id: str, pipeline: str,
                           gate: int) -> ItemFailure | None:
    """One of the failed items that failed ``partition_id`` at ``gate``, for its log
    line; ``None`` when it cannot be read (the line says so). Never raises but for
    cancellation: the partition has failed already."""
    try:
        page = await store.items_page(partition_id, status=Status.FAILED.value, gate=gate,
                                      limit=1, with_data=False)
    except (SQLAlchemyError, StatefeedError) as error:
        log.debug("action=failed_item_unread partition=%s pipeline=%s error=%s",
                  partition_id, pipeline, type(error).__name__)
        return None
    return next((ItemFailure(item.id, item.attempts, item.last_error or "")
                 for item in page), None)
