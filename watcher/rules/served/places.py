"""Which places the live processors serve, and the open partitions' places none does.

A processor's row in the ``processors`` table says what it serves (:func:`serves_text`):
the tables of routes of its :class:`~watcher.pipelines.ServedPipelines`, or NULL for
every place. :func:`unserved` sets the open partitions' places (read per place, with
counts) against the live processors' rows: a place none of them serves waits until one
does, and ``processor status``, the console and the ``statefeed_partitions_unserved``
gauge show it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from watcher.pipelines import ServedRoute
from watcher.reports import PlaceCount

Serves = tuple[ServedRoute, ...] | None
"""What one processor serves: its tables of routes, or ``None`` for every place."""


def serves_text(serves: Serves) -> str | None:
    """``serves`` as its row stores it: JSON, one object per table (``pipeline``,
    ``version``, ``null_version``, ``gates``: sorted, or ``null`` for every gate);
    ``None`` (every place) stays ``None``."""
    if serves is None:
        return None
    return json.dumps([{"pipeline": route.pipeline, "version": route.version,
                        "null_version": route.null_version,
                        "gates": None if route.gates is None else sorted(route.gates)}
                       for route in serves], separators=(",", ":"), sort_keys=True)


def serves_of(text: str | None) -> Serves:
    """What a row's ``serves`` says (the inverse of :func:`serves_text`). A table this
    version cannot read (a newer processor's, or a damaged row) is left out, so the
    places only it names show as not served rather than hide a partition that waits."""
    if text is None:
        return None
    try:
        tables = json.loads(text)
    except ValueError:
        return ()
    if not isinstance(tables, list):
        return ()
    return tuple(route for table in tables if (route := _route(table)) is not None)


def _route(table: Any) -> ServedRoute | None:
    """One stored table as a :class:`ServedRoute`; ``None`` when it is not one."""
    if not isinstance(table, dict):
        return None
    pipeline, version = table.get("pipeline"), table.get("version")
    null_version, gates = table.get("null_version", True), table.get("gates")
    if not isinstance(pipeline, str) or not (version is None or isinstance(version, str)):
        return None
    if not isinstance(null_version, bool):
        return None
    if gates is not None and not (isinstance(gates, list) and all(
            isinstance(gate, int) and not isinstance(gate, bool) for gate in gates)):
        return None
    return ServedRoute(pipeline, version, null_version,
                       None if gates is None else frozenset(gates))


def served(pipeline: str, version: str | None, gate: int, fleet: Iterable[Serves]) -> bool:
    """Whether some processor of ``fleet`` (what each live one serves) serves the place:
    one that serves everything does, as does one with a table that routes it
    (:meth:`ServedRoute.serves`)."""
    return any(serves is None or any(route.serves(pipeline, version, gate) for route in serves)
               for serves in fleet)


def place_order(place: PlaceCount) -> tuple[str, bool, str, int]:
    """The order places are listed in: by pipeline, version (``None`` first), gate."""
    return place.pipeline, place.version is not None, place.version or "", place.gate


def unserved(places: Iterable[PlaceCount], fleet: Iterable[Serves]) -> list[PlaceCount]:
    """The places of ``places`` (the open partitions' places, with counts) that no
    processor of ``fleet`` serves, by pipeline, version (``None`` first) and gate."""
    everyone = list(fleet)
    return sorted((place for place in places
                   if not served(place.pipeline, place.version, place.gate, everyone)),
                  key=place_order)
