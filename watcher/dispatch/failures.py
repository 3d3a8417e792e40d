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

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ItemFailure:
    """One failed item, as a partition's failure names it."""

    item_id: str
    attempts: int
    error: str


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


def partition_failed_at_reduce(partition_id: str, gate: int, attempts: int,
                               error: str, *, pipeline: str) -> None:
    """Log that a partition of ``pipeline`` failed because its reduce at ``gate`` failed:
    one ERROR."""
    log.error("action=partition_closed partition=%s pipeline=%s status=failed gate=%d "
              "reason=reduce attempts=%d error=%s", partition_id, pipeline, gate, attempts,
              one_line(error))
