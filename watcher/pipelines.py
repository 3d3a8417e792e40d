"""What a processor serves of the pipelines: the partitions it may lease.

A processor that routes by pipeline (``processor run --routes``,
docs/how-to/pipelines.md) serves a set of (pipeline, version, gate) places: the
places its routes give a handler URL. It passes them to its watcher as a
:class:`ServedPipelines` (:attr:`watcher.config.WatcherConfig.pipelines`); ``None``
there serves everything, as a library watcher does (``--handler-url`` alone serves the
``default`` pipeline: every version and gate of it).

- The lease reads (:meth:`watcher.store.Store.leases_read_free`, ``leases_of_owner``)
  return only the partitions at a served place, so a processor never leases one it
  cannot call a handler for.
- A partition with no version pinned takes its pipeline's ``current`` version at its
  first lease (:meth:`watcher.store.Store.partitions_pin_version`), and keeps it until
  it closes or an operator moves it.
- A held partition whose gate moves to a place not served is handed over
  (:class:`watcher.leasing.keeper.LeaseKeeper`).

Pure values, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from watcher.records import PartitionSettings

ServiceOfPlace = Callable[[str, "str | None", int], "str | None"]
"""A routing processor's ``service_of(pipeline, version, gate)``: the service (its URL
without secrets) the calls at that place go to, ``None`` when it has no route there."""


def service_now(service_of: ServiceOfPlace | None, settings: PartitionSettings,
                gate: Callable[[], int]) -> Callable[[], str | None] | None:
    """The service a partition with ``settings`` calls at its current ``gate()``;
    ``None`` for a processor that does not route (``service_of`` ``None``)."""
    if service_of is None:
        return None
    pipeline, version = settings.pipeline, settings.pipeline_version
    return lambda: service_of(pipeline, version, gate())


@dataclass(frozen=True, slots=True)
class ServedRoute:
    """One table of routes a processor has: a pipeline's gates for one version.

    ``version`` ``None`` is the pipeline's table for every version (the fallback of
    its versioned tables); ``null_version`` also serves partitions no version is
    pinned on yet (they take the pipeline's current version at their first lease);
    ``gates`` ``None`` serves every gate (a ``*`` route)."""

    pipeline: str
    version: str | None = None
    null_version: bool = True
    gates: frozenset[int] | None = None

    def serves(self, pipeline: str, version: str | None, gate: int) -> bool:
        """Whether this table routes ``gate`` of a partition of ``pipeline`` at ``version``."""
        if pipeline != self.pipeline:
            return False
        if self.version is not None and version != self.version and not (
                version is None and self.null_version):
            return False
        return self.gates is None or gate in self.gates


@dataclass(frozen=True)
class ServedPipelines:
    """The places a processor serves (:class:`ServedRoute` tables, any of which may serve
    a place) and the version each pipeline pins on a partition that names none."""

    routes: tuple[ServedRoute, ...]
    current: Mapping[str, str] = field(default_factory=dict)
    _known: dict[tuple[str, str | None, int], bool] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "current", MappingProxyType(dict(self.current)))

    def serves(self, pipeline: str, version: str | None, gate: int) -> bool:
        """Whether some table serves this place; decided once per place."""
        place = (pipeline, version, gate)
        known = self._known.get(place)
        if known is None:
            known = self._known[place] = any(route.serves(pipeline, version, gate)
                                             for route in self.routes)
        return known

    def pin(self, pipeline: str, version: str | None) -> str | None:
        """The version a partition of ``pipeline`` at ``version`` is to be pinned to at
        its lease: its pipeline's current version when it has none pinned, else
        ``None`` (nothing to pin)."""
        return self.current.get(pipeline) if version is None else None
