"""The ``pipeline`` label and the places gauge: which pipelines are labels (of the item,
gate, close and reduce metrics, and of the places gauge), and the open partitions at
places no live processor serves, by pipeline.

Part of :class:`processor.observe.metrics.PrometheusHooks`, which owns the registry.
Pipelines are few, but their names come from clients: the first
:data:`MAX_PIPELINE_LABELS` pipelines a process labels are labels of their own, and any
after them share :data:`OTHER` (the cardinality rule in ``docs/reference/metrics.md``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from watcher.reports import PlaceCount

MAX_PIPELINE_LABELS = 20
# The label every pipeline past the first MAX_PIPELINE_LABELS shares.
OTHER = "other"

Places = tuple[list[PlaceCount], list[PlaceCount]]
"""The open partitions' places, and those of them no live processor serves."""


class PipelineLabels:
    """The ``pipeline`` label of each pipeline: its name, for the first ``limit``
    pipelines this process labels, else :data:`OTHER`. Decided once per pipeline."""

    def __init__(self, limit: int = MAX_PIPELINE_LABELS) -> None:
        self.limit = limit
        self._labels: dict[str, str] = {}
        self._named = 0

    def __call__(self, pipeline: str) -> str:
        label = self._labels.get(pipeline)
        if label is None:
            if self._named < self.limit:
                self._named += 1
                label = pipeline
            else:
                label = OTHER
            self._labels[pipeline] = label
        return label


class UnservedGauge:
    """``statefeed_partitions_unserved{pipeline}``: one series per pipeline with open
    partitions, counting those at a place no live processor serves (0 when all are
    served); a pipeline with no open partition left loses its series. Registered at the
    first read of the places (until then the values are unknown)."""

    def __init__(self, registry: CollectorRegistry, labels: PipelineLabels) -> None:
        self.registry = registry
        self.labels = labels
        self.gauge = Gauge("statefeed_partitions_unserved",
                           "Open partitions at a place (pipeline, version, gate) no live "
                           "processor serves, by pipeline; 0 when a pipeline's open "
                           "partitions are all served (read every few seconds)",
                           ["pipeline"], registry=None)
        self._shown: set[str] | None = None  # the labels with a series; None: unregistered

    def set(self, open_places: list[PlaceCount], unserved: list[PlaceCount]) -> None:
        """Set the series from a read of the open partitions' places (``open_places``)
        and of those no live processor serves (``unserved``)."""
        counts = dict.fromkeys((self.labels(place.pipeline) for place in open_places), 0)
        for place in unserved:
            label = self.labels(place.pipeline)
            counts[label] = counts.get(label, 0) + place.partitions
        if self._shown is None:
            self._shown = set()
            self.registry.register(self.gauge)
        for gone in self._shown - counts.keys():
            self.gauge.remove(gone)
        for label, count in counts.items():
            self.gauge.labels(label).set(count)
        self._shown = set(counts)
