"""The outbox write every partition end makes: one ``INSERT ... SELECT`` that copies the
ended partition's URL, status and gate into a ``notifications`` row when the partition
names a URL, or else the processor's default URL when the ending write was given one
(``processor run --notify-url``), and writes nothing when there is neither.

It runs in the transaction that ends the partition, after the guarded write that ended
it: the row exists if and only if that write committed, so no end is lost and none is
made up (a close that lost its race matched no row and inserts nothing).
"""

from __future__ import annotations

import uuid

from sqlalchemy import Integer, Unicode, bindparam, func, insert, literal, select
from sqlalchemy.sql.expression import Insert

from watcher.outbox import DeliveryState
from watcher.store.sql.shared import Statements


def outbox_insert(statements: Statements) -> Insert:
    """The statement (the store builds it once): parameters ``pid`` (the partition),
    ``event_id`` (:func:`new_event_id`) and ``default`` (the URL for a partition that
    names none, or ``None``)."""
    p, n = statements.tables.partitions, statements.tables.notifications
    now = statements.now
    target = func.coalesce(p.c.notify, bindparam("default", type_=p.c.notify.type))
    source = select(
        bindparam("event_id", type_=Unicode()), p.c.id, target, p.c.status, p.c.gate,
        literal(DeliveryState.PENDING.value, Unicode()), literal(1, Integer()),
        literal(0, Integer()), literal("", Unicode()), now, now, now,
    ).where(p.c.id == bindparam("pid", type_=p.c.id.type), target.is_not(None))
    return insert(n).from_select(
        ["event_id", "partition_id", "target", "status", "gate", "state", "version",
         "attempts", "owner", "next_at", "created_at", "updated_at"], source)


def new_event_id() -> str:
    """A new event's id: a random UUID, the receiver's deduplication key."""
    return f"evt_{uuid.uuid4().hex}"

