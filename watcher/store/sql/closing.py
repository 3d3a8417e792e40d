"""The close a drained gate tries before it reads its summary: one guarded ``UPDATE``
that completes the partition only when its summary would have closed it.

:func:`watcher.rules.decisions.decide_gate` closes a partition when it is not paused, no item
is available at its gate or any later one, none waits at its gate, and no item
failed at its gate (unless the
partition goes on past failures). The close below says the same in its ``WHERE``, over
the same index entries the summary reads, beside the holder's guard (id, version,
owner, open). When it matches no row, nothing was written, and the holder reads the
summary as before (:mod:`watcher.dispatch.gate_moves`).
"""

from __future__ import annotations

from sqlalchemy import Integer, bindparam, exists, not_, update
from sqlalchemy.sql.expression import Update

from watcher.models import AVAILABLE, COMPLETE, FAILED, WAITING
from watcher.store.sql.shared import Statements


def close_when_done(statements: Statements, *, failures_allowed: bool) -> Update:
    """Complete the partition ``:pid`` held by ``:holder`` at version ``:seen`` and gate
    ``:at_gate`` when nothing is left to do, ending its lease, as a close by
    :meth:`Statements.partition_transition` does (its timeline is written apart, in its
    own row: :mod:`watcher.store.sql.timelines`).

    ``failures_allowed``: items failed at the gate do not stop the close (the
    partition's ``on_item_failure="continue"``).

    The pause check reads the partition's own columns, not the subquery the summary
    uses: MariaDB refuses a subquery on the table an ``UPDATE`` writes.
    """
    p, i = statements.tables.partitions, statements.tables.items
    pid = bindparam("pid", type_=p.c.id.type)
    gate = bindparam("at_gate", type_=Integer())
    guard = [*statements.lease_held(pid, bindparam("holder"),
                                    version=bindparam("seen", type_=Integer()), live=False),
             p.c.paused_at.is_(None), not_(statements.flow_paused(p.c.flow_key)),
             not_(exists().where(i.c.partition_id == pid, i.c.status == AVAILABLE,
                                 i.c.gate >= gate)),
             not_(exists().where(i.c.partition_id == pid, i.c.status == WAITING,
                                 i.c.gate == gate))]
    if not failures_allowed:
        guard.append(not_(exists().where(i.c.partition_id == pid, i.c.status == FAILED,
                                         i.c.gate == gate)))
    return update(p).where(*guard).values(
        version=p.c.version + 1, status=COMPLETE, owner="", until=statements.now,
        updated_at=statements.now)
