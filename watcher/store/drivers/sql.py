"""SQL elements that each database writes its own way: the clock, its arithmetic, row locking.

``db_now()`` reads the *database* clock as a naive UTC timestamp, so lease
expiry never depends on a container's clock. ``clock_now(clock)`` is the time
every store statement uses: ``COALESCE(:clock_now, <database now>)``, whose
parameter the store's clock fills in at each execution (``NULL`` for the
database clock, a fixed time in tests), so one statement serves both.
``time_plus(base, seconds)`` adds seconds (fractions allowed) to a time.
``lock_unless_busy(query, table)`` makes a SELECT lock the rows it reads and
pass by rows another session holds. ``batch_rows(param)`` and
``json_texts(param)`` read one JSON text parameter as a table: a batch of item
writes (:func:`batch_rows_json`), and a list of ids.

This module holds the elements and their portable renderings; each database's
module in this package (:mod:`.sqlite`, :mod:`.postgresql`, :mod:`.mysql`,
:mod:`.mssql`) registers its own rendering. Importing :mod:`watcher.store.drivers`
registers them all.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    DateTime,
    Float,
    Integer,
    Select,
    TableValuedAlias,
    Text,
    Unicode,
    bindparam,
    column,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import ColumnElement, FromClause, FunctionElement

from watcher.models import timestamp_type
from watcher.waits import REPLACED_VERSION

if TYPE_CHECKING:
    from watcher.records import ItemWrite
    from watcher.store.db.clock import Clock

# The name of the parameter that carries a clock's reading.
CLOCK_PARAMETER = "clock_now"


class db_now(FunctionElement[Any]):
    """The database's current UTC time."""

    type = DateTime()
    inherit_cache = True
    name = "db_now"


class time_plus(FunctionElement[Any]):
    """A time plus a number of seconds (fractions allowed; an SQL expression or a number)."""

    type = DateTime()
    inherit_cache = True
    name = "time_plus"

    def __init__(self, base: ColumnElement[Any], seconds: float | ColumnElement[Any]) -> None:
        if not isinstance(seconds, ColumnElement):
            seconds = bindparam(None, float(seconds), type_=Float())
        super().__init__(base, seconds)


class data_size(FunctionElement[Any]):
    """The size in bytes of a binary value, read without reading the value itself
    (PostgreSQL takes it from the stored header, without detoasting)."""

    type = Integer()
    inherit_cache = True
    name = "data_size"


class not_for_index(FunctionElement[Any]):
    """A column a query filters on whose index the planner must not pick, because the
    query's ``ORDER BY`` has an index of its own that lets it stop at its ``LIMIT``.
    SQLite, whose planner goes by the shape of a query unless ``ANALYZE`` has run,
    writes it ``+column`` (its own way to take a term out of the index choice);
    the other databases weigh both indexes by their statistics and get the column."""

    inherit_cache = True
    name = "not_for_index"

    def __init__(self, column: ColumnElement[Any]) -> None:
        super().__init__(column)
        self.type = column.type


class db_now_plus(time_plus):
    """The database's current UTC time plus a number of seconds (fractions allowed)."""

    inherit_cache = True
    name = "db_now_plus"

    def __init__(self, seconds: float | ColumnElement[Any]) -> None:
        super().__init__(db_now(), seconds)


class clock_now(FunctionElement[Any]):
    """The current time by ``clock``: its reading, sent as a parameter, else the database's.

    The reading is taken each time a statement holding this element runs, so
    a statement built once follows a clock that a test moves.
    """

    type = DateTime()
    inherit_cache = True
    name = "clock_now"

    def __init__(self, clock: Clock) -> None:
        super().__init__(bindparam(CLOCK_PARAMETER, type_=timestamp_type(),
                                   callable_=clock.reading))


def time_plus_parts(element: time_plus, compiler: Any, **kw: Any) -> tuple[str, str]:
    """The compiled base time and seconds of a :class:`time_plus`, for a database's rendering."""
    base, seconds = element.clauses.clauses
    return compiler.process(base, **kw), compiler.process(seconds, **kw)


def clock_parameter(element: clock_now, compiler: Any, **kw: Any) -> str:
    """The compiled parameter of a :class:`clock_now`, for a database's rendering."""
    (parameter,) = element.clauses.clauses
    return compiler.process(parameter, **kw)


@compiles(db_now)
def _now_portable(element: db_now, compiler: Any, **kw: Any) -> str:
    return "CURRENT_TIMESTAMP"


@compiles(clock_now)
def _clock_portable(element: clock_now, compiler: Any, **kw: Any) -> str:
    # The parameter's type comes from the database's own time on the right.
    parameter = clock_parameter(element, compiler, **kw)
    return f"COALESCE({parameter}, {compiler.process(db_now(), **kw)})"


@compiles(not_for_index)
def _column_portable(element: not_for_index, compiler: Any, **kw: Any) -> str:
    return str(compiler.process(element.clauses, **kw))


@compiles(data_size)
def _size_portable(element: data_size, compiler: Any, **kw: Any) -> str:
    return f"OCTET_LENGTH({compiler.process(element.clauses, **kw)})"


@compiles(time_plus)
def _plus_portable(element: time_plus, compiler: Any, **kw: Any) -> str:
    raise NotImplementedError(
        f"statefeed has no clock arithmetic for the {compiler.dialect.name!r} database"
    )


def lock_unless_busy(query: Select[Any], table: FromClause) -> Select[Any]:
    """``query`` locking the rows of ``table`` it reads, skipping rows locked elsewhere.

    PostgreSQL and MySQL/MariaDB render ``FOR UPDATE SKIP LOCKED``, SQL Server
    the ``UPDLOCK, ROWLOCK, READPAST`` hints. SQLite locks the whole database
    per write transaction, so the clause does not apply there.
    """
    return (query.with_for_update(skip_locked=True)
            .with_hint(table, "WITH (UPDLOCK, ROWLOCK, READPAST)", "mssql"))


# -- JSON parameters read as tables -------------------------------------------

# The columns of a batch row, in the order batch_rows_json writes them.
BATCH_COLUMNS = (("pid", Unicode()), ("iid", Unicode()), ("seen", Integer()),
                 ("status", Unicode()), ("gate", Integer()), ("attempts", Integer()),
                 ("error", Text()), ("data", Text()), ("delay", Float()), ("history", Text()))


# A parking batch's rows (park_rows_json) add the wait's columns to each.
PARK_COLUMNS = (*BATCH_COLUMNS, ("wkey", Unicode()), ("wtimeout", Float()),
                ("wpolicy", Unicode()), ("wtrace", Unicode()))
_NO_WAIT = (None, None, None, None)


def batch_rows_json(writes: Iterable[ItemWrite],
                    encode_data: Callable[[bytes], str] = bytes.hex) -> str:
    """Item writes as the JSON rows of a batch write: ``[pid, iid, seen, status, gate,
    attempts, error, data as hex (or as ``encode_data`` makes it), retry delay, error
    history]`` each (:data:`BATCH_COLUMNS`).

    Every text in a write is storable (:func:`~watcher.rules.decisions.storable_text`),
    so it is valid JSON text too. ``json.dumps`` encodes the whole batch in C,
    where the same values as separate parameters would be encoded one by one.
    """
    return json.dumps([
        [w.partition_id, w.item_id, w.seen_version, w.status, w.gate, w.attempts,
         w.last_error, None if w.data is None else encode_data(w.data), w.retry_delay or 0.0,
         w.error_history]
        for w in writes], ensure_ascii=False, separators=(",", ":"))


def park_rows_json(writes: Iterable[ItemWrite],
                   encode_data: Callable[[bytes], str] = bytes.hex) -> str:
    """Item writes of a batch where some park, as the JSON rows of
    :func:`batch_rows_json` followed by the wait's ``[key, timeout, policy,
    traceparent]`` (NULLs for a write that does not park: :data:`PARK_COLUMNS`)."""
    return json.dumps([
        [w.partition_id, w.item_id, w.seen_version, w.status, w.gate, w.attempts,
         w.last_error, None if w.data is None else encode_data(w.data), w.retry_delay or 0.0,
         w.error_history,
         *(_NO_WAIT if w.wait is None else (w.wait.token_hash, w.wait.timeout,
                                            w.wait.on_timeout, w.wait.traceparent))]
        for w in writes], ensure_ascii=False, separators=(",", ":"))


def parks(writes: Iterable[ItemWrite]) -> bool:
    """Whether some write of ``writes`` parks its item."""
    return any(w.wait is not None for w in writes)


def batch_params(writes: Sequence[ItemWrite], owner: str,
                 encode_data: Callable[[bytes], str] = bytes.hex) -> dict[str, Any]:
    """The parameters of a one-statement batch write (a driver's ``batch_statement``,
    or its ``park_statement`` when some write parks) of ``writes`` by ``owner`` (data
    as :func:`batch_rows_json` encodes it)."""
    encode = park_rows_json if parks(writes) else batch_rows_json
    return {"owner": owner, "rows": encode(writes, encode_data)}


class batch_rows(FunctionElement[Any]):
    """The rows of a :func:`batch_rows_json` parameter, as a table of
    :data:`BATCH_COLUMNS`; use :func:`batch_table`. Each database renders its own
    JSON table function (MariaDB/MySQL ``JSON_TABLE``, SQL Server ``OPENJSON``)."""

    inherit_cache = True
    name = "batch_rows"


def batch_table(name: str) -> TableValuedAlias:
    """The batch parameter ``name`` as the table ``v`` with the :data:`BATCH_COLUMNS`."""
    rows = batch_rows(bindparam(name, type_=Text()))
    return rows.table_valued(*(column(key, type_) for key, type_ in BATCH_COLUMNS), name="v")


class park_rows(FunctionElement[Any]):
    """The rows of a :func:`park_rows_json` parameter, as a table of
    :data:`PARK_COLUMNS`; use :func:`park_table`. Rendered as :class:`batch_rows` is,
    with the wait's columns."""

    inherit_cache = True
    name = "park_rows"


def park_table(name: str) -> TableValuedAlias:
    """The parking batch parameter ``name`` as the table ``v`` with the
    :data:`PARK_COLUMNS`."""
    rows = park_rows(bindparam(name, type_=Text()))
    return rows.table_valued(*(column(key, type_) for key, type_ in PARK_COLUMNS), name="v")


# The columns of a row of waits, in the order wait_rows_json writes them, and the
# places of the wait's own values.
WAIT_COLUMNS = (("n", Integer()), ("pid", Unicode()), ("iid", Unicode()),
                ("version", Integer()), ("token", Unicode()), ("timeout", Float()),
                ("on_timeout", Unicode()), ("traceparent", Unicode()))
WAIT_TOKEN, WAIT_TIMEOUT, WAIT_POLICY, WAIT_TRACEPARENT = 4, 5, 6, 7


def replaced_rows(writes: Sequence[ItemWrite]) -> list[tuple[int, ItemWrite]]:
    """The parking writes of a batch that replace their item's last wait, each with its
    place in the batch from 1 (the place a batch write's ``RETURNING`` gives)."""
    return [(n, w) for n, w in enumerate(writes, 1)
            if w.wait is not None and w.wait.replaces is not None]


def wait_rows_json(writes: Sequence[ItemWrite]) -> str:
    """The ``waits`` rows of the keys the parking writes of a batch replace, as JSON
    rows: ``[n, pid, iid, version 0, replaced key, timeout 0, policy '', null]`` each
    (:data:`WAIT_COLUMNS`), ``n`` the write's place in the batch from 1."""
    return json.dumps([
        [n, w.partition_id, w.item_id, REPLACED_VERSION, w.wait.replaces, 0.0, "", None]
        for n, w in replaced_rows(writes) if w.wait is not None],
        ensure_ascii=False, separators=(",", ":"))


class wait_rows(FunctionElement[Any]):
    """The rows of a :func:`wait_rows_json` parameter, as a table of
    :data:`WAIT_COLUMNS`; use :func:`wait_table`. MariaDB/MySQL render ``JSON_TABLE``."""

    inherit_cache = True
    name = "wait_rows"


def wait_table(name: str) -> TableValuedAlias:
    """The waits parameter ``name`` as the table ``w`` with the :data:`WAIT_COLUMNS`."""
    rows = wait_rows(bindparam(name, type_=Text()))
    return rows.table_valued(*(column(key, type_) for key, type_ in WAIT_COLUMNS), name="w")


class json_texts(FunctionElement[Any]):
    """The texts of a JSON array parameter, as a table of one column ``value``; use
    :func:`json_text_table`. SQLite reads it with ``json_each``, MariaDB/MySQL with
    ``JSON_TABLE``, SQL Server with ``OPENJSON``."""

    inherit_cache = True
    name = "json_texts"


def json_text_table(name: str) -> TableValuedAlias:
    """The JSON array parameter ``name`` as the table ``j`` of one column ``value``."""
    texts = json_texts(bindparam(name, type_=Text()))
    return texts.table_valued(column("value", Unicode()), name="j")


def json_param(values: Iterable[str]) -> str:
    """``values`` as the JSON array a :func:`json_text_table` parameter takes."""
    return json.dumps(list(values), ensure_ascii=False, separators=(",", ":"))


@compiles(batch_rows)
@compiles(wait_rows)
@compiles(json_texts)
def _json_table_portable(element: FunctionElement[Any], compiler: Any, **kw: Any) -> str:
    raise NotImplementedError(
        f"statefeed reads no JSON parameter as a table on the {compiler.dialect.name!r} "
        "database")
