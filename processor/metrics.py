"""Prometheus metrics: an implementation of the engine's hooks.

Each :class:`PrometheusHooks` owns its registry, so several watchers in one
process (tests, the demo) never collide on metric names.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from watcher.hooks import Hooks

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
                   60)


class PrometheusHooks(Hooks):
    """Counts items by outcome, handler latency, in-flight calls, leases, gates, reduces
    and closes."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.items = Counter("statefeed_items_total", "Item attempts by outcome",
                             ["outcome"], registry=r)
        self.latency = Histogram("statefeed_handler_seconds",
                                 "Time from dispatch to result, per item attempt",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.in_flight_calls = Gauge("statefeed_in_flight", "Processor calls in flight",
                                     registry=r)
        self.leases = Gauge("statefeed_leases_held", "Partitions leased by this processor",
                            registry=r)
        self.lease_events = Counter("statefeed_lease_events_total",
                                    "Lease acquisitions, steals, releases and losses",
                                    ["event"], registry=r)
        self.conflicts = Counter("statefeed_lease_conflicts_total",
                                 "Guarded writes that lost a race", registry=r)
        self.stale = Counter("statefeed_stale_results_total",
                             "Results not written because the item or lease moved on",
                             registry=r)
        self.gates = Counter("statefeed_gate_advances_total", "Gate advances", registry=r)
        self.closed = Counter("statefeed_partitions_closed_total", "Partitions closed",
                              ["status"], registry=r)
        self.reduces = Counter("statefeed_reduce_calls_total",
                               "Reduce calls by pass (all, fold, apply) and outcome (applied, "
                               "retry, failed, stale)", ["pass_", "outcome"], registry=r)
        self.reduce_latency = Histogram("statefeed_reduce_seconds",
                                        "Time from reduce call to its write, per call",
                                        ["pass_"], buckets=LATENCY_BUCKETS, registry=r)
        self._outcomes: dict[str, Counter] = {}

    def render(self) -> bytes:
        """The metrics in Prometheus text format."""
        return generate_latest(self.registry)

    def lease_acquired(self, partition_id: str, *, stolen_from: str | None) -> None:
        self.lease_events.labels("stolen" if stolen_from else "acquired").inc()

    def lease_released(self, partition_id: str) -> None:
        self.lease_events.labels("released").inc()

    def lease_lost(self, partition_id: str) -> None:
        self.lease_events.labels("lost").inc()

    def lease_conflict(self, partition_id: str) -> None:
        self.conflicts.inc()

    def item_outcome(self, partition_id: str, item_id: str, gate: int, outcome: str,
                     seconds: float) -> None:
        counter = self._outcomes.get(outcome)
        if counter is None:  # labels() takes a lock and builds a key: once per outcome
            counter = self._outcomes[outcome] = self.items.labels(outcome)
        counter.inc()
        self.latency.observe(seconds)

    def stale_result(self, partition_id: str, item_id: str) -> None:
        self.stale.inc()

    def gate_advanced(self, partition_id: str, from_gate: int, to_gate: int) -> None:
        self.gates.inc()

    def partition_closed(self, partition_id: str, status: str) -> None:
        self.closed.labels(status).inc()

    def reduce_outcome(self, partition_id: str, gate: int, pass_: str, outcome: str,
                       seconds: float) -> None:
        self.reduces.labels(pass_, outcome).inc()
        self.reduce_latency.labels(pass_).observe(seconds)

    def leases_held(self, count: int) -> None:
        self.leases.set(count)

    def in_flight(self, count: int) -> None:
        self.in_flight_calls.set(count)
