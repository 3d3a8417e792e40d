"""Where a result write (:meth:`watcher.store.sql.shared.Statements.result_write`) reads
its values: bound parameters, or the columns of a batch's rows (a driver's JSON rows),
one row per write."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Float, Integer, Text, Unicode, bindparam
from sqlalchemy.sql.expression import ColumnElement
from sqlalchemy.types import TypeEngine


@dataclass(frozen=True)
class ResultSource:
    """Where a result write (:meth:`Statements.result_write`) reads each value: bound
    parameters, or the columns of a batch's rows, one row per write.

    A NULL ``gate`` or ``data`` keeps the item's; ``data`` or ``delay`` left out
    (``None``) means the write never sets the data, or makes the item ready now.
    """

    partition_id: ColumnElement[Any]
    item_id: ColumnElement[Any]
    seen: ColumnElement[Any]
    status: ColumnElement[Any]
    gate: ColumnElement[Any]
    attempts: ColumnElement[Any]
    error: ColumnElement[Any]
    data: ColumnElement[Any] | None = None
    delay: ColumnElement[Any] | None = None
    owner: ColumnElement[Any] = field(default_factory=lambda: bindparam("owner"))
    # The new error history (NULL keeps the stored one), its newest entry's time to be
    # stamped (see Statements.history_stamped); None: the write never sets it.
    history: ColumnElement[Any] | None = None
    # Where a parking write's wait comes from (a NULL key: the write does not park, and
    # the item keeps its last wait); None: the write never parks.
    wait: WaitSource | None = None

    @classmethod
    def parameters(cls, data_type: TypeEngine[bytes], *, new_data: bool = True,
                   delayed: bool = True, parking: bool = False) -> ResultSource:
        """Bound parameters named as :meth:`Statements.item_write_params` names them;
        the data travels as ``data_type`` (the data column's: MariaDB's sends base64).
        With ``parking``, the wait's too (``w_key``, ``w_timeout``, ``w_policy``,
        ``w_traceparent``)."""
        return cls(
            partition_id=bindparam("pid"), item_id=bindparam("iid"), seen=bindparam("seen"),
            status=bindparam("new_status"), gate=bindparam("new_gate", type_=Integer()),
            attempts=bindparam("new_attempts"), error=bindparam("new_error"),
            data=bindparam("new_data", type_=data_type) if new_data else None,
            delay=bindparam("delay", type_=Float()) if delayed else None,
            history=bindparam("new_history", type_=Text()),
            wait=WaitSource(bindparam("w_key", type_=Unicode()),
                            bindparam("w_timeout", type_=Float()),
                            bindparam("w_policy", type_=Unicode()),
                            bindparam("w_traceparent", type_=Unicode())) if parking else None)


@dataclass(frozen=True)
class WaitSource:
    """Where a parking write reads its wait (:attr:`ResultSource.wait`): the token's
    key, the timeout, the timeout policy and the traceparent."""

    key: ColumnElement[Any]
    timeout: ColumnElement[Any]
    policy: ColumnElement[Any]
    traceparent: ColumnElement[Any]
