"""SQLAlchemy statements compiled once, for drivers that send them past the engine.

The hottest statements (the ready read, the gate summary, the batch result
write) stay SQLAlchemy constructs, built by the store and the drivers; a
driver's direct path (:mod:`.postgresql.direct`, :mod:`.sqlite.direct`,
:mod:`.mysql.direct`) compiles each of them once here for its dialect and then
sends the text with the values the engine would have sent: the values
SQLAlchemy bound itself, the store's clock read as the statement runs, and
each value through the column type's bind processor (SQLite keeps times as
text). Rows come back through the result processors the engine would apply.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, cast

from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

Processor = Callable[[Any], Any]


class CompiledStatement(NamedTuple):
    """A statement as sent: its text and how to fill in and read back its values."""

    sql: str
    defaults: dict[str, Any]  # the values SQLAlchemy bound itself (``version + 1``'s 1)
    live: dict[str, Callable[[], Any]]  # values read as the statement runs (the clock)
    binds: Mapping[str, Processor]  # per parameter, how the engine converts its value
    results: tuple[Processor | None, ...]  # per result column, how the engine reads it
    # The parameters' names in the order a positional (qmark) text takes them; empty
    # for a named paramstyle.
    positions: tuple[str, ...] = ()

    def values(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The parameters to send for ``params``: defaults, live values, converted."""
        values = {**self.defaults, **params}
        for name, read in self.live.items():
            if name not in values:
                values[name] = read()
        for name, convert in self.binds.items():
            if name in values:
                values[name] = convert(values[name])
        return values

    def rows(self, rows: Iterable[Sequence[Any]]) -> list[tuple[Any, ...]]:
        """``rows`` as the engine would return them (times parsed where the driver
        returns text, say)."""
        if not any(self.results):
            return [tuple(row) for row in rows]
        results = self.results
        return [tuple(value if convert is None or value is None else convert(value)
                      for value, convert in zip(row, results, strict=False))
                for row in rows]


def compile_statement(statement: ClauseElement, dialect: Dialect) -> CompiledStatement:
    """Compile ``statement`` for ``dialect``: with a named paramstyle the values travel
    as a mapping (:meth:`CompiledStatement.values`); with a positional one, as tuples
    in the order of :attr:`CompiledStatement.positions`."""
    compiled = cast(SQLCompiler, statement.compile(dialect=dialect))
    live = {name: bind.callable for name, bind in compiled.binds.items()
            if bind.callable is not None}
    defaults = {name: value for name, value in compiled.params.items()
                if value is not None and name not in live}
    binds = {name: convert for name, convert in compiled._bind_processors.items()
             if callable(convert)}
    results = tuple(entry.type._cached_result_processor(dialect, None)
                    for entry in compiled._result_columns)
    positions = tuple(compiled.positiontup or ())
    return CompiledStatement(str(compiled), defaults, live, binds, results, positions)


class StatementCache:
    """Statements compiled once per dialect, looked up by the statement object."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self._compiled: dict[ClauseElement, CompiledStatement] = {}

    def __getitem__(self, statement: ClauseElement) -> CompiledStatement:
        found = self._compiled.get(statement)
        if found is None:
            found = self._compiled[statement] = compile_statement(statement, self.dialect)
        return found
